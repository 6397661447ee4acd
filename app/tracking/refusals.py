"""A federation that aggregated nothing: detected, its refusals counted by rule.

A round aggregated an update when at least one train reply was accepted and the
new global model replaced the old one (:attr:`RoundReport.aggregation_failed`
empty). When no round did (every site refused, failed or was dropped in every
round), the global model is still the initial one: the ServerApp marks the MLflow
run ``FAILED``, registers nothing and raises :class:`FederationError` naming the
drops counted by policy rule (:func:`strategies.rounds.withheld.refused_rule`).
A resumed federation is checked over all its rounds: the checkpoint counts the
rounds that aggregated before it (``ServerCheckpoint.aggregated_rounds``); one
written before they were counted is not checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from logging import WARNING

import mlflow
from flwr.supercore import log

from app.tracking.tracker import bounded_requests
from strategies.rounds.round_report import RoundReport
from strategies.rounds.withheld import refused_rule
from strategies.wire.errors import FederationError

__all__ = ["DROPPED", "NO_REPLY", "REFUSALS_ARTIFACT", "REFUSALS_TAG", "aggregated_any",
           "refusal_counts", "refusals_text", "require_aggregation", "round_aggregated"]

#: The run tag and the artifact that hold the counts of a run that aggregated nothing.
REFUSALS_TAG, REFUSALS_ARTIFACT = "refusals", "refusals.json"

#: The count of train replies dropped for a reason other than a policy rule.
DROPPED = "dropped"
#: The count of selected sites that sent no train reply before the round closed.
NO_REPLY = "no reply"


def round_aggregated(report: RoundReport) -> bool:
    """Whether the round accepted a train reply and updated the global model."""
    return bool(report.train) and not report.aggregation_failed


def aggregated_any(reports: Mapping[int, RoundReport]) -> bool:
    """Whether any round accepted a train reply and updated the global model."""
    return any(round_aggregated(report) for report in reports.values())


def refusal_counts(reports: Mapping[int, RoundReport]) -> dict[str, int]:
    """Dropped train replies over all rounds, by policy rule (``dropped``: no rule named;
    ``no reply``: a selected site that never answered), in name order."""
    counts: Counter[str] = Counter()
    for report in reports.values():
        for reason in report.train_dropped.values():
            counts[refused_rule(reason) or DROPPED] += 1
        counts[NO_REPLY] += report.missing.get("train", 0)
    return {rule: count for rule, count in sorted(counts.items()) if count}


def refusals_text(counts: Mapping[str, int]) -> str:
    """``apps: 2, min-batch-size: 1`` (``none``: no drop recorded)."""
    return ", ".join(f"{rule}: {count}" for rule, count in counts.items()) or "none"


def require_aggregation(reports: Mapping[int, RoundReport], earlier: int | None = 0) -> None:
    """Raise :class:`FederationError` when no round of the federation aggregated an update:
    none of ``reports`` and none of the ``earlier`` rounds (a resume's checkpointed rounds
    that aggregated; ``None``: not counted, then nothing is checked).

    The active MLflow run first gets the counts as its ``refusals`` tag and
    ``refusals.json`` artifact (bounded requests; an unreachable store is a
    warning, never a different error).

    Raises
    ------
    FederationError
        Naming the rounds run and the train drops counted by rule.
    """
    if earlier is None or earlier > 0 or aggregated_any(reports):
        return
    counts = refusal_counts(reports)
    text = refusals_text(counts)
    try:
        if mlflow.active_run() is not None:  # set_tag would otherwise start a run of its own
            with bounded_requests():
                mlflow.set_tag(REFUSALS_TAG, text)
                mlflow.log_dict(counts, REFUSALS_ARTIFACT)
    except Exception as exc:  # noqa: BLE001 - the FederationError below is what matters
        log(WARNING, "could not record the refusals in MLflow (%s)", exc)
    raise FederationError(
        f"no round aggregated any update in {len(reports)} round(s): every train reply was "
        f"refused, failed or dropped (by rule: {text}); nothing registered")
