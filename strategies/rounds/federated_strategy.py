"""The product's Flower strategy: one class composed of plug-ins.

Built on :class:`flwr.serverapp.strategy.Strategy` (Message API) and composed of

* an **aggregator** (``fedavg`` | ``fednova``, :mod:`strategies.plugins`),
* a **local-steps schedule** (``fixed`` | ``adacomm``) that sets tau per round,
* a **compression-rate schedule** (``fixed`` | ``adaptive``): the uplink codec's kept fraction,
* a **client selector** (``uniform``), a **round policy** (deadline and quorum),
* a **server optimizer** (``sgd`` | ``avgm`` | ``adagrad`` | ``adam`` | ``yogi``),
* **secure aggregation** (``none`` | ``secagg+``): with SecAgg+ the train half of a round is
  :class:`~strategies.rounds.secure_train.SecureTrain`'s five exchanges and the coordinator learns
  only the sum of the sites' updates,

each chosen by name from the run config (:mod:`strategies.wire.registry`), and the run's active
**round features** (:mod:`strategies.rounds.round_feature`: what a run adds to each round's
instructions, replies, new model and checkpoint), which the loop calls without naming one.
Unlike FedAvg it

* waits a bounded time for sites to connect (:func:`wait_for_nodes`), not forever;
* sends every site its own fresh ``RecordDict`` and ``ConfigRecord`` (Flower's FedAvg shares one
  content object between all train messages);
* receives *updates* ``delta_i = x_global - x_local_i``, applies ``x <- x - Delta``;
* validates every reply on its own and drops a malformed one or a straggler, with a logged reason;
* folds each reply's update into the aggregate as it arrives (linear aggregators), or holds the
  round's updates within ``round.max-held-mb`` (robust rules);
* keeps a trust boundary (:class:`SiteBook`): a site name is bound to the node that first sent it,
  a site's ``num-examples`` capped at its first declaration and at a coordinator's roster;
* drops a reply the aggregator rejects, and keeps the old model when the new one would not be
  finite (:mod:`strategies.rounds.update_stream`, ``RoundReport.aggregation_failed``);
* records a :class:`RoundReport` per round for an observer (the ServerApp: MLflow).

The class is the loop only: each round is two exchanges (:func:`exchange` takes every reply
into the stage's :class:`ReplyIntake` once), train then evaluate. The train half is
:class:`TrainStage` (:mod:`strategies.rounds.train_stage`: the train plug-ins, instructions,
update stream, aggregation); the other collaborators are in :mod:`strategies.rounds`."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore import log

from strategies.compression import check_warmup
from strategies.wire.errors import FederationError
from strategies.wire.local_solver import LocalSolver
from strategies.plugins.protocols import (Aggregator, CodecRate, Schedule, SecureAggregation,
                                          Selector, ServerOptimizer)
from strategies.plugins.schedules.codec_rate import FixedCodecRate
from strategies.rounds.instructions import (Exchanged, Uplink, evaluate_messages, exchange,
                                            wait_for_nodes)
from strategies.rounds.reply_intake import (Cap, MetricsReply, ReplyIntake, Taken,
                                            parse_metrics_reply)
from strategies.rounds.round_feature import RoundFeature
from strategies.rounds.round_metrics import SelectionContext, example_weighted_metrics
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.round_report import RoundReport
from strategies.rounds.secure_train import SecureTrain
from strategies.rounds.site_book import DEFAULT_MAX_SIZE_RATIO, SiteBook
from strategies.rounds.train_stage import NoValidRepliesError, TrainStage
from strategies.rounds.update_stream import DEFAULT_MAX_HELD_MB

__all__ = ["FederatedStrategy", "NoValidRepliesError", "SelectionContext"]

#: Called after each round with its report and the new global arrays; a true return
#: value stops the federation after this round (early stopping).
RoundObserver = Callable[[RoundReport, ArrayRecord], bool | None]


class FederatedStrategy(Strategy):
    """Plug-in composed strategy with bounded waits and per-reply validation.

    Parameters
    ----------
    aggregator : Aggregator
        The aggregator behind its defence (:mod:`strategies.plugins.protocols`); a linear one
        (``needs_all_updates = False``) streams.
    schedule : Schedule
        The local-steps schedule: ``tau`` next round, ``observe(replies) -> info``.
    selector : Selector
        ``select(server_round, node_ids, SelectionContext) -> node_ids``.
    policy : RoundPolicy
        Deadline, quorum and hard timeout of each round.
    min_nodes : int
        Sites connected before a round starts (how many train: the selector's choice).
    fraction_evaluate : float
        Fraction of connected sites asked to evaluate, rounded up (0 disables); below 1, a fresh
        sample each round, seeded by ``seed`` and the round.
    node_wait_timeout : float
        Seconds to wait for ``min_nodes`` sites before failing.
    time_budget : float
        Per-round wall-clock budget sent to sites (0 = none); they report the steps done.
    codec : str
        Update codec spec for the uplink (:mod:`strategies.compression`).
    codec_warmup_rounds : int
        Rounds over which the uplink codec's kept fraction warms up
        (:mod:`strategies.wire.codecs.warmup`; 0: none).
    codec_rate : CodecRate, optional
        Compression-rate schedule (:mod:`strategies.plugins.schedules.codec_rate`):
        ``rate_for(spec)`` (the round's kept fraction, None: the codec's) and ``observe(rate, site
        rounds) -> info``; default ``fixed``.
    error_feedback : bool
        Whether sites keep an error-feedback residual for lossy codecs.
    federation : str
        Id of the federation (MLflow run id); sites key their residuals by it.
    seed : int
        Base of the per-round, per-site codec seeds (``randk``, ``qsgd``).
    max_empty_rounds : int
        Abort after this many consecutive rounds without one usable reply.
    local_solver : LocalSolver, optional
        The sites' local optimiser settings; the server computes each reply's FedNova a-norm from
        its reported steps with it (default: plain steps).
    roster : dict[str, int], optional
        The coordinator's ``{site name: max-examples}`` (:mod:`app.config.roster`): only these
        sites may reply, each capped at its ``max-examples``.
    max_size_ratio : float
        Run config ``federation.max-size-ratio``: without a roster, a site's size is at most this
        times the median of the others' (0: off; :meth:`SiteBook.relative_cap`).
    max_held_mb : float
        Run config ``round.max-held-mb`` (:mod:`strategies.rounds.update_stream`).
    secure_aggregation : SecureAggregation, optional
        ``strategy.secure-aggregation``: with settings (``secagg+``) each train half of a round is
        a SecAgg+ round (:class:`SecureTrain`); default none (the plain round).
    features : Sequence[RoundFeature]
        The run's active round features (:func:`strategies.rounds.active_features.
        active_features`), each checkpointed under its own keys; none by default.
    server_opt : ServerOptimizer, optional
        ``strategy.server-opt`` (:class:`TrainStage`; default ``sgd``); checkpointed.
    """

    def __init__(
        self,
        *,
        aggregator: Aggregator,
        schedule: Schedule,
        selector: Selector,
        policy: RoundPolicy | None = None,
        min_nodes: int = 2,
        fraction_evaluate: float = 1.0,
        node_wait_timeout: float = 120.0,
        time_budget: float = 0.0,
        codec: str = "none",
        codec_warmup_rounds: int = 0,
        codec_rate: CodecRate | None = None,
        error_feedback: bool = True,
        federation: str = "",
        seed: int = 0,
        max_empty_rounds: int = 3,
        local_solver: LocalSolver | None = None,
        roster: dict[str, int] | None = None,
        max_held_mb: float = DEFAULT_MAX_HELD_MB,
        max_size_ratio: float = DEFAULT_MAX_SIZE_RATIO,
        secure_aggregation: SecureAggregation | None = None,
        features: Sequence[RoundFeature] = (),
        server_opt: ServerOptimizer | None = None,
    ) -> None:
        if min_nodes < 1:
            raise ValueError(f"min_nodes must be >= 1, got {min_nodes}")
        if not 0.0 <= fraction_evaluate <= 1.0:
            raise ValueError(f"fraction_evaluate must be in [0, 1], got {fraction_evaluate}")
        self.policy = policy or RoundPolicy()
        self.min_nodes = min_nodes
        self.fraction_evaluate = fraction_evaluate
        self.seed = seed
        self.node_wait_timeout = node_wait_timeout
        self.uplink = Uplink(codec=str(check_warmup(codec, codec_warmup_rounds)),
                             error_feedback=error_feedback, federation=federation,
                             time_budget=time_budget, seed=seed,
                             codec_warmup_rounds=codec_warmup_rounds)
        self.local_solver = local_solver or LocalSolver()
        self.sites = SiteBook(roster=None if roster is None else dict(roster),
                              max_size_ratio=max_size_ratio)
        self.reports: dict[int, RoundReport] = {}
        self._late_ids: dict[str, int] = {}
        self.train = TrainStage(
            aggregator=aggregator, schedule=schedule, selector=selector,
            codec_rate=codec_rate or FixedCodecRate(), sites=self.sites, policy=self.policy,
            uplink=self.uplink, local_solver=self.local_solver,
            max_empty_rounds=max_empty_rounds, max_held_mb=max_held_mb, features=features,
            server_opt=server_opt)
        settings = secure_aggregation.settings if secure_aggregation is not None else None
        self.secure = None if settings is None else SecureTrain(settings, self.train)
        self._evaluate_intake: ReplyIntake[MetricsReply] = self._intake_of({})

    #: The train plug-ins, owned by the train stage (:class:`TrainStage`), read here.
    aggregator = property(lambda self: self.train.aggregator)
    schedule = property(lambda self: self.train.schedule)
    selector = property(lambda self: self.train.selector)
    codec_rate = property(lambda self: self.train.codec_rate)

    def _report(self, server_round: int) -> RoundReport:
        return self.reports.setdefault(server_round, RoundReport(server_round))

    def _intake_of(self, expected: dict[int, str]) -> ReplyIntake[MetricsReply]:
        """An evaluate exchange's intake: metrics replies capped at the evaluate cap."""
        return ReplyIntake("aggregate_evaluate", self.sites, parse_metrics_reply, expected,
                           Cap.EVALUATE)

    def summary(self) -> None:
        """Log the strategy's configuration."""
        log(INFO, "\t├──> Aggregator: %s | schedule: %s (tau %d) | selector: %s",
            type(self.aggregator).__name__, type(self.schedule).__name__,
            self.schedule.tau, type(self.selector).__name__)
        log(INFO, "\t├──> Round policy: deadline %.0f s, quorum %s, timeout %.0f s",
            self.policy.deadline, self.policy.quorum or "all", self.policy.timeout)
        log(INFO, "\t└──> Sites: min %d; wait for them at most %.0f s",
            self.min_nodes, self.node_wait_timeout)

    def _connected(self, grid: Grid) -> list[int]:
        """The connected sites, once ``min_nodes`` are (bounded wait); the site book told."""
        nodes = wait_for_nodes(grid, self.min_nodes, self.node_wait_timeout)
        self.sites.connected = set(nodes)
        return nodes

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Select sites and send each its own instruction with this round's tau and codec.

        Raises
        ------
        FederationError
            Under secure aggregation: its round is five exchanges (:meth:`start`), and one
            plain exchange would collect each site's update in the clear.
        """
        if self.secure is not None:
            raise FederationError(
                "run config 'strategy.secure-aggregation' = 'secagg+': a train round is four "
                "exchanges, run by FederatedStrategy.start; a single train exchange would "
                "send each site's update in the clear")
        nodes = self._connected(grid)
        return self.train.configure(server_round, arrays, config, grid, nodes,
                                    self._report(server_round))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate ``replies`` handed over at once (Flower's contract; :meth:`start` takes
        them in one by one during the exchange), see :meth:`TrainStage.aggregate`."""
        return self.train.aggregate(self._report(server_round),
                                    self.train.intake.take_all(replies))

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask sites to evaluate the new global model on their validation data."""
        if self.fraction_evaluate == 0.0:
            self._evaluate_intake = self._intake_of({})
            return []
        nodes = self._connected(grid)
        count = min(len(nodes), math.ceil(self.fraction_evaluate * len(nodes)))
        if count < len(nodes):  # a fresh sample each round (seeded): every site gets its turn
            rng = np.random.default_rng([self.seed, server_round])
            nodes = sorted(int(n) for n in rng.choice(sorted(nodes), size=count, replace=False))
        self._evaluate_intake = self._intake_of({n: self.sites.label(n) for n in nodes})
        return evaluate_messages(nodes, self.train.outgoing(arrays), config, server_round,
                                 self.uplink.evaluate_settings, self.train.features)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Example-weighted mean of the sites' validation metrics (Flower's contract)."""
        return self._evaluated(self._report(server_round),
                               self._evaluate_intake.take_all(replies))

    def _evaluated(self, report: RoundReport,
                   taken: Taken[MetricsReply]) -> MetricRecord | None:
        """The evaluate replies ``taken`` into ``report``; their example-weighted mean."""
        accepted = taken.accepted
        report.evaluate_dropped.update(taken.dropped)
        report.policies.update(taken.policies)
        report.evaluate_withheld.update(taken.withheld)
        for reply in accepted:
            report.evaluate[reply.site] = dict(reply.metrics)
        if not accepted:
            return None
        report.evaluate_aggregate = example_weighted_metrics(accepted)
        return MetricRecord({k: float(v) for k, v in report.evaluate_aggregate.items()})

    def snapshot(self) -> dict:
        """The strategy's state to checkpoint (plug-ins and what it learnt of the sites);
        an adaptive compression rate's state under ``codec-rate`` (a fixed one has none,
        so checkpoints without it keep their layout), the server optimizer under
        ``server-opt``, each active feature's state under its own keys
        (:meth:`~strategies.rounds.round_feature.RoundFeature.snapshot`)."""
        train = self.train
        rate = {"codec-rate": train.codec_rate} if train.codec_rate.active else {}
        return {"aggregator": train.aggregator, "schedule": train.schedule,
                "selector": train.selector, "server-opt": train.server_opt, **rate,
                **{key: value for feature in train.features
                   for key, value in feature.snapshot().items()},
                **self.sites.snapshot()}

    def restore(self, state: dict) -> None:
        """Continue from a :meth:`snapshot`."""
        train = self.train
        train.aggregator, train.schedule = state["aggregator"], state["schedule"]
        train.selector = state["selector"]
        train.server_opt = state.get("server-opt", train.server_opt)  # older checkpoints: sgd
        train.codec_rate = state.get("codec-rate", train.codec_rate)
        for feature in train.features:
            feature.restore(state)
        self.sites = train.sites = SiteBook.restore(state, self.sites.roster,
                                                      self.sites.max_size_ratio)

    def _record(self, report: RoundReport, stage: str, exchanged: Exchanged) -> Taken:
        """An exchange's late arrivals, no-shows and reply seconds into ``report``."""
        for name in exchanged.late:
            report.late_arrivals.append(name)
            log(WARNING, "%s: late reply from %s (an earlier round) dropped", stage, name)
        report.missing[stage] = len(exchanged.missing)
        for name, seconds in exchanged.reply_seconds.items():
            report.reply_seconds.setdefault(name, {})[f"{stage}-reply-seconds"] = seconds
        return exchanged.taken

    def _train_round(self, grid: Grid, server_round: int, arrays: ArrayRecord,
                     config: ConfigRecord, report: RoundReport
                     ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The train half of a round: one exchange, or a SecAgg+ round's four."""
        if self.secure is None:
            messages = self.configure_train(server_round, arrays, config, grid)
            taken = self._record(report, "train", exchange(
                grid, messages, self.policy, self.train.intake, self._late_ids))
            return self.train.aggregate(report, taken)
        nodes = self._connected(grid)
        return self.secure.run(grid, server_round, arrays, config, nodes, report,
                               self._late_ids, self._record)

    # pylint: disable=too-many-arguments
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        on_round_end: RoundObserver | None = None,
        first_round: int = 1,
    ) -> Result:
        """Run rounds ``first_round .. num_rounds`` under the round policy.

        Same contract as :meth:`Strategy.start` (``timeout`` is ignored: the
        :class:`RoundPolicy` bounds every wait), plus ``on_round_end``, called
        with the round's :class:`RoundReport` and the new global arrays after
        each round (when it returns true, no further round runs: early stopping),
        and ``first_round`` (> 1 when resuming from a checkpoint).
        """
        log(INFO, "Starting %s strategy:", type(self).__name__)
        self.summary()
        train_config = train_config or ConfigRecord()
        evaluate_config = evaluate_config or ConfigRecord()
        result = Result()
        arrays = initial_arrays
        for server_round in range(first_round, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %d/%d]", server_round, num_rounds)
            started = time.monotonic()
            report = self._report(server_round)
            new_arrays, train_metrics = self._train_round(grid, server_round, arrays,
                                                          train_config, report)
            if new_arrays is not None:
                arrays = result.arrays = new_arrays
            if train_metrics is not None:
                result.train_metrics_clientapp[server_round] = train_metrics
            messages = self.configure_evaluate(server_round, arrays, evaluate_config, grid)
            eval_metrics = self._evaluated(report, self._record(report, "evaluate", exchange(
                grid, messages, self.policy, self._evaluate_intake, self._late_ids)))
            if eval_metrics is not None:
                result.evaluate_metrics_clientapp[server_round] = eval_metrics
            if evaluate_fn is not None:
                central = evaluate_fn(server_round, arrays)
                if central is not None:
                    result.evaluate_metrics_serverapp[server_round] = central
            report.seconds = time.monotonic() - started
            if on_round_end is not None and on_round_end(report, arrays):
                log(INFO, "Stopping after round %d of %d: the round observer asked to "
                    "(early stopping)", server_round, num_rounds)
                break
        result.arrays = arrays
        return result
