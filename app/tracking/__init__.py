"""Tracking: one MLflow run per federation (:mod:`app.tracking.tracker`), with the
rounds MLflow does not have yet kept in an outbox on the server's disk
(:mod:`app.tracking.outbox`); the best round (:mod:`app.tracking.best_round`) and
the models the federation leaves in MLflow and its Model Registry
(:mod:`app.tracking.model_logging`, :mod:`app.tracking.federation_models`), kept on
disk at the end until MLflow has them (:mod:`app.tracking.run_end`; ``make
tracking-flush``, :mod:`app.tracking.flush`, sends what an outage left)."""

from app.tracking.best_round import BestRound
from app.tracking.federation_models import FederationModels, RoundScore, log_federation_models
from app.tracking.model_logging import log_task_model, model_metadata, register_version
from app.tracking.outbox import OUTBOX_FILE, Outbox, RoundRecord
from app.tracking.tracker import (
    FLUSH_TIMEOUT_SECONDS,
    FederationTracker,
    bounded_requests,
    metric_key,
    round_record,
)

__all__ = ["FLUSH_TIMEOUT_SECONDS", "OUTBOX_FILE", "BestRound", "FederationModels",
           "FederationTracker", "Outbox", "RoundRecord", "RoundScore", "bounded_requests",
           "log_federation_models", "log_task_model", "metric_key", "model_metadata",
           "register_version", "round_record"]
