"""The ``selection`` section of the run config, shared by every client selector.

All selectors take ``selection.m``; ``d``, ``subset`` and ``fairness-rounds`` are
Power-of-Choice's (:mod:`strategies.plugins.selectors.power_of_choice`; Cho,
Wang, Joshi, AISTATS 2022), kept in the same section so that switching
``strategy.selector`` between ``uniform`` and the ``pow-d`` variants keeps ``m``.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.wire.plugin_options import PluginOptions, option

__all__ = ["SelectionOptions"]


@dataclass(frozen=True)
class SelectionOptions(PluginOptions):
    """Run-config section ``selection``.

    Attributes
    ----------
    m : int
        ``selection.m``: sites trained per round; 0 = ``fraction-train`` of the
        connected ones, rounded up (``min-nodes`` is how many to wait for).
    d : int
        ``selection.d``: Power-of-Choice candidate-set size; 0 = adaptive (all
        sites in round 1 down to m by the last round), else >= m.
    subset : int
        ``selection.subset``: examples per candidate whose loss ``cpow-d`` asks for.
    fairness_rounds : int
        ``selection.fairness-rounds``: every site trains at least once every R
        rounds; 0 = off.
    """

    section = "selection"
    m: int = option(0, at_least=0)
    d: int = option(0, at_least=0)
    subset: int = option(32, at_least=0)
    fairness_rounds: int = option(0, at_least=0)

    def check(self) -> None:
        """d is 0 (adaptive) or at least m."""
        if self.d and self.d < self.m:
            self.fail("d", f"must be 0 (adaptive) or >= {self.key('m')} = {self.m}")
