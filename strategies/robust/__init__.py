"""Byzantine-robust aggregation math (pure numpy): one rule per module.

- :mod:`.norm_bound` -- per-update L2 norm bound (absolute, or kappa x the round's median).
- :mod:`.trimmed_mean` -- coordinate-wise trimmed mean.
- :mod:`.median` -- coordinate-wise median.
- :mod:`.multi_krum` -- Multi-Krum selection.

Each function takes the round's decoded updates stacked as an ``(n, d)`` array
(one row per site) and returns plain numpy values, so the same math serves the
aggregator plug-ins, the tests and the benchmarks.
"""

from __future__ import annotations

from strategies.robust.median import coordinate_median
from strategies.robust.multi_krum import krum_scores, multi_krum_select
from strategies.robust.norm_bound import NormBound, clip_to_bound, round_bound
from strategies.robust.trimmed_mean import trimmed_mean

__all__ = [
    "NormBound",
    "clip_to_bound",
    "coordinate_median",
    "krum_scores",
    "multi_krum_select",
    "round_bound",
    "trimmed_mean",
]
