r"""The downlink's reference model: the global model every in-sync site holds, bit for bit.

With downlink compression (double compression, the book's chapter 3, eq. 3.9:
the aggregator compresses the aggregated update again and accumulates its own
error) a site does not receive the global model :math:`x_t` but a compressed
step :math:`\hat d_t` and reconstructs the reference

.. math:: \hat x_t = \hat x_{t-1} + \hat d_t ,

which the server computes the same way (:mod:`strategies.downlink`). Both ends
add the same decoded ``float32`` vector to the same ``float32`` vector with
numpy, so both get the same bits; :meth:`Reference.checksum` (SHA-256 of the
layout and every array's bytes) lets a site verify that and ask for a dense
snapshot when it does not hold it.

The floating-point arrays advance by the decoded step; the integer ones
(BatchNorm ``num_batches_tracked``) are sent as their new values, raw
(:func:`raw_bytes` / :meth:`Reference.advanced`).

Pure numpy: the strategy and the site (:mod:`clients.site`) share it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from strategies.wire.codecs import flatten, unflatten
from strategies.wire.model_layout import LAYOUT_KEY, MODEL_KEY, pack_model, unpack_model
from strategies.wire.model_layout import float_positions

__all__ = ["VERSION_KEY", "Reference", "raw_bytes"]

#: The packed form's third array (beside ``model`` and ``layout``): the version held.
VERSION_KEY = "version"


def raw_bytes(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The integer (non-float) arrays of ``arrays`` end to end as one ``uint8`` buffer."""
    floats = set(float_positions(arrays))
    parts = [np.ravel(a).view(np.uint8) for i, a in enumerate(arrays) if i not in floats]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


@dataclass(frozen=True)
class Reference:
    """A model the downlink's two ends hold: names, arrays (model order) and version.

    Attributes
    ----------
    names : tuple of str
        The model's array names, in order.
    arrays : tuple of numpy.ndarray
        The arrays, in the order of ``names``.
    version : int
        The server round that produced it (versions only grow within a federation).
    """

    names: tuple[str, ...]
    arrays: tuple[np.ndarray, ...]
    version: int

    @classmethod
    def of(cls, named: Mapping[str, np.ndarray], version: int) -> Reference:
        """The reference holding the arrays ``named`` (in order) at ``version``."""
        return cls(tuple(named), tuple(np.asarray(a) for a in named.values()), int(version))

    def named(self) -> dict[str, np.ndarray]:
        """The arrays by name, in order (what a site loads into its model)."""
        return dict(zip(self.names, self.arrays))

    def vector(self) -> np.ndarray:
        """The floating-point arrays flattened into one ``float32`` vector (model order)."""
        return flatten([self.arrays[i] for i in float_positions(self.arrays)])

    def segments(self) -> list[int]:
        """The sizes of the floating-point arrays (per-tensor codecs, ``topk:<f>:layer``)."""
        return [self.arrays[i].size for i in float_positions(self.arrays)]

    def checksum(self) -> str:
        """SHA-256 (hex) of the names, dtypes, shapes and bytes of every array."""
        digest = hashlib.sha256(json.dumps(
            [[n, a.dtype.str, list(a.shape)] for n, a in zip(self.names, self.arrays)]).encode())
        for array in self.arrays:  # hashed in place: .tobytes() copied the whole model
            digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        return digest.hexdigest()

    def advanced(self, step: np.ndarray, raw: np.ndarray, version: int) -> Reference:
        r"""The reference after :math:`\hat x \leftarrow \hat x + \hat d` (eq. 3.9).

        Parameters
        ----------
        step : numpy.ndarray
            The decoded ``float32`` step of the floating-point arrays (model order).
        raw : numpy.ndarray
            The integer arrays' new values as :func:`raw_bytes` laid them out.
        version : int
            The new version.

        Raises
        ------
        ValueError
            When ``step`` or ``raw`` does not match this reference's layout (a
            :class:`~strategies.wire.codecs.CodecError` for the step).
        """
        floats = float_positions(self.arrays)
        like = [self.arrays[i] for i in floats]
        arrays = list(self.arrays)
        for i, value in zip(floats, unflatten(self.vector() + step, like)):
            arrays[i] = value
        integers = [i for i in range(len(arrays)) if i not in set(floats)]
        sizes = [self.arrays[i].nbytes for i in integers]
        if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size != sum(sizes):
            raise ValueError(f"raw integer arrays: {raw.dtype}{raw.shape}, expected uint8 of "
                             f"{sum(sizes)} bytes")
        offset = 0
        for i, size in zip(integers, sizes):
            old = self.arrays[i]
            arrays[i] = raw[offset:offset + size].view(old.dtype).reshape(old.shape).copy()
            offset += size
        return Reference(self.names, tuple(arrays), int(version))

    def packed(self) -> dict[str, np.ndarray]:
        """The reference as three arrays to store (:meth:`from_packed` reads them back)."""
        return {**pack_model(self.named()),
                VERSION_KEY: np.asarray([self.version], dtype=np.int64)}

    @classmethod
    def from_packed(cls, packed: Mapping[str, np.ndarray]) -> Reference:
        """The reference :meth:`packed` stored.

        Raises
        ------
        strategies.wire.model_layout.PackedModelError
            When the model and its layout do not match.
        """
        named = unpack_model({MODEL_KEY: packed[MODEL_KEY], LAYOUT_KEY: packed[LAYOUT_KEY]})
        return cls.of(named, int(np.asarray(packed[VERSION_KEY]).reshape(-1)[0]))
