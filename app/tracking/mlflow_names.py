"""MLflow's rules for metric and param names, checked before a record is queued.

MLflow refuses a name over 250 characters, with other characters than its own
rules allow, or that would resolve to another name as a path
(``mlflow.utils.validation``). A site's name is part of the product's metric
names (``site/<name>/val-dice``), so a reply could otherwise make MLflow refuse
a whole round: the names it would refuse are moved out of the record first and
set aside with the reason (:meth:`app.tracking.outbox.Outbox.set_aside`).
"""

from __future__ import annotations

from mlflow.utils.validation import (
    MAX_ENTITY_KEY_LENGTH,
    bad_character_message,
    path_not_unique,
    validate_param_and_metric_name,
)

from app.tracking.outbox import RoundRecord

__all__ = ["mlflow_name_problem", "without_refused_names"]


def mlflow_name_problem(name: str) -> str | None:
    """Why MLflow would refuse ``name`` as a metric or param name (``None``: it would not).

    MLflow's rules (``mlflow.utils.validation``): at most ``MAX_ENTITY_KEY_LENGTH``
    (250) characters, its allowed characters, and a path that does not normalise
    to another name.
    """
    shown = repr(name[:60]) + ("..." if len(name) > 60 else "")
    if len(name) > MAX_ENTITY_KEY_LENGTH:
        return (f"MLflow name rule: {shown} has {len(name)} characters, at most "
                f"{MAX_ENTITY_KEY_LENGTH}")
    if not validate_param_and_metric_name(name):
        return f"MLflow name rule: {shown}: {bad_character_message()}"
    if path_not_unique(name):
        return f"MLflow name rule: {shown} would resolve to another name as a path"
    return None


def without_refused_names(record: RoundRecord) -> tuple[RoundRecord, str] | None:
    """Move the metrics and params of ``record`` that MLflow would refuse out of it.

    Returns them as a record of their own with the reasons (``None``: none).
    """
    problems = {name: mlflow_name_problem(name) for name in [*record.metrics, *record.params]}
    refused = {name: problem for name, problem in problems.items() if problem is not None}
    if not refused:
        return None
    aside = RoundRecord(step=record.step, timestamp_ms=record.timestamp_ms,
                        metrics={k: record.metrics.pop(k) for k in refused
                                 if k in record.metrics},
                        params={k: record.params.pop(k) for k in refused
                                if k in record.params})
    return aside, "; ".join(sorted(set(refused.values())))
