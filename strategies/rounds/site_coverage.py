"""How many of the federation's sites contributed to its models: a partial federation says so.

A hospital that revokes the app, or whose node stops, leaves the other sites to finish
the run alone; the model they make is not the consortium's. A round's *contributing
sites* are those whose train update it aggregated (:attr:`RoundReport.train` of a round
that updated the model). The *federation's sites* are the coordinator's roster
(``federation.roster``), or without one every site that contributed to a round of the
run. Run config ``federation.min-contributing-sites`` sets how many must contribute
(:func:`required_sites`; 0, the default: all of them, ``ceil(fraction-train x sites)``
when each round samples a fraction).

:func:`site_coverage` checks two rounds against that count: the last round that updated
the model (the final model: a run that ended with fewer is *partial*, which the summary,
MLflow and ``make federate``'s exit status report) and the best round (the model
registered as ``<experiment>-best``: with fewer it is logged in the run but not
registered). Pure: the ServerApp hands it the reports and the roster's names.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from strategies.rounds.round_report import RoundReport
from strategies.wire.errors import ConfigError

__all__ = ["BEST_UNREGISTERED_TAG", "CONTRIBUTED_TAG", "MISSING_TAG", "PARTIAL_TAG",
           "REQUIRED_TAG", "SITES_TAG", "SiteCoverage", "check_setting", "contributors",
           "required_sites", "site_coverage"]

#: The run tags of :meth:`SiteCoverage.tags`, read back by the federation summary.
(PARTIAL_TAG, CONTRIBUTED_TAG, SITES_TAG, MISSING_TAG, REQUIRED_TAG,
 BEST_UNREGISTERED_TAG) = (f"federation.{name}" for name in (
     "partial", "contributing-sites", "sites", "missing-sites", "min-contributing-sites",
     "best-not-registered"))


def contributors(report: RoundReport) -> tuple[str, ...]:
    """The sites whose train update round ``report`` aggregated (none: it kept the model)."""
    return () if report.aggregation_failed else tuple(sorted(report.train))


def required_sites(setting: int, sites: int, fraction_train: float) -> int:
    """How many sites a model must have from (run config ``federation.min-contributing-sites``
    = ``setting``): ``setting`` itself, or for 0 ``ceil(fraction_train x sites)`` (every
    site when each round trains them all)."""
    return setting if setting else max(1, math.ceil(fraction_train * sites - 1e-9))


def check_setting(setting: int, roster: Collection[str] | None) -> None:
    """Refuse a ``federation.min-contributing-sites`` above the roster's site count: no
    model could ever be complete."""
    if roster is not None and setting > len(roster):
        raise ConfigError(f"run-config 'federation.min-contributing-sites' must be at most "
                          f"the roster's {len(roster)} sites, got {setting}")


def _model_round(rounds: Mapping[int, tuple[str, ...]], upto: int) -> int:
    """The last round up to ``upto`` that updated the model (0: none)."""
    return max((r for r, names in rounds.items() if names and r <= upto), default=0)


@dataclass(frozen=True)
class SiteCoverage:
    """The sites behind a federation's final and best models, against the required count.

    Attributes
    ----------
    sites : tuple of str
        The federation's sites (the roster's, else every site that contributed).
    required : int
        The contributing sites a complete model needs (:func:`required_sites`).
    final_round : int
        The last round that updated the model (0: none in this process).
    final : tuple of str
        Its contributing sites.
    best_round : int
        The best round (0: none).
    best : tuple of str or None
        Its contributing sites; ``None`` when there is no best round or its report is not
        here (a round run before a resume): then it is not judged.
    """

    sites: tuple[str, ...]
    required: int
    final_round: int
    final: tuple[str, ...]
    best_round: int
    best: tuple[str, ...] | None

    @property
    def partial(self) -> bool:
        """Whether the final model has fewer contributing sites than required."""
        return self.final_round > 0 and len(self.final) < self.required

    @property
    def register_best(self) -> bool:
        """Whether the best round's model may be registered as ``<experiment>-best``."""
        return self.best is None or len(self.best) >= self.required

    def missing(self) -> tuple[str, ...]:
        """The federation's sites the final round did not aggregate."""
        return tuple(site for site in self.sites if site not in self.final)

    def text(self) -> str:
        """``partial: 1 of 2 sites contributed (round 3; missing: site-b; ...)``, or the
        complete count."""
        counted = (f"{len(self.final)} of {len(self.sites)} sites contributed (round "
                   f"{self.final_round}")
        if not self.partial:
            return f"complete: {counted})"
        return (f"partial: {counted}; missing: {', '.join(self.missing()) or 'none'}; "
                f"federation.min-contributing-sites needs {self.required})")

    def metrics(self) -> dict[str, float]:
        """The run's metrics: ``federation/contributing-sites`` (the final model's) and
        ``federation/sites``."""
        return {"federation/contributing-sites": float(len(self.final)),
                "federation/sites": float(len(self.sites))}

    def tags(self) -> dict[str, str]:
        """The run's tags: partial or not, the counts, the missing sites, the best model's fate."""
        tags = {PARTIAL_TAG: str(self.partial).lower(),
                CONTRIBUTED_TAG: ",".join(self.final), SITES_TAG: ",".join(self.sites),
                REQUIRED_TAG: str(self.required)}
        if self.missing():
            tags[MISSING_TAG] = ",".join(self.missing())
        if not self.register_best:
            tags[BEST_UNREGISTERED_TAG] = (
                f"round {self.best_round}: {len(self.best or ())} of {len(self.sites)} sites "
                f"contributed, federation.min-contributing-sites needs {self.required}")
        return tags


def site_coverage(reports: Mapping[int, RoundReport], roster: Collection[str] | None,
                  setting: int, fraction_train: float, best_round: int) -> SiteCoverage:
    """The coverage of a federation from its rounds' ``reports`` (this process's).

    Parameters
    ----------
    reports : Mapping
        Round reports by server round.
    roster : collection of str or None
        The roster's site names (None: no roster; the sites that contributed count).
    setting : int
        Run config ``federation.min-contributing-sites``.
    fraction_train : float
        Run config ``fraction-train``.
    best_round : int
        The best round (0: none).
    """
    rounds = {r: contributors(report) for r, report in sorted(reports.items())}
    seen = sorted({site for names in rounds.values() for site in names})
    sites = tuple(sorted(roster)) if roster is not None else tuple(seen)
    final_round = _model_round(rounds, max(rounds, default=0))
    made = _model_round(rounds, best_round)  # the best model: the last update up to it
    best = rounds[made] if best_round and made else None
    return SiteCoverage(sites, required_sites(setting, len(sites), fraction_train),
                        final_round, rounds.get(final_round, ()), best_round, best)
