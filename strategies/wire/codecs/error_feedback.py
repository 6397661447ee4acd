r"""Error feedback (memory) around any codec.

Stich, Cordonnier, Jaggi 2018, "Sparsified SGD with Memory" [1]_;
Karimireddy, Rebjock, Stich, Jaggi 2019, EF-SGD [2]_:

.. math:: z_t = e_t + \delta_t, \quad p_t = \mathrm{encode}(z_t), \quad
          e_{t+1} = z_t - \mathrm{decode}(p_t).

References
----------
.. [1] Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018.
.. [2] Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD and
   other Gradient Compression Schemes", ICML 2019.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strategies.wire.codecs.errors import CodecError
from strategies.wire.codecs.payload import decode, encode
from strategies.wire.codecs.spec import CodecSpec, parse_spec
from strategies.wire.codecs.wire import as_vector, check_seed

__all__ = ["ErrorFeedback"]


class ErrorFeedback:
    r"""Error-feedback (memory) wrapper around a codec.

    Implements EF (Karimireddy et al. 2019 [2]_, EF-SGD; Stich et al. 2018
    [1]_, "memory"):

    .. math:: z = e + \delta, \quad p = \mathrm{encode}(z), \quad
              e \leftarrow z - \mathrm{decode}(p).

    The compression error is not lost but re-sent later, which makes biased
    compressors (top-k, sign) converge. Invariant: if the server applies
    ``x' <- x' - decode(p_t)`` while an uncompressed run applies
    ``x <- x - delta_t``, then ``x'_t - e_t = x_t`` at every step.

    Parameters
    ----------
    spec : str
        Codec spec (see :func:`parse_spec`).
    seed : int, default 0
        Default seed for :meth:`step`; pass a fresh ``seed`` per round to
        :meth:`step` for ``randk``/``qsgd``.

    Attributes
    ----------
    residual : numpy.ndarray
        The current error ``e`` (float32). Empty (zero entries) before the
        first step or :meth:`load_state`; its size is fixed by the first step.
    """

    def __init__(self, spec: str, seed: int = 0) -> None:
        self.spec: CodecSpec = parse_spec(spec)
        self.seed: int = check_seed(seed)
        self.residual: np.ndarray = np.zeros(0, dtype=np.float32)
        self._sized = False

    def step(self, delta: np.ndarray, seed: int | None = None,
             segments: Sequence[int] | None = None) -> np.ndarray:
        """Add the residual to ``delta``, encode it, keep the new residual.

        Parameters
        ----------
        delta : numpy.ndarray
            1-D update vector (``flatten`` of ``x_global - x_local``).
        seed : int or None
            Codec seed for this message (defaults to the constructor's seed);
            the server must decode with the same seed.
        segments : sequence of int, optional
            Tensor sizes of ``delta`` (per-tensor specs, :func:`encode`).

        Returns
        -------
        numpy.ndarray
            The ``uint8`` payload to send.

        Raises
        ------
        CodecError
            If ``delta`` is not a finite 1-D vector or its length differs from
            the residual's. The residual is unchanged on error.
        """
        v = as_vector(delta)
        seed_i = self.seed if seed is None else check_seed(seed)
        if not self._sized:
            residual = np.zeros(v.size, dtype=np.float32)
        elif v.size != self.residual.size:
            raise CodecError(
                f"update has {v.size} entries but the error-feedback residual has "
                f"{self.residual.size}; was the model changed?"
            )
        else:
            residual = self.residual
        z = residual + v
        payload = encode(z, self.spec, seed_i, segments)
        z -= decode(payload, self.spec, z.size, seed_i, segments)
        self.residual = z
        self._sized = True
        return payload

    def state(self) -> np.ndarray:
        """Return a copy of the residual, to persist between rounds."""
        return self.residual.copy()

    def load_state(self, residual: np.ndarray) -> None:
        """Restore a residual saved with :meth:`state`.

        An empty array resets the residual (the next step sets its size).

        Raises
        ------
        CodecError
            If ``residual`` is not a finite 1-D numeric array.
        """
        e = as_vector(residual)
        if not np.isfinite(e).all():
            raise CodecError("residual contains NaN or inf")
        self.residual = e.copy()
        self._sized = e.size > 0

    def reset(self) -> None:
        """Forget the residual."""
        self.residual = np.zeros(0, dtype=np.float32)
        self._sized = False
