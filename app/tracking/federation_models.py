"""The two models a federation leaves in MLflow: the best round's and the final one.

At the end of a federation the ServerApp logs ``best-model`` (the round with the
best ``val-<main metric>``, :class:`~app.tracking.best_round.BestRound`) and
``global-model`` (the last round's) in the federation's run, and registers each
as a new version of ``<experiment>-best`` and ``<experiment>-final`` in the
MLflow Model Registry. A version's tags say where it comes from: ``run-id``,
``round``, ``metric`` and its value (``val-dice``: ``0.8123``), ``sites`` (the
sites that evaluated that round), ``codec`` and, under DP-SGD, ``dp-epsilon``
(the largest last reported epsilon of any site, :func:`dp_epsilon`). The run gets
the tag ``best-round`` and the metrics ``best-round`` and ``best-<metric>``.

Logging is idempotent (the end of a run may be sent again after an MLflow
outage, :mod:`app.tracking.run_end`): a model the run already holds under that
name, a registry version already made from the run, and the ``best-round``
metrics already logged are kept, not logged twice.

A federation in which no round was evaluated (``fraction-evaluate = 0``) has no
best round: nothing is logged or registered as the best model (an unscored model
is not the best of anything; the run gets no ``best-round`` tag), a warning says
so, and its final model is registered as ``<experiment>-final`` as always. A best round
too few sites contributed to (run config ``federation.min-contributing-sites``,
:mod:`strategies.rounds.site_coverage`) is logged as ``best-model`` but not registered: a
partial federation's model never becomes the newest ``<experiment>-best``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from logging import WARNING
from typing import Any

import mlflow
import numpy as np
import torch
from flwr.supercore import log
from mlflow.entities import LoggedModelStatus, Run
from mlflow.tracking import MlflowClient
from torch import nn

from app.tracking.best_round import BestRound
from app.tracking.model_logging import log_task_model, register_version
from strategies.wire import message_keys as keys

__all__ = ["FederationModels", "RoundScore", "dp_epsilon", "log_federation_models",
           "version_tags"]

_EPSILON = re.compile(rf"site/[^/]+/{re.escape(keys.EPSILON)}")


@dataclass(frozen=True)
class RoundScore:
    """One round's global model and how it was scored (``value`` NaN: not evaluated)."""

    server_round: int
    metric: str
    value: float
    sites: list[str]


@dataclass(frozen=True)
class FederationModels:
    """URIs of the logged models and their registry versions (``""``: not registered)."""

    best_uri: str
    final_uri: str
    best_version: str
    final_version: str
    best_round: int


def dp_epsilon(metrics: dict[str, float]) -> float | None:
    """The largest ``site/<name>/epsilon`` of a run's latest metrics; ``None`` without DP."""
    values = [v for k, v in metrics.items() if _EPSILON.fullmatch(k)]
    return max(values) if values else None


def version_tags(run_id: str, score: RoundScore, codec: str,
                 epsilon: float | None) -> dict[str, str]:
    """The registry version tags of a model scored by ``score``."""
    tags = {"run-id": run_id, "round": str(score.server_round), "metric": score.metric,
            "sites": ",".join(score.sites), "codec": codec}
    if math.isfinite(score.value):
        tags[score.metric] = f"{score.value:.6g}"
    if epsilon is not None:
        tags["dp-epsilon"] = f"{epsilon:.6g}"
    return tags


def _load(model: nn.Module, keys_: list[str], arrays: list[np.ndarray]) -> nn.Module:
    model.load_state_dict({k: torch.from_numpy(np.array(a)) for k, a in zip(keys_, arrays)})
    return model


def _logged_uri(run: Run, name: str, reuse: bool) -> str:
    """The URI of the model ``name`` the run already holds (ready), ``""`` if none (or not
    ``reuse``)."""
    if not reuse:
        return ""
    found = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id], output_format="list",
        filter_string=f"source_run_id = '{run.info.run_id}' AND name = '{name}'")
    ready = [m for m in found if m.status == LoggedModelStatus.READY]
    return f"models:/{ready[0].model_id}" if ready else ""


def _version(run_id: str, model_uri: str, name: str, tags: dict[str, str]) -> str:
    """The registry version of ``name`` made from ``model_uri``: the existing one, else a new
    one."""
    existing = [v for v in MlflowClient().search_model_versions(
        f"name = '{name}' AND run_id = '{run_id}'") if v.source == model_uri]
    if existing:
        return f"models:/{name}/{existing[0].version}"
    return register_version(model_uri, name, tags)


def log_federation_models(run_id: str, experiment: str, model: nn.Module,
                          final: tuple[list[str], list[np.ndarray]], last: RoundScore,
                          best: BestRound, input_example: np.ndarray,
                          metadata: dict[str, Any], codec: str,
                          reuse_logged: bool = False,
                          register_best: bool = True) -> FederationModels:
    """Log and register the best and the final model of the active run ``run_id``.

    Parameters
    ----------
    run_id, experiment : str
        The federation's MLflow run (active) and experiment name.
    model : nn.Module
        The task's network; its weights are replaced by each model's in turn.
    final : (keys, arrays)
        The final global model's state.
    last : RoundScore
        The last round and its evaluation.
    best : BestRound
        The best round found (:attr:`BestRound.found` false: none was evaluated, then
        no best model is logged: ``best_uri``, ``best_version`` empty, ``best_round`` 0).
    input_example, metadata, codec
        As recorded with each model (:func:`~app.tracking.model_logging.log_task_model`).
    reuse_logged : bool
        Keep what the run already holds (a send repeated after an outage): a model
        of the same name, a version made from it, the ``best-round`` metrics.
    register_best : bool
        Whether the best model is registered as ``<experiment>-best`` (false: logged only,
        ``best_version`` empty).
    """
    run = MlflowClient().get_run(run_id)
    epsilon = dp_epsilon(run.data.metrics)
    final_uri = _logged_uri(run, "global-model", reuse_logged) or log_task_model(
        _load(model, *final), "global-model", input_example, metadata)
    final_version = _version(run_id, final_uri, f"{experiment}-final",
                             version_tags(run_id, last, codec, epsilon))
    if not best.found:
        log(WARNING, "no round was evaluated (fraction-evaluate = 0?): no model is logged or "
            "registered as the best one; the final model of round %d is %s",
            last.server_round, final_version or final_uri)
        return FederationModels(best_uri="", final_uri=final_uri, best_version="",
                                final_version=final_version, best_round=0)
    score = RoundScore(best.round, best.metric, best.value, best.sites)
    best_uri = _logged_uri(run, "best-model", reuse_logged) or log_task_model(
        _load(model, best.keys, best.arrays), "best-model", input_example, metadata)
    if not (reuse_logged and "best-round" in run.data.metrics):
        mlflow.log_metrics({"best-round": float(best.round), f"best-{best.metric}": best.value})
    mlflow.set_tag("best-round", str(score.server_round))
    best_version = (_version(run_id, best_uri, f"{experiment}-best",
                             version_tags(run_id, score, codec, epsilon))
                    if register_best else "")
    return FederationModels(best_uri=best_uri, final_uri=final_uri, best_version=best_version,
                            final_version=final_version, best_round=score.server_round)
