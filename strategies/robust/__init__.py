"""Byzantine-robust aggregation math (pure numpy): one rule per module.

- :mod:`.norm_bound` -- per-update L2 norm bound (absolute, kappa x the round's lower
  median, history_kappa x the earlier rounds' accepted norms), the norm and scaling of
  an update's float arrays.
- :mod:`.trimmed_mean` -- coordinate-wise trimmed mean.
- :mod:`.median` -- coordinate-wise median.
- :mod:`.multi_krum` -- Multi-Krum selection.
- :mod:`.updates` -- the rules on model updates (lists of arrays): float stacks,
  coordinate-wise reduction.

Each rule takes the round's decoded updates stacked as an ``(n, d)`` array
(one row per site) and returns plain numpy values, so the same math serves the
plug-ins (``strategies/plugins/defences/``: norm bound, Multi-Krum;
``strategies/plugins/aggregators/``: trimmed mean, median), the tests and the
benchmarks (``bench/robustness.py``).
"""

from __future__ import annotations

from strategies.robust.median import coordinate_median
from strategies.robust.multi_krum import krum_scores, lowest_scores, multi_krum_select
from strategies.robust.norm_bound import (NormBound, clip_factors, clip_to_bound,
                                          history_reference, lower_median, round_bound, scaled,
                                          update_norm)
from strategies.robust.trimmed_mean import trimmed_count, trimmed_mean
from strategies.robust.updates import coordinatewise, float_stack

__all__ = [
    "NormBound",
    "clip_factors",
    "clip_to_bound",
    "coordinate_median",
    "coordinatewise",
    "float_stack",
    "history_reference",
    "krum_scores",
    "lowest_scores",
    "lower_median",
    "multi_krum_select",
    "round_bound",
    "scaled",
    "trimmed_count",
    "trimmed_mean",
    "update_norm",
]
