"""A weighted sum of updates built one update at a time: ``S = sum_i w_i Delta_i``.

The server-side linear aggregators (FedAvg, McMahan et al., AISTATS 2017;
FedNova, Wang et al., NeurIPS 2020, eq. (6)-(7)) are weighted sums of the
sites' updates. Accumulating them in float64, one update after the other, keeps
the aggregation's memory at one float64 buffer per array position, whatever the
number of updates: an update can be dropped as soon as it is added. Float
arrays and integer buffers (e.g. BatchNorm's ``num_batches_tracked``) carry
separate weights. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["RunningSum"]


class RunningSum:
    """``S_j = sum_i w_i Delta_{i,j}`` per array position ``j``, in float64.

    Parameters
    ----------
    reference : sequence of numpy.ndarray
        The model's arrays: the shapes and dtypes of the sum (its values are not used).
    """

    def __init__(self, reference: Sequence[np.ndarray]) -> None:
        self._dtypes = [np.dtype(array.dtype) for array in reference]
        self._sums = [np.zeros(np.shape(array), dtype=np.float64) for array in reference]
        self.count = 0

    def add(self, update: Sequence[np.ndarray], float_weight: float, int_weight: float) -> None:
        """``S += w Delta``: ``float_weight`` on float arrays, ``int_weight`` on integer ones.

        ``update`` must match the reference's layout (the caller checks it,
        :func:`strategies.aggregation.check_update`).
        """
        for total, array, dtype in zip(self._sums, update, self._dtypes):
            weight = float_weight if dtype.kind == "f" else int_weight
            total += np.multiply(array, weight, dtype=np.float64)
        self.count += 1

    def result(self, float_scale: float = 1.0, int_scale: float = 1.0) -> list[np.ndarray]:
        """``scale x S`` in each array's dtype.

        Float arrays are cast back to their dtype; integer arrays are rounded
        half-to-even and clipped to their dtype's range.
        """
        out: list[np.ndarray] = []
        for total, dtype in zip(self._sums, self._dtypes):
            if dtype.kind == "f":
                scaled = total if float_scale == 1.0 else total * float_scale
                out.append(scaled.astype(dtype))
            else:
                info = np.iinfo(dtype)
                scaled = total if int_scale == 1.0 else total * int_scale
                out.append(np.clip(np.rint(scaled), info.min, info.max).astype(dtype))
        return out
