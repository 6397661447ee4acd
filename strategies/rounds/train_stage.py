"""The train stage of a round: instructions out, replies validated, folded and aggregated.

:class:`TrainStage` is the collaborator of
:class:`~strategies.rounds.federated_strategy.FederatedStrategy` that trains:
:meth:`TrainStage.configure` selects the sites and builds their instructions (tau
from the local-steps schedule, the codec of the round with the kept fraction of
the compression-rate schedule, :mod:`strategies.plugins.schedules`) and the
round's :class:`ReplyIntake` (each reply parsed, identity-checked, capped and
folded into the update stream once, as it arrives); :meth:`TrainStage.aggregate`
aggregates what the intake took, settles the new model's normalisation statistics
and counters (:mod:`strategies.rounds.normalisation_statistics`), has the server
optimizer turn the update into the model's step, records the round's traffic and
lets both schedules observe it. It owns the train plug-ins (aggregator, schedules,
selector, server optimizer) and the round's train state (plan, bytes sent, the model
the updates apply to).

What is off is not entered: a compression-rate schedule that is not ``active``
(``fixed``) is neither asked for a rate nor told the round; a server optimizer that is
not ``active`` (``sgd`` at ``eta`` 1) is the plain step ``x - Delta``, which the stage
takes itself; a model without normalisation statistics (found once per model, its
array names and dtypes) has no :class:`RoundStatistics`: the replies go straight to
the update stream and the update is not settled.

What a run switches on beyond them reaches the round through the stage's active
round features (:mod:`strategies.rounds.round_feature`, built by
:func:`strategies.rounds.active_features.active_features`): the stage calls each
feature's hooks in order and names none of them (``tests/strategies/
test_round_feature_seam.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Sequence
from functools import partial
from logging import INFO, WARNING
from typing import TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from strategies.aggregation import apply_update
from strategies.compression import parse_spec
from strategies.wire import message_keys as keys
from strategies.wire.errors import FederationError
from strategies.wire.local_solver import LocalSolver
from strategies.plugins.protocols import (Aggregator, CodecRate, Schedule, Selector,
                                          ServerOptimizer)
from strategies.plugins.schedules.codec_rate import SiteRound
from strategies.plugins.server_opt.sgd import ServerSGD
from strategies.rounds.instructions import TrainPlan, Uplink, train_messages
from strategies.rounds.normalisation_statistics import RoundStatistics, StatisticPositions
from strategies.rounds.reply_intake import Cap, ReplyIntake, Taken, TrainReply
from strategies.rounds.round_feature import RoundFeature, RoundReplies
from strategies.rounds.round_metrics import (SelectionContext, aggregated_replies, bytes_down,
                                             example_weighted_metrics, query_losses,
                                             record_selection, record_traffic)
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.round_report import RoundReport
from strategies.rounds.site_book import SiteBook
from strategies.rounds.update_stream import (AggregateOutcome, DEFAULT_MAX_HELD_MB,
                                             DefendedAggregator, UpdateStream)

__all__ = ["OFFLINE", "NoValidRepliesError", "TrainStage", "site_rounds", "trained_arrays"]

OFFLINE = "site offline: not connected to the SuperLink"

F = TypeVar("F", bound=RoundFeature)


class NoValidRepliesError(FederationError):
    """Too many rounds in a row ended with no usable train reply."""


def site_rounds(report: RoundReport, used: Iterable[TrainReply]) -> list[SiteRound]:
    """Each used reply's compute seconds, reply seconds, bytes and initial loss
    (what a compression-rate schedule observes), from ``report``'s traffic."""
    rounds = []
    for reply in used:
        traffic = report.traffic.get(reply.site, {})
        rounds.append(SiteRound(
            train_seconds=float(reply.metrics.get(keys.TRAIN_SECONDS, 0.0)),
            reply_seconds=report.reply_seconds.get(reply.site, {}).get(
                "train-reply-seconds", 0.0),
            bytes_sent=traffic.get("bytes-down", 0.0) + traffic.get("bytes-up", 0.0),
            num_examples=reply.num_examples,
            initial_loss=float(reply.metrics[keys.INITIAL_LOSS])))
    return rounds


def trained_arrays(reference: list[np.ndarray], statistics: Collection[int]) -> list[bool]:
    """Which arrays of the model ``reference`` a server optimizer acts on: the float ones
    that are not normalisation statistics (the positions ``statistics``)."""
    return [a.dtype.kind == "f" and j not in statistics for j, a in enumerate(reference)]


class TrainStage:
    """The train half of a round, owned by the strategy.

    Parameters
    ----------
    aggregator, schedule, selector, codec_rate : plug-ins
        The aggregator (behind its defence), the local-steps schedule, the client
        selector and the compression-rate schedule (:mod:`strategies.plugins.protocols`).
    sites : SiteBook
        The federation's site book (shared with the strategy's evaluate stage).
    policy : RoundPolicy
        Deadline, quorum and timeout of the selector's query exchange.
    uplink : Uplink
        The sites' codec, error feedback, federation id, time budget and seeds.
    local_solver : LocalSolver
        The sites' optimiser settings (the server's FedNova a-norm of a reply).
    max_empty_rounds : int
        Abort after this many consecutive rounds without one usable reply.
    max_held_mb : float
        Run config ``round.max-held-mb`` (:mod:`strategies.rounds.update_stream`).
    features : Sequence[RoundFeature]
        The run's active round features, in the order their hooks are called
        (:func:`~strategies.rounds.active_features.active_features`); none by default.
    server_opt : ServerOptimizer, optional
        ``strategy.server-opt``: the step the aggregator's ``Delta`` makes (default
        ``sgd``, ``x - Delta``).

    Attributes
    ----------
    statistics : RoundStatistics or None
        The round's normalisation statistics; None for a model without any.
    """

    # pylint: disable=too-many-arguments,too-many-instance-attributes
    def __init__(self, *, aggregator: Aggregator, schedule: Schedule, selector: Selector,
                 codec_rate: CodecRate, sites: SiteBook,
                 policy: RoundPolicy, uplink: Uplink, local_solver: LocalSolver,
                 max_empty_rounds: int = 3, max_held_mb: float = DEFAULT_MAX_HELD_MB,
                 features: Sequence[RoundFeature] = (),
                 server_opt: ServerOptimizer | None = None) -> None:
        self.aggregator, self.schedule, self.selector = aggregator, schedule, selector
        self._server_opt: ServerOptimizer = ServerSGD()
        self.optimizes = False
        self.server_opt = server_opt or self._server_opt
        self.codec_rate, self.sites, self.policy = codec_rate, sites, policy
        self.uplink, self.local_solver = uplink, local_solver
        self.features: list[RoundFeature] = list(features)
        self.max_empty_rounds = max_empty_rounds
        self.stream = UpdateStream(max_held_mb)
        self.statistics: RoundStatistics | None = None
        self.signature: list[tuple[str, np.dtype]] = []  # the model statistics were found in
        self.plan = TrainPlan({}, {}, codec=uplink.codec)
        self.down_bytes: dict[int, int] = {}
        self.keys: list[str] = []
        self.reference: list[np.ndarray] = []
        self.empty_rounds = 0
        self.intake: ReplyIntake[TrainReply] = self._intake({})

    @property
    def server_opt(self) -> ServerOptimizer:
        """The server optimizer (checkpointed with the strategy)."""
        return self._server_opt

    @server_opt.setter
    def server_opt(self, optimizer: ServerOptimizer) -> None:
        """Set the server optimizer; whether it is ``active`` is read here, once, so a
        round with the plain step never enters it (:attr:`optimizes`)."""
        self._server_opt, self.optimizes = optimizer, optimizer.active

    def feature(self, kind: type[F]) -> F | None:
        """The active feature of class ``kind``, or None when that feature is off."""
        for feature in self.features:
            if isinstance(feature, kind):
                return feature
        return None

    def outgoing(self, arrays: ArrayRecord) -> ArrayRecord:
        """The global model ``arrays`` as this round's instructions carry it (each feature's
        :meth:`~strategies.rounds.round_feature.RoundFeature.outgoing`, in order)."""
        for feature in self.features:
            arrays = feature.outgoing(arrays)
        return arrays

    def _intake(self, expected: dict[int, str]) -> ReplyIntake[TrainReply]:
        """The round's intake: replies parsed against this round's plan and model, then
        identity-checked, capped at the train cap and folded into the stream (their
        normalisation statistics kept when the round needs them); the side payloads they
        may carry are the channels of the active features."""
        parse = partial(self.plan.parse_reply, reference=self.reference,
                        solver=self.local_solver,
                        channels={key for feature in self.features for key in feature.channels})
        sink = self.stream if self.statistics is None else self.statistics
        return ReplyIntake("aggregate_train", self.sites, parse, expected, Cap.TRAIN, sink=sink)

    def start_statistics(self, robust: bool) -> None:
        """Start the round's :attr:`statistics` on its model (``keys``, ``reference``);
        ``robust``: a defence is on (the median rule).

        Whether the model has normalisation statistics is found once for each model (its
        array names and dtypes): a model without any has none (None), never entered.
        """
        model = [(key, array.dtype) for key, array in zip(self.keys, self.reference)]
        if model != self.signature:
            self.signature = model
            found = bool(StatisticPositions.of(self.keys, self.reference))
            self.statistics = RoundStatistics(self.stream) if found else None
        if self.statistics is not None:
            self.statistics.start(self.keys, self.reference, robust)

    def plan_round(self, server_round: int, node_ids: list[int]) -> TrainPlan:
        """The round's settings for ``node_ids``: tau and the codec, with the kept fraction
        of the compression-rate schedule when it is ``active`` (else it is not asked)."""
        rate = (self.codec_rate.rate_for(parse_spec(self.uplink.codec))
                if self.codec_rate.active else None)
        return TrainPlan.for_round(node_ids, self.schedule.tau, self.uplink, server_round, rate)

    def configure(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                  grid: Grid, nodes: list[int], report: RoundReport) -> list[Message]:
        """Select among the connected ``nodes`` and send each its instruction (tau, codec)."""
        node_ids = self.select(server_round, arrays, grid, nodes, report)
        self.stream.start(self.aggregator, self.reference, node_ids, self.sites)
        self.start_statistics(robust=isinstance(self.aggregator, DefendedAggregator))
        self.plan = self.plan_round(server_round, node_ids)
        messages = train_messages(node_ids, self.outgoing(arrays), config, server_round,
                                  self.plan, self.uplink, self.features,
                                  reference=self.reference, sites=self.sites)
        if self.statistics is not None:  # a feature may have the sites start from another model
            bases = [b for b in (f.trained_from() for f in self.features) if b is not None]
            self.statistics.rebase(bases[-1] if bases else None)
        self.intake = self._intake({n: self.sites.label(n) for n in node_ids})
        self.down_bytes = bytes_down(messages)
        return messages

    def select(self, server_round: int, arrays: ArrayRecord, grid: Grid, nodes: list[int],
               report: RoundReport) -> list[int]:
        """The round's model (``keys``, ``reference``: as :meth:`outgoing` sends it) and the
        sites the selector picks among the connected ``nodes`` (offline ones recorded as
        dropped)."""
        self.keys = list(arrays.keys())
        self.reference = self.outgoing(arrays).to_numpy_ndarrays()
        context = SelectionContext(
            sizes=self.sites.capped_sizes(), last_losses=dict(self.sites.last_losses),
            query_losses=lambda candidates, subset: query_losses(
                grid, self.policy, server_round, arrays, candidates, subset, self.sites,
                report))
        node_ids = self.selector.select(server_round, nodes, context)
        if not node_ids:
            raise NoValidRepliesError(f"round {server_round}: the selector chose no site")
        for name in self.sites.offline(nodes):  # a known site whose SuperNode is gone
            report.train_dropped[name] = OFFLINE
            log(WARNING, "configure_train: %s is offline", name)
        record_selection(report, self.selector, self.sites.label)  # relabelled after the replies
        log(INFO, "configure_train: %d sites selected of %d connected, tau %d",
            len(node_ids), len(nodes), self.schedule.tau)
        return node_ids

    def aggregate(self, report: RoundReport, taken: Taken[TrainReply]
                  ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the replies the round's intake ``taken`` (each validated once).

        Sizes were capped on intake; a reply the aggregator rejects is dropped; the
        update's normalisation statistics are the sites' median when a defence is on, and
        a statistic or counter it would make invalid is repaired (``statistics-repaired``,
        ``counters-bounded``); a round whose aggregation fails or whose new model is not
        finite keeps the old model (``(None, None)``) and the aggregator's state as it
        was (e.g. FedNova's server momentum), with the reason in
        ``RoundReport.aggregation_failed``.
        """
        report.schedule_tau = int(self.schedule.tau)
        accepted = taken.accepted
        report.train_dropped.update(taken.dropped)
        report.policies.update(taken.policies)
        before = copy.deepcopy(self.aggregator)
        outcome = (self.stream.finish(accepted, report.train_dropped)
                   if accepted else AggregateOutcome(None))
        return self.conclude(report, accepted, outcome, before)

    def conclude(self, report: RoundReport, accepted: list[TrainReply],
                 outcome: AggregateOutcome, before: Aggregator
                 ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's ``outcome`` over its ``accepted`` replies into ``report`` and the model.

        Per-site metrics, the sites learnt, traffic, what each feature and the schedules
        observe; the new model (statistics and counters settled,
        :meth:`RoundStatistics.settle`, then the server optimizer's step, then each
        feature's :meth:`~strategies.rounds.round_feature.RoundFeature.conclude`), or the
        old one with the aggregator as it was ``before`` the round, and the server optimizer
        as it was, when there is none.
        """
        for reply in outcome.used:
            if report.train_dropped.get(reply.site) == OFFLINE:  # it came back on a new node
                del report.train_dropped[reply.site]
            report.train[reply.site] = dict(reply.metrics)
            self.sites.learn(reply.node_id, reply.site, reply.num_examples, reply.train_loss)
        record_selection(report, self.selector, self.sites.label)
        record_traffic(report, self.down_bytes, accepted, self.reference, self.sites.label)
        replies = RoundReplies(accepted, self.plan, self.reference, self.sites, self.down_bytes)
        for feature in self.features:
            report.strategy.update(feature.observe(report, replies))
        report.strategy.update(self.schedule.observe(outcome.used))
        if self.codec_rate.active:
            report.strategy.update(self.codec_rate.observe(
                parse_spec(self.plan.codec).fraction, site_rounds(report, outcome.used)))
        if not accepted:
            self.empty_rounds += 1
            log(WARNING, "aggregate_train: no usable reply in round %d; model unchanged",
                report.server_round)
            if self.empty_rounds >= self.max_empty_rounds:
                raise NoValidRepliesError(
                    f"{self.empty_rounds} consecutive rounds without a usable reply; "
                    f"last reasons: {report.train_dropped}"
                )
            return None, None
        self.empty_rounds = 0
        report.strategy.update(outcome.info)
        updated, report.aggregation_failed = None, outcome.failure
        optimizer = copy.deepcopy(self.server_opt)
        if outcome.delta is not None:
            step = self.model_step(report, outcome.delta, outcome)
            updated, report.aggregation_failed = apply_update(self.reference, step, self.keys)
        if updated is not None:
            for feature in self.features:
                updated, info = feature.conclude(report, self.keys, updated, outcome.used)
                report.strategy.update(info)
        if updated is None:
            self.aggregator, self._server_opt = before, optimizer
            log(WARNING, "aggregate_train: round %d: %s", report.server_round,
                report.aggregation_failed)
            return None, None
        report.train_aggregate = example_weighted_metrics(
            aggregated_replies(outcome.used, outcome.info))
        log(INFO, "aggregate_train: %d accepted, %d dropped", len(outcome.used),
            len(report.train_dropped))
        record = ArrayRecord({k: Array(v) for k, v in zip(self.keys, updated)})
        return record, MetricRecord({k: float(v) for k, v in report.train_aggregate.items()})

    def model_step(self, report: RoundReport, delta: list[np.ndarray],
                   outcome: AggregateOutcome) -> list[np.ndarray]:
        """The model's step from the round's update ``delta`` (of ``outcome``): its
        statistics and counters settled (:meth:`RoundStatistics.settle`, what it repaired
        into ``report``) when the model has them, then the server optimizer's step when it
        is ``active`` (else ``Delta`` itself: ``x - Delta``)."""
        delta = list(delta)
        if self.statistics is not None:
            delta, repairs = self.statistics.settle(
                self.reference, delta, aggregated_replies(outcome.used, outcome.info),
                max(self.plan.tau.values(), default=self.plan.default_tau))
            report.strategy.update(repairs)
        if not self.optimizes:
            return delta
        statistics = () if self.statistics is None else self.statistics.positions.estimates
        return self.server_opt.step(delta, trained_arrays(self.reference, set(statistics)))
