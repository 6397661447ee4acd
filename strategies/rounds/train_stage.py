"""The train stage of a round: instructions out, replies validated, folded and aggregated.

:class:`TrainStage` is the half of :class:`~strategies.rounds.federated_strategy.FederatedStrategy`
that trains: :meth:`TrainStage.configure_train` selects the sites and builds their
instructions (tau from the local-steps schedule, the codec of the round with the
kept fraction of the compression-rate schedule, :mod:`strategies.plugins.schedules`),
and :meth:`TrainStage.aggregate_train` accepts the replies (each validated and
decoded once, :class:`ReplyIntake`), aggregates them, records the round's traffic
and lets both schedules observe it. The strategy class holds the plug-ins and the
other stages; this one keeps the round's train state (plan, bytes sent, the model
the updates apply to).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from strategies import message_keys as keys
from strategies.compression import parse_spec
from strategies.errors import FederationError
from strategies.plugins.schedules.codec_rate import SiteRound
from strategies.replies import TrainReply, parse_train_reply
from strategies.rounds.instructions import TrainPlan, train_messages
from strategies.rounds.node_wait import wait_for_nodes
from strategies.rounds.reply_intake import ReplyIntake
from strategies.rounds.round_metrics import aggregated_replies, example_weighted_metrics
from strategies.rounds.round_report import RoundReport
from strategies.rounds.safe_aggregate import AggregateOutcome, apply_update
from strategies.rounds.site_selection import SelectionContext, query_losses, record_selection
from strategies.rounds.traffic import bytes_down, record_traffic
from strategies.rounds.update_stream import UpdateStream

__all__ = ["OFFLINE", "NoValidRepliesError", "TrainStage", "site_rounds"]

OFFLINE = "site offline: not connected to the SuperLink"


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


class TrainStage:
    """The train half of the strategy (a mixin of ``FederatedStrategy``).

    It reads the strategy's plug-ins and collaborators (``aggregator``,
    ``schedule``, ``codec_rate``, ``selector``, ``policy``, ``sites``, ``uplink``,
    ``downlink``, ``local_solver``, ``min_nodes``, ``node_wait_timeout``,
    ``max_empty_rounds``, ``reports``), set by the strategy's constructor, and
    keeps the round's train state, set by :meth:`_start_train_stage`.
    """

    def _start_train_stage(self, max_held_mb: float) -> None:
        """The train state before the first round."""
        self._plan = TrainPlan({}, {}, codec=self.uplink.codec)
        self._down_bytes: dict[int, int] = {}
        self._keys: list[str] = []
        self._global: list[np.ndarray] = []
        self._empty_rounds = 0
        self._stream = UpdateStream(max_held_mb)
        self._train_intake: ReplyIntake[TrainReply] = ReplyIntake(
            self._parse_train, "aggregate_train", self._admit_train)

    def _report(self, server_round: int) -> RoundReport:
        return self.reports.setdefault(server_round, RoundReport(server_round))

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Select sites and send each its own instruction with this round's tau and codec."""
        self._keys = list(arrays.keys())
        self._global = arrays.to_numpy_ndarrays()
        nodes = wait_for_nodes(grid, self.min_nodes, self.node_wait_timeout)
        self.sites.connected = set(nodes)
        report = self._report(server_round)
        context = SelectionContext(
            sizes=dict(self.sites.sizes), last_losses=dict(self.sites.last_losses),
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
        self._stream.start(self.aggregator, self._global, len(node_ids))
        self._plan = TrainPlan.for_round(node_ids, self.schedule.tau, self.uplink, server_round,
                                         self.codec_rate.rate_for(parse_spec(self.uplink.codec)))
        messages = train_messages(node_ids, arrays, config, server_round, self._plan,
                                  self.uplink, self.downlink)
        self._train_intake.expect({n: self.sites.label(n) for n in node_ids})
        self._down_bytes = bytes_down(messages)
        return messages

    def _parse_train(self, message: Message) -> TrainReply:
        node = message.metadata.src_node_id
        return parse_train_reply(message, self._global, self._plan.codec,
                                 self._plan.seed_of(node), self._plan.tau_of(node),
                                 self.local_solver)

    def _admit_train(self, message: Message, reply: TrainReply) -> TrainReply | str:
        """A valid train reply's identity checked, its size capped, then streamed or held."""
        return (self.sites.identity_problem(reply.node_id, reply.site)
                or self._stream.admit(message, self.sites.capped_reply(reply)))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the accepted updates (validated once, see :class:`ReplyIntake`).

        Sizes were capped on admission; a reply the aggregator rejects is dropped; a
        round whose aggregation fails or whose new model is not finite keeps the old
        model (``(None, None)``) and the aggregator's state as it was (e.g. FedNova's
        server momentum), with the reason in ``RoundReport.aggregation_failed``.
        """
        report = self._report(server_round)
        report.schedule_tau = int(self.schedule.tau)
        accepted = self._train_intake.accept(replies, report.train_dropped, self.sites)
        report.policies.update(self._train_intake.policies)
        before = copy.deepcopy(self.aggregator)
        outcome = (self._stream.finish(accepted, report.train_dropped)
                   if accepted else AggregateOutcome(None))
        for reply in outcome.used:
            if report.train_dropped.get(reply.site) == OFFLINE:  # it came back on a new node
                del report.train_dropped[reply.site]
            report.train[reply.site] = dict(reply.metrics)
            self.sites.learn(reply.node_id, reply.site, reply.num_examples, reply.train_loss)
        record_selection(report, self.selector, self.sites.label)
        record_traffic(report, self._down_bytes, accepted, self._global, self.sites.label)
        report.strategy.update(self.downlink.observe(accepted, self._down_bytes))
        report.strategy.update(self.schedule.observe(outcome.used))
        report.strategy.update(self.codec_rate.observe(parse_spec(self._plan.codec).fraction,
                                                       site_rounds(report, outcome.used)))
        if not accepted:
            self._empty_rounds += 1
            log(WARNING, "aggregate_train: no usable reply in round %d; model unchanged",
                server_round)
            if self._empty_rounds >= self.max_empty_rounds:
                raise NoValidRepliesError(
                    f"{self._empty_rounds} consecutive rounds without a usable reply; "
                    f"last reasons: {report.train_dropped}"
                )
            return None, None
        self._empty_rounds = 0
        report.strategy.update(outcome.info)
        updated, report.aggregation_failed = (
            apply_update(self._global, outcome.delta, self._keys)
            if outcome.delta is not None else (None, outcome.failure))
        if updated is None:
            self.aggregator = before
            log(WARNING, "aggregate_train: round %d: %s", server_round,
                report.aggregation_failed)
            return None, None
        report.train_aggregate = example_weighted_metrics(
            aggregated_replies(outcome.used, outcome.info))
        log(INFO, "aggregate_train: %d accepted, %d dropped", len(outcome.used),
            len(report.train_dropped))
        record = ArrayRecord({k: Array(v) for k, v in zip(self._keys, updated)})
        return record, MetricRecord({k: float(v) for k, v in report.train_aggregate.items()})
