r"""A round's value of one metric from its sites' values, by a robust rule.

Best-round selection (``app.tracking.best_round``) scores each round on its
validation metric. The example-weighted mean
(:func:`strategies.rounds.round_metrics.example_weighted_metrics`) lets one site
decide the score: ``val-auc`` reported as 0.70, 0.72 and 0.99 by three sites
moves the mean by the outlier's full weight. The rules here are unweighted, as
the robust aggregators of the updates are (a site's self-reported example count
buys no weight), and take the sites' values of one metric:

* :func:`site_median`, the median (Yin et al., *Byzantine-Robust Distributed
  Learning: Towards Optimal Statistical Rates*, ICML 2018, Def. 1 on a scalar):
  breakdown point 1/2, so with ``n >= 3`` sites one site's value cannot move
  the score outside the range of the honest values;
* :func:`site_trimmed_mean`, the trimmed mean (ibid., Def. 2,

  .. math:: \operatorname{trmean}(v) = \frac{1}{n - 2b} \sum_{k=b+1}^{n-b} v_{(k)} ,

  :math:`v_{(k)}` sorted) with :math:`b = \max(1, \lfloor 0.2\,n \rfloor)` values
  cut at each end when :math:`n \ge 3` (so that one site is always cut), none
  below.

With two sites every rule is the mean of the two values: no rule can tell the
honest site from the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from strategies.robust import coordinate_median
from strategies.wire.registry import Registry

__all__ = ["ROBUST_RULES", "SCORE_RULES", "TRIM_FRACTION", "site_median", "site_trimmed_mean"]

#: The fraction of the sites' values the trimmed mean cuts at each end (at least one from 3 sites).
TRIM_FRACTION = 0.2


#: The robust rules by their run-config name (``best-round.aggregate``).
ROBUST_RULES: Registry[Callable[[Sequence[float]], float]] = Registry(
    "robust score rule", "best-round.aggregate")


@ROBUST_RULES.register("median")
def site_median(values: Sequence[float]) -> float:
    """The median of the sites' ``values`` (finite, at least one)."""
    return float(coordinate_median(np.asarray(values, np.float64)[:, None])[0])


@ROBUST_RULES.register("trimmed-mean")
def site_trimmed_mean(values: Sequence[float]) -> float:
    """The trimmed mean of the sites' ``values`` (finite, at least one), see the module."""
    n = len(values)
    cut = max(1, math.floor(TRIM_FRACTION * n)) if n >= 3 else 0
    return float(np.mean(np.sort(np.asarray(values, np.float64))[cut:n - cut]))


#: The choices of run config ``best-round.aggregate``: ``auto`` (robust behind a defence),
#: ``mean`` (example-weighted) or a robust rule.
SCORE_RULES = ("auto", "mean", *ROBUST_RULES)
