"""ServerApp: the coordinating site's side of a federation.

Builds the initial global model (random, or from run config ``initial-model``),
runs :class:`FederatedStrategy` for the configured rounds, logs every round to
MLflow through
:class:`app.tracking.FederationTracker`, keeps the best round
(:class:`app.tracking.BestRound`, on the same round's ``val-<main metric>``;
optional early stopping), prints progress and a final summary, has the sites test the
selected model and builds the cross-site matrix
(:func:`app.cross_site_report.report_federation_end`), and stores the best and the final
global model in MLflow and its Model Registry (:mod:`app.tracking.run_end`: written to the
federation's checkpoint folder first, sent within run config ``tracking.end-wait-s``; an
MLflow outage at the end leaves them there for ``make tracking-flush``, never fails the
federation).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path

import torch
from flwr.app import Array, ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log
from torch import nn

from app.config.roster import load_roster
from app.config.run_config import RunConfig
from app.cross_site_report import report_federation_end, selected_arrays
from app.model_source import load_state_dict_from
from clients.training.personalisation.site_personalisation import require_local_layers
from app.grid_waits import cap_grid_waits
from app.round_progress import metric_text, progress_line
from app.tracking import (
    BestRound,
    FederationModels,
    FederationTracker,
    RoundScore,
)
from app.tracking.best_round import score_rule
from app.tracking.tracker import require_aggregation, round_aggregated
from app.tracking.run_end import RunEnd, finish_run, flush_command
from app.vertical.federation import VerticalOutcome, federate_vertical
from clients.registry import task_class
from clients.training.pruning import model_structure
from strategies.rounds.cross_site import CrossSiteResult
from strategies.wire import message_keys as keys
from strategies.rounds.checkpoint import (
    CHECKPOINT_FILE,
    ServerCheckpoint,
    find_checkpoint,
    load_checkpoint,
    run_folder,
    save_checkpoint,
)
from strategies.rounds.update_stream import with_defence
from strategies.plugins.pruning.pruning_round import PruningRound
from strategies.rounds.active_features import active_features
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.wire.local_solver import LocalSolver
from strategies.plugins.registries import (
    AGGREGATORS,
    CODEC_RATES,
    CONTROL_VARIATES,
    DEFENCES,
    PRUNINGS,
    SCHEDULES,
    SECURE_AGGREGATION,
    SELECTORS,
    SERVER_OPTIMIZERS,
    build,
)
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.round_report import RoundReport
from strategies.rounds.site_coverage import SiteCoverage, check_setting, site_coverage

app = ServerApp()


def build_strategy(config: RunConfig, federation: str = "",
                   roster: dict[str, int] | None = None) -> FederatedStrategy:
    """Compose the strategy from the plug-ins named in the run config.

    Each plug-in is built by its registry from its own run-config section and the
    run settings (:func:`strategies.plugins.registries.build`); ``federation`` (the
    MLflow run id) keys the sites' persistent state. ``roster`` is the
    coordinator's site roster; when omitted, the file named by run config
    ``federation.roster`` is read (:func:`app.config.roster.load_roster`; none
    when it is ``""``).
    """
    if roster is None and config.federation_roster:
        roster = load_roster(config.federation_roster)
    sections, settings = config.plugin_options, config.run_settings()
    aggregator = with_defence(build(DEFENCES, config.strategy_defence, sections, settings),
                              build(AGGREGATORS, config.strategy_aggregator, sections, settings))
    return FederatedStrategy(
        aggregator=aggregator,
        schedule=build(SCHEDULES, config.strategy_schedule, sections, settings),
        selector=build(SELECTORS, config.strategy_selector, sections, settings),
        policy=RoundPolicy(deadline=config.round_deadline, quorum=config.round_quorum,
                           timeout=config.round_timeout),
        min_nodes=config.min_nodes,
        fraction_evaluate=config.fraction_evaluate,
        node_wait_timeout=config.node_wait_timeout,
        time_budget=config.time_budget,
        codec=config.strategy_codec,
        codec_warmup_rounds=config.strategy_codec_warmup_rounds,
        codec_rate=build(CODEC_RATES, config.strategy_codec_rate, sections, settings),
        error_feedback=config.strategy_error_feedback,
        federation=federation,
        seed=config.seed,
        local_solver=LocalSolver(optimizer=config.optimizer, momentum=config.momentum,
                                 lr=config.lr, proximal_mu=config.proximal_mu),
        roster=roster,
        max_held_mb=config.round_max_held_mb,
        max_size_ratio=config.federation_max_size_ratio,
        secure_aggregation=build(SECURE_AGGREGATION, config.strategy_secure_aggregation,
                                 sections, settings),
        features=active_features(
            aggregator=aggregator, seed=config.seed,
            downlink_codec=config.strategy_downlink_codec,
            pruning=build(PRUNINGS, config.strategy_pruning, sections, settings),
            control_variates=build(CONTROL_VARIATES, config.strategy_control_variates,
                                   sections, settings)),
        server_opt=build(SERVER_OPTIMIZERS, config.strategy_server_opt, sections, settings),
    )


def initial_arrays(model: nn.Module, source: str) -> ArrayRecord:
    """The first global model: ``model``'s weights, or with ``source`` (run config
    ``initial-model``) the weights read from it, checked against ``model``
    (:func:`app.model_source.load_state_dict_from`); ``model`` then holds them."""
    if source:
        model.load_state_dict(load_state_dict_from(source, model))
        log(INFO, "Initial model: %s", source)
    return ArrayRecord(model.state_dict())


def prune_initial(strategy: FederatedStrategy, arrays: ArrayRecord, model: nn.Module,
                  task: type, config: RunConfig) -> ArrayRecord:
    """The first global model under ``strategy.pruning``: the plug-in's initial magnitude
    pruning over the model's prunable structure (:func:`clients.training.pruning.model_structure`,
    torch-pruning's dependency groups in structured mode), pruned weights zeroed; a resumed run
    keeps its checkpointed mask. ``arrays`` unchanged without pruning."""
    pruning = strategy.train.feature(PruningRound)
    if pruning is None:
        return arrays
    example = torch.as_tensor(task.example_input(config.task_settings()))
    structure = model_structure(model, pruning.pruning.mode, example)
    pruned, info = pruning.start(arrays, structure)
    log(INFO, "Pruning (%s, %d groups): %s", pruning.pruning.mode, len(structure["groups"]),
        ", ".join(f"{k} {v:g}" for k, v in info.items()))
    return pruned


class RoundRecorder:
    """The ServerApp's round observer: score the round, queue it for MLflow, checkpoint, send.

    The round's record reaches the tracker's outbox (on disk) before the
    checkpoint and is sent to MLflow only after it: a crash between the two
    repeats a round whose step MLflow does not have yet (the resume drops the
    outbox records past the checkpoint), and an MLflow outage never holds up a
    round (:meth:`FederationTracker.flush` does not raise or retry).

    With ``best`` it scores each round (the checkpoint keeps the best round so
    far) and returns true, which stops the federation, when early stopping says so.
    ``aggregated_rounds`` counts the rounds that updated the global model, from the
    checkpoint's count on a resume (``None``: an older checkpoint that did not count).
    """

    def __init__(self, tracker: FederationTracker, strategy: FederatedStrategy,
                 checkpoint_path: Path | None, run_config: dict, progress,
                 best: BestRound | None = None, aggregated_rounds: int | None = 0) -> None:
        self.tracker, self.strategy = tracker, strategy
        self.checkpoint_path, self.run_config = checkpoint_path, run_config
        self.progress, self.best = progress, best
        self.aggregated_rounds = aggregated_rounds

    def __call__(self, report: RoundReport, arrays: ArrayRecord) -> bool:
        keys_, values = list(arrays.keys()), arrays.to_numpy_ndarrays()
        improved = self.best is not None and self.best.observe(
            report.server_round, report.evaluate_aggregate, report.evaluate, keys_, values)
        if self.aggregated_rounds is not None and round_aggregated(report):
            self.aggregated_rounds += 1
        self.tracker.record(report)
        if self.checkpoint_path is not None:
            save_checkpoint(self.checkpoint_path, ServerCheckpoint(
                server_round=report.server_round, keys=keys_, arrays=values,
                strategy=self.strategy.snapshot(), mlflow_run_id=self.tracker.federation,
                run_config=self.run_config, best={} if self.best is None else self.best.state(),
                aggregated_rounds=self.aggregated_rounds))
        self.tracker.flush()
        log(INFO, "%s", self.progress(report))
        if improved:
            log(INFO, "%s", self.best.line())
        return self.best is not None and self.best.exhausted


@dataclass(frozen=True)
class FederationOutcome:
    """What a federation left behind, for callers that run the ServerApp in process.

    Attributes
    ----------
    mlflow_run_id : str
        The federation's MLflow run (its params, metrics, models and artefacts; ``""``
        when MLflow never answered, the run then waits in the checkpoint folder).
    arrays : ArrayRecord
        The final global model.
    reports : dict[int, RoundReport]
        Every round's report, by server round (resumed rounds included).
    best_round : int
        The round whose model was selected (0: no round was evaluated).
    models : FederationModels
        The logged models' URIs and registry versions.
    cross_site : CrossSiteResult or None
        The held-out test and cross-site matrix (``None``: final evaluation off or no site).
    coverage : SiteCoverage
        The sites behind the final and the best model (a partial run: fewer than required).
    """

    mlflow_run_id: str
    arrays: ArrayRecord
    reports: dict[int, RoundReport]
    best_round: int
    models: FederationModels
    cross_site: CrossSiteResult | None
    coverage: SiteCoverage


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp's entry point: :func:`federate` on Flower's grid."""
    federate(grid, context)


def federate(grid: Grid, context: Context) -> FederationOutcome | VerticalOutcome:
    """Run (or, with ``resume``, continue) the federation described by the run config.

    A vertical federation (``federation.kind = "vertical"``) is run by
    :func:`app.vertical.federation.federate_vertical` and returns its outcome.

    Each federation checkpoints into its own folder ``<checkpoint-dir>/<MLflow
    run id>/`` (:func:`strategies.rounds.checkpoint.run_folder`); ``resume``
    continues the newest one made with the same run config. ``grid`` is Flower's
    (``flwr run``) or the in-process engine's (:mod:`app.engine`).
    """
    cap_grid_waits()  # a reply's arrays are read within 0.25 s of their upload, not 1-4 s
    config = RunConfig.from_mapping(context.run_config)
    if config.federation_kind == "vertical":  # pvFed or split learning: app/vertical/
        return federate_vertical(grid, context)
    roster = load_roster(config.federation_roster) if config.federation_roster else None
    check_setting(config.federation_min_contributing_sites, roster)
    run_config = config.as_params()
    torch.manual_seed(config.seed)
    task = task_class(config.task)
    model = task.model_for_run(config.task_settings(), private=config.dp_noise_multiplier > 0)
    require_local_layers(config.personalisation, model, config.task)  # FedBN: before round 1
    defaults = RunConfig().as_params()  # keys an older checkpoint lacks keep these
    checkpoint_path = (find_checkpoint(Path(config.checkpoint_dir), run_config, defaults)
                       if config.resume else None)
    tracker = FederationTracker(config.task, config.tracking_uri, config.artifact_root,
                                config.experiment)
    resuming = checkpoint_path is not None  # a resume starts from its checkpoint's model
    first_round, initial = 1, initial_arrays(model, "" if resuming else config.initial_model)
    metric = f"val-{task.main_metric}"
    best = BestRound(metric, config.early_stopping_patience, config.early_stopping_min_delta,
                     score_rule(config.best_round_aggregate))
    aggregated_rounds: int | None = 0  # rounds that updated the model before this process
    if checkpoint_path is not None:
        strategy = build_strategy(config, federation=checkpoint_path.parent.name,
                                  roster=roster)
        checkpoint = load_checkpoint(checkpoint_path, run_config, template=strategy.snapshot(),
                                     defaults=defaults)
        run_id = tracker.resume(checkpoint.mlflow_run_id, checkpoint.server_round,
                                flwr_run_id=str(context.run_id),
                                outbox_dir=checkpoint_path.parent)
        strategy.restore(checkpoint.strategy)
        best.restore(checkpoint.best)
        aggregated_rounds = checkpoint.aggregated_rounds
        initial = ArrayRecord({k: Array(v) for k, v in zip(checkpoint.keys, checkpoint.arrays)})
        first_round = checkpoint.server_round + 1
        log(INFO, "Resuming after round %d from %s", checkpoint.server_round, checkpoint_path)
    else:
        run_id = tracker.start(
            run_name=f"{config.task}-{time.strftime('%Y%m%d-%H%M%S')}",
            params=run_config,
            tags={"flwr.run-id": str(context.run_id), "task": config.task,
                  "selection-metric": metric, "selection-aggregate": best.aggregate},
        )
        strategy = build_strategy(config, federation=run_id, roster=roster)
        if config.checkpoint_dir:
            folder = run_folder(Path(config.checkpoint_dir), run_id)
            tracker.use_outbox(folder)
            checkpoint_path = folder / CHECKPOINT_FILE
    log(INFO, "Federation %s: MLflow run %s in experiment '%s' at %s", run_id,
        tracker.run_id or "(opened when MLflow answers)", tracker.experiment_name,
        tracker.tracking_uri)
    initial = prune_initial(strategy, initial, model, task, config)
    on_round_end = RoundRecorder(
        tracker, strategy, checkpoint_path, run_config,
        lambda report: progress_line(report, config.num_server_rounds, metric), best,
        aggregated_rounds)

    started = time.monotonic()
    status, end = "FAILED", None
    try:
        result = strategy.start(
            grid=grid,
            initial_arrays=initial,
            num_rounds=config.num_server_rounds,
            on_round_end=on_round_end,
            first_round=first_round,
        )
        last_round = max(strategy.reports, default=first_round - 1)
        stopped_early = best.exhausted and last_round < config.num_server_rounds
        tracker.flush()  # the rounds first: the sites' last epsilon tags the registry's versions
        # over the whole federation (a resume's checkpointed rounds are not in its reports);
        # else FederationError: FAILED, nothing logged
        require_aggregation(strategy.reports, aggregated_rounds)
        coverage = site_coverage(strategy.reports, roster,
                                 config.federation_min_contributing_sites,
                                 config.fraction_train, best.round if best.found else 0)
        end = RunEnd.of(  # on disk before MLflow is asked (an outage loses nothing)
            tracker, run_config, _score(strategy, last_round, metric), best,
            (list(result.arrays.keys()), result.arrays.to_numpy_ndarrays()),
            {**({"early-stopped-at-round": str(last_round)} if stopped_early else {}),
             **coverage.tags()},
            None if checkpoint_path is None else checkpoint_path.parent,
            metrics=coverage.metrics(), register_best=coverage.register_best)
        cross_site = report_federation_end(grid, strategy, selected_arrays(best, result.arrays),
                                           tracker, config, task.main_metric)
        status = "FINISHED"
    finally:
        if end is None:
            tracker.finish(status)
        else:  # models, registration, status: within tracking.end-wait-s, else left on disk
            models = finish_run(tracker, end.with_status(status), config.tracking_end_wait_s)
    log(INFO, "")
    log(INFO, "Federation finished in %.1f s", time.monotonic() - started)
    for server_round, report in sorted(strategy.reports.items()):
        log(INFO, "  round %d: %s", server_round, metric_text(report, metric))
    log(WARNING if coverage.partial or not coverage.register_best else INFO, "Sites: %s%s",
        coverage.text(), "" if coverage.register_best else
        f"; the best round {coverage.best_round}'s model is not registered as the best one")
    if stopped_early:
        log(INFO, "Early stopping after round %d: no %s gain of %g in %d evaluated rounds",
            last_round, metric, config.early_stopping_min_delta, config.early_stopping_patience)
    score = (f"{metric} {best.value:.4f}, {best.value_label}; rule {best.aggregate}"
             if best.found else f"no round released {metric}")
    if models.final_uri and not best.found:
        log(INFO, "No best round (%s): no model registered as the best one", score)
    elif models.final_uri:
        log(INFO, "Best round %d (%s): %s, registered %s", models.best_round, score,
            models.best_uri, models.best_version or "(not registered)")
        log(INFO, "Final model: %s, registered %s", models.final_uri,
            models.final_version or "(not registered)")
    else:  # MLflow did not answer within tracking.end-wait-s
        log(WARNING, "Best round %d (%s) and the final model wait on disk for MLflow; send "
            "them with: %s", models.best_round, score,
            flush_command(end.folder, tracker.tracking_uri))
    log(INFO, "MLflow run %s (experiment '%s', store %s)",
        tracker.run_id or f"not opened yet (federation {run_id})", tracker.experiment_name,
        tracker.tracking_uri)
    return FederationOutcome(tracker.run_id, result.arrays, dict(strategy.reports),
                             models.best_round, models, cross_site, coverage)


def _score(strategy: FederatedStrategy, server_round: int, metric: str) -> RoundScore:
    """Round ``server_round``'s evaluation (NaN, no sites: not evaluated in this process)."""
    report = strategy.reports.get(server_round, RoundReport(server_round))
    return RoundScore(server_round, metric, report.evaluate_aggregate.get(metric, float("nan")),
                      sorted(report.evaluate))
