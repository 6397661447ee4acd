"""The ServerApp's vertical federation (``federation.kind = "vertical"``): :func:`federate_vertical`.

The same apps, policy and tracking as a horizontal federation, other messages
(docs/VERTICAL.md):

1. wait for the sites (``min-nodes``, bounded by ``node-wait-timeout``) and ask each for its
   department and task (stage ``describe``);
2. for pvFed, align the sites' patients by a private set intersection
   (:func:`app.vertical.psi_flow.align`: the coordinator learns the intersection's size);
3. run the method named by ``vertical.method`` (:data:`VERTICAL_RUNNERS`): pvFed's rounds of
   local encoders in, a global encoder out; or split learning's batches of cut-layer
   activations and gradients;
4. log every round to one MLflow run (per site ``site/<department>/<metric>``, the mean over
   sites under ``vertical/<metric>``), the traffic, and the sites' final metrics;
5. with a ``checkpoint-dir``, checkpoint after every round
   (:mod:`app.vertical.vertical_checkpoint`, the horizontal federation's file and folder);
   ``resume = true`` continues after the newest checkpoint of the same run config, in the
   same MLflow run, without a new alignment;
6. log the coordinator's arrays (pvFed's global encoder, split learning's parts) as the
   run's model with its metadata and register it as ``<experiment>-final``
   (:mod:`app.tracking.vertical_model`).

A required stage some sites leave unanswered within ``round-timeout`` stops the federation
with one line (:func:`app.vertical.messages.timeout_error`): the round, the stage, those
sites, the key to raise and the sizes to lower.

Every stage's replies are taken once by the reply intake (:mod:`app.vertical.messages`): a
stage that needs every site (``describe``, the PSI, split learning's training) stops the
federation with a :class:`~app.vertical.messages.VerticalError` naming a site that refuses
(its policy's ``[vertical]`` rules), fails or replies malformed; pvFed's rounds and split
learning's evaluation go on without it, its reply dropped with the reason logged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid
from flwr.supercore import log

from app.config.run_config import RunConfig
from app.tracking import FederationTracker
from app.tracking.outbox import RoundRecord
from app.tracking.tracker import metric_key
from app.tracking.vertical_model import VerticalModel, log_vertical_model, vertical_metadata
from app.vertical.messages import StageAnswer, StageRequest, Traffic, VerticalError, send_stage
from app.vertical.vertical_checkpoint import (VerticalCheckpoint, open_checkpoint,
                                              resumed_checkpoint)
from strategies.rounds.instructions import wait_for_nodes
from strategies.rounds.site_book import SiteBook
from strategies.wire.registry import Registry
from strategies.wire.vertical_options import VerticalOptions

__all__ = ["VERTICAL_RUNNERS", "VerticalContext", "VerticalOutcome", "VerticalResult",
           "federate_vertical"]


@dataclass
class VerticalResult:
    """What a method's run leaves: each department's final metrics, the coordinator's arrays."""

    site_metrics: dict[str, dict[str, float]]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def _mean_over_sites(site_metrics: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Each metric's mean over the sites that report it."""
    names = sorted({name for values in site_metrics.values() for name in values})
    return {name: float(np.mean([v[name] for v in site_metrics.values() if name in v]))
            for name in names}


@dataclass
class VerticalContext:
    """What a vertical method's coordinator uses: the sites, the settings, messages, tracking."""

    grid: Grid
    #: The sites, in a fixed order (ascending node id).
    nodes: list[int]
    config: RunConfig
    options: VerticalOptions
    federation: str
    tracker: FederationTracker | None = None
    #: Node id -> its department (the sites' ``describe`` answers).
    departments: dict[int, str] = field(default_factory=dict)
    traffic: Traffic = field(default_factory=Traffic)
    #: The names the sites' replies declared, bound to their nodes (the intake's check).
    book: SiteBook = field(default_factory=SiteBook)
    #: Where the rounds are checkpointed, and what a resume continues from.
    checkpoint: VerticalCheckpoint | None = None
    #: Patients shared by every site (the PSI's; 0 before it or without one).
    intersection: int = 0

    @property
    def first_round(self) -> int:
        """The first round to run (after the resumed checkpoint's, else 1)."""
        return 1 if self.checkpoint is None else self.checkpoint.first_round

    def resumed_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """The resumed checkpoint's coordinator arrays and method state (empty: fresh)."""
        if self.checkpoint is None:
            return {}, {}
        return self.checkpoint.arrays(), self.checkpoint.state()

    def save_round(self, server_round: int, arrays: Mapping[str, np.ndarray],
                   state: dict, site_metrics: Mapping[str, Mapping[str, float]]) -> None:
        """Checkpoint round ``server_round`` (after its metrics were queued for MLflow):
        the coordinator's ``arrays``, the method's ``state``, the sites' metrics."""
        if self.checkpoint is not None:
            self.checkpoint.save(server_round, dict(arrays), {
                **state, "site-metrics": {k: dict(v) for k, v in site_metrics.items()},
                "intersection": self.intersection})

    @property
    def seed(self) -> int:
        """The run seed (``seed``)."""
        return self.config.seed

    def send(self, stage: str, requests: Mapping[int, StageRequest], server_round: int,
             required: bool = True) -> dict[int, StageAnswer]:
        """One stage to the nodes of ``requests``: each usable answer, by node
        (:func:`app.vertical.messages.send_stage`; ``required``: raise unless every site's
        came)."""
        return send_stage(self.grid, stage, requests, federation=self.federation,
                          server_round=server_round, timeout=self.config.round_timeout,
                          traffic=self.traffic, names=self.departments, book=self.book,
                          required=required)

    def department(self, node: int) -> str:
        """The department of site ``node`` (its ``describe`` answer; ``node-<id>`` before it)."""
        return self.departments.get(node, f"node-{node}")

    def log_sites(self, step: int, site_metrics: Mapping[str, Mapping[str, float]],
                  extra: Mapping[str, float] | None = None) -> None:
        """:meth:`log` round ``step``: each department's metrics, their mean over the sites
        that report them, and ``extra`` (the coordinator's own)."""
        metrics = dict(extra or {})
        for department, values in site_metrics.items():
            metrics.update({f"{department}/{name}": value for name, value in values.items()})
        metrics.update(_mean_over_sites(site_metrics))
        self.log(step, metrics)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Queue ``metrics`` of round ``step`` for MLflow (``<department>/<metric>`` per site,
        else the federation's), with the traffic so far; never waits for MLflow."""
        values: dict[str, float] = {}
        for name, value in metrics.items():
            department, _, metric = name.rpartition("/")
            key = metric_key("site", department, metric) if department else metric_key(
                "vertical", metric)
            values[key] = float(value)
        values.update({"traffic/downlink-bytes": float(self.traffic.downlink_bytes),
                       "traffic/uplink-bytes": float(self.traffic.uplink_bytes),
                       "round-seconds": 0.0})
        if self.tracker is not None:
            self.tracker.queue(RoundRecord(step, int(time.time() * 1000), values))
            self.tracker.flush()
        log(INFO, "Vertical round %d: %s", step, ", ".join(
            f"{k} {v:.4f}" for k, v in sorted(metrics.items())))


Runner = Callable[[VerticalContext], VerticalResult]
#: Each vertical method's coordinator, ``"module:function"`` imported on use.
VERTICAL_RUNNERS: Registry[Runner] = Registry("vertical method", "vertical.method")
VERTICAL_RUNNERS.add_path("pvfed", "app.vertical.pvfed_flow:run_pvfed")
VERTICAL_RUNNERS.add_path("splitnn", "app.vertical.split_flow:run_split")
VERTICAL_RUNNERS.add_path("splitnn-u", "app.vertical.split_flow:run_split")


@dataclass(frozen=True)
class VerticalOutcome:
    """What a vertical federation left behind, for callers that run the ServerApp in process."""

    mlflow_run_id: str
    result: VerticalResult
    traffic: Traffic
    seconds: float
    #: Patients shared by every site (PSI; 0: no alignment, split learning).
    intersection: int = 0
    departments: dict[int, str] = field(default_factory=dict)
    #: The logged and registered model (``None``: the method left no arrays).
    model: VerticalModel | None = None


def federate_vertical(grid: Grid, context: Context) -> VerticalOutcome:
    """Run the vertical federation described by the run config (see the module docstring)."""
    from app.vertical.psi_flow import align  # noqa: PLC0415 - pvFed's PSI, imported on use

    config = RunConfig.from_mapping(context.run_config)
    options = config.vertical_options
    tracker = FederationTracker(config.task, config.tracking_uri, config.artifact_root,
                                config.experiment)
    checkpoint = resumed_checkpoint(config, tracker, str(context.run_id))
    if checkpoint is None:
        checkpoint = open_checkpoint(config, tracker, tracker.start(
            run_name=f"vertical-{options.method}-{time.strftime('%Y%m%d-%H%M%S')}",
            params=config.as_params(),
            tags={"flwr.run-id": str(context.run_id), "task": config.task,
                  "federation.kind": "vertical", "vertical.method": options.method}))
    else:
        log(INFO, "Resuming the vertical federation after round %d from %s",
            checkpoint.first_round - 1, checkpoint.path)
    run_id = checkpoint.run_id
    started, status = time.monotonic(), "FAILED"
    try:
        nodes = wait_for_nodes(grid, config.min_nodes, config.node_wait_timeout)
        ctx = VerticalContext(grid, nodes, config, options, run_id, tracker,
                              checkpoint=checkpoint)
        described = ctx.send("describe", {node: ({}, {}) for node in nodes}, 0)
        ctx.departments = {node: described[node].info.get("department", ctx.department(node))
                           for node in nodes}
        if len(set(ctx.departments.values())) != len(nodes):  # names key the metrics
            ctx.departments = {node: f"{name}-{node}" for node, name in ctx.departments.items()}
        log(INFO, "Vertical federation (%s) over %s", options.method,
            ", ".join(ctx.departments[n] for n in nodes))
        if checkpoint.resumed is not None:  # the sites keep the alignment of this federation
            ctx.intersection = int(checkpoint.state().get("intersection", 0))
        elif options.needs_alignment:
            ctx.intersection = align(ctx)
            if ctx.intersection:
                ctx.log(0, {"psi-size": ctx.intersection})
        result = VERTICAL_RUNNERS.get(options.method)(ctx)
        ctx.log_sites(config.num_server_rounds + 1, {
            department: {f"final-{name}": value for name, value in values.items()}
            for department, values in result.site_metrics.items()})
        model = _logged_model(tracker, checkpoint, result, vertical_metadata(
            config.task, options.method, config.num_server_rounds,
            [ctx.departments[n] for n in nodes], result.arrays, config.task_settings(),
            ctx.intersection))
        status = "FINISHED"
    except VerticalError as exc:  # one line that says what to do, before Flower's traceback
        log(ERROR, "%s", exc)
        raise
    finally:
        tracker.flush()
        tracker.finish(status)
    seconds = time.monotonic() - started
    log(INFO, "Vertical federation finished in %.1f s: %d messages, %.2f MB down, %.2f MB up",
        seconds, ctx.traffic.messages, ctx.traffic.downlink_bytes / 1e6,
        ctx.traffic.uplink_bytes / 1e6)
    return VerticalOutcome(tracker.run_id, result, ctx.traffic, seconds, ctx.intersection,
                           ctx.departments, model)


def _logged_model(tracker: FederationTracker, checkpoint: VerticalCheckpoint,
                  result: VerticalResult, metadata: dict) -> VerticalModel | None:
    """Log and register the coordinator's arrays in the federation's MLflow run, once MLflow
    has every round; ``None`` (a warning: the arrays stay in the checkpoint) when MLflow
    does not answer, as a round never waits for tracking."""
    if not result.arrays:
        return None
    kept = checkpoint.path or "memory only (no checkpoint-dir)"
    if not tracker.flush() or not tracker.run_id:
        log(WARNING, "The vertical model is not logged: MLflow does not have the run yet; "
            "its arrays are in %s", kept)
        return None
    try:
        model = log_vertical_model(tracker.run_id, tracker.experiment_name, result.arrays,
                                   metadata)
    except Exception as exc:  # noqa: BLE001 - tracking must never fail the federation
        log(WARNING, "The vertical model is not logged (MLflow: %s); its arrays are in %s",
            type(exc).__name__, kept)
        return None
    log(INFO, "Vertical model: %s, registered %s", model.uri,
        model.version or "(not registered)")
    return model
