r"""``topk:<fraction>:layer``: top-k per tensor (layer-wise sparsification).

Global top-k over the whole update lets the tensors with the largest
magnitudes take every kept entry, so a layer whose update is small in absolute
terms (a bias, a normalisation scale, the last layer of a deep network) may
send nothing for many rounds; layer-wise top-k keeps
:math:`k_l = \max(1, \mathrm{round}(f\, d_l))` entries of every tensor ``l``
(Deep Gradient Compression [1]_, Algorithm 1, selects per layer too).
``k = sum_l k_l`` and the wire format are those of
:mod:`strategies.wire.codecs.topk` (sorted global indices and fp16 values), so the
wire bytes are counted as for global top-k; the decoder checks that every
tensor holds exactly its ``k_l`` indices. The tensor sizes ``d_l`` are bound to
the spec (:meth:`~strategies.wire.codecs.spec.CodecSpec.bind`) by both ends from the
model's arrays (:mod:`strategies.wire.update_codec`); they are not sent.

References
----------
.. [1] Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression: Reducing the
   Communication Bandwidth for Distributed Training", ICLR 2018.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from strategies.wire.codecs.errors import PayloadError
from strategies.wire.codecs.spec import CodecSpec

__all__ = ["check_layer_counts", "layer_topk_indices"]


def _bounds(spec: CodecSpec) -> np.ndarray:
    return np.cumsum([0, *spec.segments], dtype=np.int64)  # type: ignore[misc]


def layer_topk_indices(magnitude: np.ndarray, spec: CodecSpec,
                       select: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
    """Sorted int64 indices of the ``k_l`` largest entries of every bound tensor.

    ``select(magnitude_l, k_l)`` picks within one tensor (``topk_indices``).
    """
    bounds = _bounds(spec)
    parts = [select(magnitude[start:end], k) + start
             for start, end, k in zip(bounds[:-1], bounds[1:], spec.segment_ks(magnitude.size))]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def check_layer_counts(idx: np.ndarray, spec: CodecSpec, d: int) -> None:
    """Raise :class:`PayloadError` unless tensor ``l`` holds exactly ``k_l`` of the indices."""
    counts = np.diff(np.searchsorted(idx, _bounds(spec)))
    expected = np.asarray(spec.segment_ks(d), dtype=counts.dtype)
    if not np.array_equal(counts, expected):
        bad = int(np.flatnonzero(counts != expected)[0])
        raise PayloadError(f"top-k per tensor: tensor {bad} holds {int(counts[bad])} indices, "
                           f"{spec} keeps {int(expected[bad])}")
