"""MLflow as the system of record: one MLflow run per federation.

The experiment is per task (``fedmed-<task>`` unless the run config names one).
The run holds the run config as params, per round the aggregated and per-site
train loss and validation Dice, the round wall time and dropped replies, and at
the end the global model as an MLflow PyTorch model. The store is the tracking
URI of the run config, else ``MLFLOW_TRACKING_URI``; `make simulate` points it
at the project's sqlite file.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
from mlflow.tracking import MlflowClient
from torch import nn

from strategies.rounds.round_report import RoundReport

__all__ = ["FederationTracker", "metric_key"]


def _import_mlflow_pytorch() -> None:
    """Import ``mlflow.pytorch`` without the root log handler it installs.

    ``mlflow.pytorch._lightning_autolog`` calls ``logging.basicConfig`` at import,
    which duplicates every Flower log line in the ServerApp's output.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    import mlflow.pytorch  # noqa: F401, PLC0415

    root.handlers[:] = handlers
    root.setLevel(level)


_import_mlflow_pytorch()

_UNSAFE = re.compile(r"[^0-9A-Za-z_\-./ ]")

# Pinned requirements recorded with the model, so MLflow does not run its slow
# (and network-hungry) requirement inference.
MODEL_REQUIREMENTS = ["torch==2.13.0", "monai", "numpy"]


def metric_key(*parts: str) -> str:
    """MLflow-safe metric name such as ``site/hospital-00/val-dice``."""
    return "/".join(_UNSAFE.sub("_", p) for p in parts)


class FederationTracker:
    """Logs one federation to MLflow.

    Parameters
    ----------
    task : str
        Task name, used for the default experiment ``fedmed-<task>``.
    tracking_uri : str
        MLflow tracking URI; empty uses ``MLFLOW_TRACKING_URI`` or MLflow's default.
    artifact_root : str
        Artifact location for a newly created experiment (absolute path);
        empty lets the tracking server decide.
    experiment : str
        Experiment name; empty gives ``fedmed-<task>``.
    """

    def __init__(self, task: str, tracking_uri: str = "", artifact_root: str = "",
                 experiment: str = "") -> None:
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        if uri:
            mlflow.set_tracking_uri(uri)
        self.tracking_uri = mlflow.get_tracking_uri()
        self.experiment_name = experiment or f"fedmed-{task}"
        client = MlflowClient()
        found = client.get_experiment_by_name(self.experiment_name)
        if found is None:
            location = Path(artifact_root).as_uri() if artifact_root else None
            self.experiment_id = client.create_experiment(self.experiment_name,
                                                          artifact_location=location)
        else:
            self.experiment_id = found.experiment_id
        self.run_id = ""

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> str:
        """Open the federation's MLflow run and log its params; returns the run id."""
        run = mlflow.start_run(experiment_id=self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        mlflow.log_params({k: str(v) for k, v in params.items()})
        return self.run_id

    def resume(self, run_id: str, after_round: int, flwr_run_id: str) -> str:
        """Reopen the federation's MLflow run after a crash; returns its id."""
        run = mlflow.start_run(run_id=run_id)
        self.run_id = run.info.run_id
        mlflow.set_tags({f"resumed-after-round-{after_round}": flwr_run_id,
                         "flwr.run-id": flwr_run_id})
        return self.run_id

    def log_round(self, report: RoundReport) -> None:
        """Log one round: aggregates, per-site values, dropped replies, wall time."""
        step = report.server_round
        metrics: dict[str, float] = {"round-seconds": report.seconds,
                                     "replies-accepted": float(len(report.train)),
                                     "replies-dropped": float(len(report.train_dropped)),
                                     "replies-late": float(report.missing.get("train", 0)),
                                     "late-arrivals": float(len(report.late_arrivals)),
                                     "strategy/schedule-tau": float(report.schedule_tau)}
        for name, value in report.strategy.items():
            metrics[metric_key("strategy", name)] = value
        for name, value in report.train_aggregate.items():
            metrics[metric_key("train", name)] = value
        for name, value in report.evaluate_aggregate.items():
            metrics[metric_key("eval", name)] = value
        for site, values in report.train.items():
            for name, value in values.items():
                metrics[metric_key("site", site, name)] = value
        for site, values in report.evaluate.items():
            for name, value in values.items():
                metrics[metric_key("site", site, name)] = value
        for site, values in report.traffic.items():
            for name, value in values.items():
                metrics[metric_key("site", site, name)] = value
        for site in report.train:
            metrics[metric_key("site", site, "failed")] = 0.0
        for site in report.train_dropped:
            metrics[metric_key("site", site, "failed")] = 1.0
        for site, count in report.times_selected.items():
            metrics[metric_key("site", site, "times-selected")] = count
        for site, loss in report.selection.get("losses", {}).items():
            metrics[metric_key("site", site, "query-loss")] = loss
        mlflow.log_metrics(metrics, step=step)
        dropped = {f"train/{s}": r for s, r in report.train_dropped.items()}
        dropped.update({f"evaluate/{s}": r for s, r in report.evaluate_dropped.items()})
        if report.selection.get("candidates"):
            mlflow.log_dict(report.selection, f"rounds/round-{step:03d}-selection.json")
        if report.late_arrivals:
            dropped["late-arrivals"] = ", ".join(report.late_arrivals)
        if dropped:
            mlflow.log_dict(dropped, f"rounds/round-{step:03d}-dropped.json")

    def log_model(self, model: nn.Module, input_example: np.ndarray) -> str:
        """Log the final global model as an MLflow PyTorch model; returns its URI.

        ``input_example`` (one input batch) lets MLflow trace the model and
        record its signature.
        """
        info = mlflow.pytorch.log_model(model.cpu().eval(), name="global-model",
                                        input_example=input_example,
                                        pip_requirements=MODEL_REQUIREMENTS)
        return info.model_uri

    def finish(self, status: str = "FINISHED") -> None:
        """Close the run with ``FINISHED`` or ``FAILED``."""
        if mlflow.active_run() is not None:
            mlflow.end_run(status=status)
