"""The end of a federation's MLflow run, kept on the server's disk until MLflow has it.

Once the rounds are over, the ServerApp writes what the end of the run sends to
MLflow into the federation's checkpoint folder *before* it sends anything
(:meth:`RunEnd.save`): ``tracking-end.json`` (the MLflow run, the run config,
the last round's and the best round's scores, the run's tags and final status)
and the two models' weights, ``global-model.safetensors`` and
``best-model.safetensors``. Sending it (:meth:`RunEnd.send`) logs and registers
the two models (:func:`~app.tracking.federation_models.log_federation_models`),
sets the tags and closes the run with its status; it is idempotent: a model the
run already holds, or a version the registry already has for the run, is not
logged again, so a send cut short is simply repeated. Once MLflow has all of it
the files are deleted.

:func:`finish_run` is the ServerApp's bounded wait: it sends the tracking outbox
and then the end, retrying every :data:`RETRY_SECONDS` for at most run config
``tracking.end-wait-s`` seconds; what is still not sent then stays on disk and
the warning names the command that sends it later, ``make tracking-flush``
(:mod:`app.tracking.flush`). The federation is not failed by an MLflow outage:
its result is on disk. Without a checkpoint folder the end lives in memory and is
lost when the wait runs out (as the outbox is).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from logging import DEBUG, INFO, WARNING
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from flwr.supercore import log
from safetensors.numpy import load_file, save_file

from app.config.run_config import RunConfig
from app.tracking.best_round import BestRound
from app.tracking.federation_models import FederationModels, RoundScore, log_federation_models
from app.tracking.model_folder import METADATA_KEY
from app.tracking.model_logging import model_metadata
from app.tracking.model_sparsity import sparsity
from app.tracking.tracker import FederationTracker, bounded_requests
from clients.registry import task_class
from clients.site.atomic_file import write_atomic

__all__ = ["BEST_WEIGHTS", "END_FILE", "FINAL_WEIGHTS", "RETRY_SECONDS", "RunEnd", "leave_open",
           "finish_run", "flush_command"]

#: The end's description and the two models' weights in the federation's folder.
END_FILE = "tracking-end.json"
FINAL_WEIGHTS = "global-model.safetensors"
BEST_WEIGHTS = "best-model.safetensors"
#: Seconds between two tries of the bounded wait (each MLflow request is bounded too).
RETRY_SECONDS = 5.0
#: Seconds one MLflow request of the end may take (a model upload is one request).
END_REQUEST_TIMEOUT = 60


def flush_command(folder: Path | None, tracking_uri: str) -> str:
    """The command that sends what ``folder`` still holds once MLflow answers."""
    return f"make tracking-flush RUN_DIR={folder} TRACKING_URI={tracking_uri}"


def _weights(keys: list[str], arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {key: np.ascontiguousarray(array) for key, array in zip(keys, arrays)}


@dataclass
class RunEnd:
    """What the end of a federation sends to MLflow.

    Attributes
    ----------
    run_id, experiment, tracking_uri : str
        The federation's MLflow run, its experiment's name and the store.
    run_config : dict
        The run config (:meth:`RunConfig.as_params`): the task, its sizes, the codec.
    last : RoundScore
        The last round and its evaluation (``value`` NaN: not evaluated here).
    best : RoundScore or None
        The best round (``None``: no round was evaluated).
    final, best_weights : dict[str, numpy.ndarray]
        The final and the best round's global model, by state-dict key.
    tags : dict[str, str]
        Run tags set at the end (``early-stopped-at-round``, the sites' coverage:
        :meth:`strategies.rounds.site_coverage.SiteCoverage.tags`).
    status : str
        The run's final status, ``FINISHED`` or ``FAILED``.
    folder : Path or None
        The federation's checkpoint folder holding it (``None``: memory only).
    metrics : dict[str, float]
        Run metrics logged at the end (``federation/contributing-sites``).
    register_best : bool
        Whether the best model is registered as ``<experiment>-best`` (false: too few
        sites contributed to it; it is logged in the run only).
    """

    run_id: str
    experiment: str
    tracking_uri: str
    run_config: dict[str, Any]
    last: RoundScore
    best: RoundScore | None
    final: dict[str, np.ndarray] = field(repr=False)
    best_weights: dict[str, np.ndarray] = field(repr=False)
    tags: dict[str, str] = field(default_factory=dict)
    status: str = "FINISHED"
    folder: Path | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    register_best: bool = True

    @classmethod
    def of(cls, tracker: FederationTracker, run_config: dict[str, Any], last: RoundScore,
           best: BestRound, final: tuple[list[str], list[np.ndarray]],
           tags: dict[str, str], folder: Path | None, metrics: dict[str, float] | None = None,
           register_best: bool = True) -> RunEnd:
        """The end of ``tracker``'s run, written to ``folder`` (when given) before it returns."""
        score = (RoundScore(best.round, best.metric, best.value, list(best.sites))
                 if best.found else None)
        end = cls(tracker.run_id, tracker.experiment_name,
                  tracker.tracking_uri, dict(run_config), last, score, _weights(*final),
                  _weights(best.keys, best.arrays) if best.found else {}, dict(tags),
                  folder=folder, metrics=dict(metrics or {}), register_best=register_best)
        end.save()
        return end

    def save(self) -> None:
        """Write the weights, then ``tracking-end.json`` (atomically): no file, no end."""
        if self.folder is None:
            return
        save_file(self.final, str(self.folder / FINAL_WEIGHTS))
        if self.best is not None:
            save_file(self.best_weights, str(self.folder / BEST_WEIGHTS))
        described = {name: value for name, value in asdict(self).items()
                     if name not in ("final", "best_weights", "folder")}
        write_atomic(self.folder / END_FILE,
                     lambda h: h.write(json.dumps(described, default=str).encode()))

    @classmethod
    def load(cls, folder: Path) -> RunEnd | None:
        """The end ``folder`` holds (``None``: none, it was sent)."""
        path = Path(folder) / END_FILE
        if not path.is_file():
            return None
        values = json.loads(path.read_text(encoding="utf-8"))
        best = values.pop("best")
        return cls(**{**values, "last": RoundScore(**values["last"])},
                   best=None if best is None else RoundScore(**best),
                   final=load_file(str(Path(folder) / FINAL_WEIGHTS)),
                   best_weights={} if best is None else load_file(str(Path(folder) / BEST_WEIGHTS)),
                   folder=Path(folder))

    def with_status(self, status: str) -> RunEnd:
        """This end, closing the run with ``status`` (saved again when it changed)."""
        if status != self.status:
            self.status = status
            self.save()
        return self

    def opened_as(self, run_id: str) -> None:
        """The MLflow run of a federation whose start reached MLflow only after its end
        was written (saved again)."""
        if run_id and run_id != self.run_id:
            self.run_id = run_id
            self.save()

    def waiting(self) -> FederationModels:
        """The models while they wait on disk: no URI, no version yet."""
        best_round = 0 if self.best is None else self.best.server_round  # 0: none evaluated
        return FederationModels("", "", "", "", best_round)

    def best_round(self) -> BestRound:
        """The best round as :func:`log_federation_models` takes it."""
        best = BestRound(self.last.metric)
        if self.best is not None:
            best.restore({"round": self.best.server_round, "value": self.best.value,
                          "sites": self.best.sites, "keys": list(self.best_weights),
                          "arrays": list(self.best_weights.values()), "stale": 0})
        return best

    def send(self) -> FederationModels:
        """Log and register the two models (those MLflow lacks), set the tags, close the run.

        Raises whatever MLflow raises (its requests bounded, no retries); the
        files are deleted once every part is in MLflow.
        """
        config = RunConfig.from_mapping(self.run_config)
        task, settings = task_class(config.task), config.task_settings()
        private = config.dp_noise_multiplier > 0
        mlflow.set_tracking_uri(self.tracking_uri)
        metadata = model_metadata(config.task, settings, private, task.main_metric)
        pruned = self._pruned(config, task, private)
        with bounded_requests(END_REQUEST_TIMEOUT), _in_run(self.run_id):
            if self.tags:
                mlflow.set_tags(self.tags)
            if self.metrics:  # the same values again after a cut-short send: harmless
                mlflow.log_metrics(self.metrics)
            if pruned:  # the logged model's sparsity (params kept, FLOPs, bytes)
                metadata[METADATA_KEY]["pruning"] = pruned
                mlflow.log_metrics({f"model/{k}": v for k, v in pruned.items()
                                    if k != "mode"})
            models = log_federation_models(
                self.run_id, self.experiment, task.model_for_run(settings, private=private),
                (list(self.final), list(self.final.values())), self.last, self.best_round(),
                task.example_input(settings), metadata, config.strategy_codec,
                reuse_logged=True, register_best=self.register_best)
            mlflow.end_run(status=self.status)
        self.forget()
        return models

    def _pruned(self, config: RunConfig, task: Any, private: bool) -> dict[str, Any]:
        """The final model's sparsity under ``strategy.pruning`` (``mode`` and
        :func:`app.tracking.model_sparsity.sparsity`); {} without pruning."""
        if config.strategy_pruning == "none":
            return {}
        mode = config.plugin_options["pruning"].mode
        model = task.model_for_run(config.task_settings(), private=private)
        model.load_state_dict({k: torch.as_tensor(v) for k, v in self.final.items()})
        return {"mode": mode, **sparsity(model.eval(), task.example_input(config.task_settings()),
                                         mode)}

    def forget(self) -> None:
        """Delete the end's files (MLflow has all of it)."""
        if self.folder is not None:
            for name in (END_FILE, FINAL_WEIGHTS, BEST_WEIGHTS):
                (self.folder / name).unlink(missing_ok=True)


@contextmanager
def _in_run(run_id: str) -> Iterator[None]:
    """Inside the active MLflow run ``run_id`` (reopened when another process ran it)."""
    active = mlflow.active_run()
    if active is None or active.info.run_id != run_id:
        mlflow.start_run(run_id=run_id)
    yield


def leave_open() -> None:
    """Leave the active run open (``RUNNING``: its end is not sent) without waiting for MLflow."""
    if mlflow.active_run() is not None:
        with suppress(Exception), bounded_requests():
            mlflow.end_run(status="RUNNING")  # pops the run first, then asks MLflow


def finish_run(tracker: FederationTracker, end: RunEnd, wait_s: float,
               sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> FederationModels:
    """Send the outbox, then ``end``, retrying for at most ``wait_s`` seconds.

    Returns the logged models, or :meth:`RunEnd.waiting` when MLflow did not
    take everything in time: the rest stays on disk and the warning names the
    command that sends it (:func:`flush_command`). Never raises.
    """
    deadline, tries = clock() + wait_s, 0
    while True:
        tries += 1
        if tracker.flush(quiet=tries > 1):  # one warning, not one per try
            end.opened_as(tracker.run_id)
            try:
                models = end.send()
                if tries > 1:
                    log(INFO, "MLflow at %s took the end of run %s after %d tries",
                        end.tracking_uri, end.run_id, tries)
                return models
            except Exception as exc:  # noqa: BLE001 - the federation's result is on disk
                log(DEBUG if tries > 1 else WARNING, "MLflow at %s: the end of run %s not "
                    "sent (%s: %s)",
                    end.tracking_uri, end.run_id, type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "")
        left = deadline - clock()
        if left <= 0:
            break
        sleep(min(RETRY_SECONDS, left))
    leave_open()
    where = (f"kept in {end.folder}; once MLflow answers, send it with "
             f"`{flush_command(end.folder, end.tracking_uri)}`" if end.folder is not None
             else "lost (no checkpoint-dir: the outbox and the end live in memory)")
    log(WARNING, "MLflow at %s did not answer within tracking.end-wait-s = %g s: %d round(s) "
        "and the end of run %s (models, registration, status %s) %s", end.tracking_uri,
        wait_s, len(tracker.outbox.pending), end.run_id, end.status, where)
    return end.waiting()
