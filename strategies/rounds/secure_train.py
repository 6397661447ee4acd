"""The train half of a SecAgg+ round: five exchanges, one running sum, one update.

Bell, Bonawitz, Gascón, Lepoint, Raykova, CCS 2020 (``strategy.secure-aggregation =
"secagg+"``, :mod:`strategies.plugins.secure_aggregation.secagg_plus`). The selector
picks the sites (:meth:`TrainStage.select`, Power-of-Choice's query first); then
each stage is one exchange of train messages (:func:`strategies.rounds.instructions.exchange`,
under the round policy's deadline, quorum and timeout) whose replies a
:class:`ReplyIntake` takes once each (identity bound to the node, sizes capped):

1. ``setup``: the round plan (no arrays); the sites that answer (U1) send two public keys
   signed with their long-term site key (checked by the sites against their rosters,
   :mod:`strategies.wire.secure_aggregation.signing`) and their size; the largest size
   (capped) is the round's weight reference;
2. ``share-keys``: the neighbours' public keys, names and signatures; U2 send their
   encrypted shares;
3. ``collect``: the train instruction as in a plain round (model, tau, codec, downlink),
   the shares addressed to the site, the weight reference and the aggregator's a-norm
   floor (FedNova's; 0 for FedAvg); each
   masked vector is added into the round's ONE running sum mod m as it arrives and
   released (U3; :data:`~strategies.rounds.secure_replies.REVEALING` metrics left out);
4. ``consistency``: the whole survivor set U3; each site of it signs it (Bonawitz et al.
   2017, section 4.4);
5. ``unmask``: U3 and all its signatures; the shares rebuild the masks to remove
   (:meth:`SecAggRound.finish`).

The aggregator is a :class:`~strategies.plugins.protocols.SecureSumAggregator` (a robust
rule is refused): each site's coefficient ``c_i`` is ``kappa`` times the weight the
aggregator's fold gives it (:mod:`strategies.wire.secure_aggregation.weights`), so with
``S = sum_i c_i delta_i`` the unmasked sum over U3, ``S / kappa`` is the round's running
sum and the aggregator's own ``finish`` makes the update of it (:func:`secure_delta`),
with the sizes and steps reported in the clear: no second FedAvg or FedNova.
Integer buffers are not sent: step counters advance by the example-weighted mean of the
reported steps (bounded by the counter rule of
:mod:`strategies.rounds.normalisation_statistics`). The round is then concluded as a
plain one (:meth:`TrainStage.conclude`): per-site metrics, drops (``secagg <stage>:``
and the reason), traffic (bytes of all five stages), ``secagg-summed``,
``secagg-dropped`` and ``secagg-bad-shares/<site>`` (a site whose unmask share did not
fit). A sum that cannot be unmasked keeps the old model
(``RoundReport.aggregation_failed``) and counts as a round without a usable reply.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from logging import WARNING
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from strategies.aggregation import RunningSum
from strategies.plugins.protocols import Info, SecureSumAggregator
from strategies.rounds.instructions import Exchanged, exchange, site_messages, train_messages
from strategies.rounds.normalisation_statistics import StatisticPositions
from strategies.rounds.reply_intake import Cap, ReplyIntake, Taken, TrainReply
from strategies.rounds.round_metrics import bytes_down
from strategies.rounds.round_report import RoundReport
from strategies.rounds.secure_replies import StageReply, parse_masked_reply, parse_stage_reply
from strategies.rounds.train_stage import TrainStage
from strategies.rounds.update_stream import AggregateOutcome
from strategies.secure_aggregation.coordinator import SecAggRound, SecureSum
from strategies.wire import message_keys as keys
from strategies.wire.plugin_options import PluginError
from strategies.wire.secure_aggregation.errors import SecAggError
from strategies.wire.secure_aggregation.settings import SecAggSettings
from strategies.wire.secure_aggregation.vector import (float_positions, kept_indices,
                                                       shared_codec_seed, unflatten_float)
from strategies.wire.secure_aggregation.weights import sum_scale

__all__ = ["SecureTrain", "secure_delta"]

#: ``record(report, stage, exchanged) -> taken``: an exchange's late, missing and seconds
#: into the report (:meth:`FederatedStrategy._record`).
Recorder = Callable[[RoundReport, str, Exchanged], Taken]


def _float_size(model: list[np.ndarray]) -> int:
    """Values of the model's float arrays (what a site masks without rand-k)."""
    return sum(model[j].size for j in float_positions(model))


class _Taking:
    """A stage intake's sink: each accepted reply's entries into the round, once."""

    def __init__(self, take: Callable[[int, Mapping[str, Any]], None]) -> None:
        self.take = take

    def admit(self, reply: StageReply) -> StageReply | str:
        try:
            self.take(reply.node_id, {**reply.entries, keys.SITE_NAME: reply.site})
        except SecAggError as exc:
            return str(exc)
        return replace(reply, entries={})


class _Masked:
    """The collect intake's sink: each masked vector added into the running sum, released."""

    def __init__(self, secagg: SecAggRound, stage: TrainStage) -> None:
        self.secagg, self.stage = secagg, stage

    def admit(self, reply: TrainReply) -> TrainReply | str:
        try:
            self.secagg.take_masked(reply.node_id, reply.delta[0])
        except SecAggError as exc:
            return str(exc)
        return self.stage.sites.relatively_capped(replace(reply, delta=[]))


@dataclass
class _Round:
    """What every exchange of one secure round needs."""

    grid: Grid
    server_round: int
    config: ConfigRecord
    report: RoundReport
    late_ids: dict[str, int]
    record: Recorder


class SecureTrain:
    """The train half of each round under SecAgg+, on the train stage's plug-ins and book.

    Parameters
    ----------
    settings : SecAggSettings
        The run's ``secagg.*`` section.
    stage : TrainStage
        The strategy's train stage: selector, schedule, aggregator, policy, site book,
        uplink and downlink, and the conclusion of a round (:meth:`TrainStage.conclude`).

    Raises
    ------
    PluginError
        When the stage's aggregator cannot finish from a secure sum (a robust rule).
    """

    def __init__(self, settings: SecAggSettings, stage: TrainStage) -> None:
        if not isinstance(stage.aggregator, SecureSumAggregator):
            raise PluginError(
                f"run config key 'strategy.aggregator' ({type(stage.aggregator).__name__}) "
                "cannot be used with 'strategy.secure-aggregation' = 'secagg+': it cannot "
                "finish from the sum of the sites' updates (a robust rule needs each one)")
        self.settings, self.stage = settings, stage
        self.bytes_up: dict[int, int] = {}

    # pylint: disable=too-many-arguments
    def run(self, grid: Grid, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
            nodes: list[int], report: RoundReport, late_ids: dict[str, int],
            record: Recorder) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """One SecAgg+ train round among the connected ``nodes``: the new model and train
        metrics, or ``(None, None)`` when the model is kept."""
        stage, io = self.stage, _Round(grid, server_round, config, report, late_ids, record)
        node_ids = stage.select(server_round, arrays, grid, nodes, report)
        stage.start_statistics(robust=False)
        stage.plan = stage.plan_round(server_round, node_ids)
        stage.down_bytes, self.bytes_up = {}, {}
        report.schedule_tau = int(stage.schedule.tau)
        before = copy.deepcopy(stage.aggregator)
        kept = kept_indices(stage.reference, stage.plan.codec,
                            shared_codec_seed(stage.uplink.seed, server_round),
                            whole=StatisticPositions.of(stage.keys, stage.reference).estimates)
        used: list[TrainReply] = []
        try:
            secagg = SecAggRound(self.settings, server_round, node_ids, seed=stage.uplink.seed,
                                 length=_float_size(stage.reference) if kept is None else kept.size)
            sizes = self._exchange(io, keys.SECAGG_SETUP, secagg.setup_entries,
                                   secagg.take_keys, secagg, sized=True)
            for reply in sizes:
                stage.sites.learn(reply.node_id, reply.site, reply.num_examples)
            reference = float(max((stage.sites.relatively_capped(r).num_examples for r in sizes),
                                  default=1))
            self._exchange(io, keys.SECAGG_SHARE_KEYS, secagg.share_keys_entries,
                           secagg.take_shares, secagg)
            used = self._collect(io, arrays, secagg, reference)
            self._exchange(io, keys.SECAGG_CONSISTENCY, secagg.consistency_entries,
                           secagg.take_consistency, secagg)
            self._exchange(io, keys.SECAGG_UNMASK, secagg.unmask_entries, secagg.take_unmask,
                           secagg)
            secure_sum = secagg.finish()
        except SecAggError as exc:
            report.aggregation_failed = f"secure aggregation failed: {exc}"
            return stage.conclude(report, [], AggregateOutcome(None), before)
        summed = [replace(r, wire_bytes=self.bytes_up.get(r.node_id, r.wire_bytes))
                  for r in used if r.node_id in set(secure_sum.summed)]
        self._record_sum(secure_sum, report)
        return stage.conclude(report, summed, self._outcome(secure_sum, summed, kept, reference),
                              before)

    def _record_sum(self, secure_sum: SecureSum, report: RoundReport) -> None:
        """``secagg-summed``, ``secagg-dropped`` and each ``secagg-bad-shares/<site>``."""
        report.strategy.update({"secagg-summed": float(len(secure_sum.summed)),
                                "secagg-dropped": float(len(secure_sum.dropped))})
        for node, why in secure_sum.bad_shares.items():
            report.strategy[f"secagg-bad-shares/{self.stage.sites.label(node)}"] = 1.0
            log(WARNING, "secagg_unmask: %s sent %s (left out of the reconstruction)",
                self.stage.sites.label(node), why)

    # pylint: disable=too-many-arguments
    def _exchange(self, io: _Round, name: str, entries: Callable[[int], dict],
                  take: Callable[[int, Mapping[str, Any]], None], secagg: SecAggRound,
                  sized: bool = False) -> list[StageReply]:
        """The setup, share-keys or unmask exchange with the sites ``secagg`` asks in it;
        its accepted replies (their entries taken)."""
        node_ids = secagg.stage_nodes(name)
        messages = site_messages(  # the site's train settings and the stage's entries, no model
            node_ids, None, io.config, io.server_round, MessageType.TRAIN,
            lambda node: {**self.stage.plan.settings(node, self.stage.uplink), **entries(node)})
        intake: ReplyIntake = ReplyIntake(
            f"secagg_{name}", self.stage.sites, partial(parse_stage_reply, sized=sized),
            {n: self.stage.sites.label(n) for n in node_ids}, Cap.TRAIN if sized else Cap.NONE,
            sink=_Taking(take))
        taken = io.record(io.report, f"secagg-{name}",
                          exchange(io.grid, messages, self.stage.policy, intake, io.late_ids))
        self._account(name, messages, taken, io.report)
        return list(taken.accepted)

    def _collect(self, io: _Round, arrays: ArrayRecord, secagg: SecAggRound,
                 reference: float) -> list[TrainReply]:
        """The collect exchange: train instructions with the shares and the weights; each
        masked vector into the running sum as it arrives. Returns the replies without it."""
        stage = self.stage
        node_ids = secagg.stage_nodes(keys.SECAGG_COLLECT)
        a_floor = self._a_floor(stage.plan.default_tau)
        messages = train_messages(node_ids, arrays, io.config, io.server_round, stage.plan,
                                  stage.uplink, stage.features)
        for message in messages:
            node = message.metadata.dst_node_id
            message.content[keys.CONFIG].update({
                **secagg.collect_entries(node), keys.SECAGG_WEIGHT_REFERENCE: reference,
                keys.SECAGG_A_FLOOR: a_floor})
        intake: ReplyIntake[TrainReply] = ReplyIntake(
            "secagg_collect", stage.sites,
            lambda message, node_id: parse_masked_reply(
                message, node_id=node_id, tau=stage.plan.tau_of(node_id),
                solver=stage.local_solver),
            {n: stage.sites.label(n) for n in node_ids}, Cap.TRAIN,
            sink=_Masked(secagg, stage))
        taken = io.record(io.report, "train",
                          exchange(io.grid, messages, stage.policy, intake, io.late_ids))
        self._account(keys.SECAGG_COLLECT, messages, taken, io.report)
        return list(taken.accepted)

    def _account(self, name: str, messages: list[Message], taken: Taken,
                 report: RoundReport) -> None:
        """A stage's bytes down and up per node; its drops and policies into ``report``."""
        for node, size in bytes_down(messages).items():
            self.stage.down_bytes[node] = self.stage.down_bytes.get(node, 0) + size
        for reply in taken.accepted:
            self.bytes_up[reply.node_id] = self.bytes_up.get(reply.node_id, 0) + reply.wire_bytes
        for site, why in taken.dropped.items():
            report.train_dropped.setdefault(site, f"secagg {name}: {why}")
        report.policies.update(taken.policies)

    @property
    def aggregator(self) -> SecureSumAggregator:
        """The stage's aggregator (one that finishes from a secure sum, checked at the start)."""
        return cast(SecureSumAggregator, self.stage.aggregator)

    def _a_floor(self, tau: int) -> float:
        """The aggregator's a-norm floor ``a_f`` for the a-norm of ``tau`` (0: FedAvg)."""
        return self.aggregator.secure_a_floor(self.stage.local_solver.a_norm(tau))

    def _outcome(self, secure_sum: SecureSum, summed: list[TrainReply],
                 kept: np.ndarray | None, reference: float) -> AggregateOutcome:
        """The round's update from the unmasked sum by the aggregator's finish, the step
        counters advanced by the example-weighted mean of the reported steps
        (``aggregation failed`` when the summed sites cannot normalise it)."""
        stage = self.stage
        total = np.asarray(secure_sum.total, dtype=np.float64)
        if kept is not None:  # rand-k: the sum of the shared coordinates, the others 0
            total = np.zeros(_float_size(stage.reference))
            total[kept] = secure_sum.total
        try:
            delta, info = secure_delta(self.aggregator, total, summed, stage.reference,
                                       reference, self._a_floor(stage.plan.default_tau))
        except SecAggError as exc:
            return AggregateOutcome(None, failure=f"aggregation failed: {exc}")
        sizes = [float(r.num_examples) for r in summed]
        steps = float(np.dot(sizes, [r.steps for r in summed]) / np.sum(sizes))
        for j in StatisticPositions.of(stage.keys, stage.reference).counters:
            delta[j] = np.full_like(stage.reference[j], -round(steps))
        return AggregateOutcome(delta, info, summed)


# pylint: disable=too-many-arguments
def secure_delta(aggregator: SecureSumAggregator, total: np.ndarray, summed: list[TrainReply],
                 model: list[np.ndarray], reference: float,
                 a_floor: float) -> tuple[list[np.ndarray], Info]:
    """``Delta`` and the aggregator's info from the unmasked sum ``S = sum_i c_i delta_i``.

    ``S / kappa`` (``kappa = sum_scale(r, a_f)``,
    :mod:`strategies.wire.secure_aggregation.weights`) is the running sum the aggregator's fold
    would have made of the ``summed`` replies counted at ``min(n_i, r)`` examples, so its
    ``finish`` over them is the plain round's update.

    Parameters
    ----------
    aggregator : SecureSumAggregator
        The round's aggregator, whose ``secure_a_floor`` gave ``a_floor``.
    total : numpy.ndarray
        ``S`` over the float arrays of ``model`` in model order (float64).
    summed : list of TrainReply
        The replies whose inputs are in ``S``: sizes, steps and a-norms in the clear.
    model : list of numpy.ndarray
        The global model (shapes and dtypes of ``Delta``; integer arrays come out 0).
    reference, a_floor : float
        The round's weight reference ``r`` and a-norm floor ``a_f`` the sites were sent.

    Raises
    ------
    SecAggError
        When no reply is summed or the reference is not > 0 (nothing normalises ``S``).
    """
    if not summed:
        raise SecAggError("no summed site to normalise the sum")
    running = RunningSum(model)
    like = [np.zeros(array.shape, np.float64) if array.dtype.kind == "f" else array
            for array in model]
    running.add(unflatten_float(total, like), 1.0 / sum_scale(reference, a_floor), 0.0)
    counted = [replace(r, num_examples=min(r.num_examples, int(reference))) for r in summed]
    return aggregator.finish(running, counted)
