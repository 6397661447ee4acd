"""Tracking: one MLflow run per federation (:mod:`app.tracking.tracker`), with the
rounds MLflow does not have yet kept in an outbox on the server's disk
(:mod:`app.tracking.outbox`)."""

from app.tracking.outbox import OUTBOX_FILE, Outbox, RoundRecord
from app.tracking.tracker import (
    FLUSH_TIMEOUT_SECONDS,
    FederationTracker,
    bounded_requests,
    metric_key,
    round_record,
)

__all__ = ["FLUSH_TIMEOUT_SECONDS", "OUTBOX_FILE", "FederationTracker", "Outbox", "RoundRecord",
           "bounded_requests", "metric_key", "round_record"]
