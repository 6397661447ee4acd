"""The example-weighted mean: the one place it is written.

A federation reports a site metric (loss, Dice, AUC, ...) over all sites as
the mean weighted by each site's number of examples,

.. math:: \\bar v = \\sum_i n_i v_i \\Big/ \\sum_i n_i ,

which is the metric of the pooled data when the metric is itself a per-example
mean (McMahan et al., AISTATS 2017, FedAvg's weighting :math:`p_i = n_i / n`).
The aggregation of *updates* with the same weights is
:func:`strategies.aggregation.fedavg_delta` (arrays, float64 accumulation).

Pure python: no numpy, torch or Flower needed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["weighted_mean"]


def weighted_mean(pairs: Iterable[tuple[float, float]]) -> float:
    """Mean of the values weighted by their weights, from ``(value, weight)`` pairs.

    Parameters
    ----------
    pairs : iterable of (float, float)
        ``(v_i, n_i)``: a site's value and its weight (number of examples).

    Returns
    -------
    float
        :math:`\\sum_i n_i v_i / \\sum_i n_i`, or ``nan`` when the total weight
        is not positive (no pairs, or all weights zero). Callers that must skip
        undefined values filter the pairs first.
    """
    pairs = list(pairs)
    total = sum(weight for _, weight in pairs)
    return sum(value * weight for value, weight in pairs) / total if total > 0 else math.nan
