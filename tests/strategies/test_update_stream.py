"""The update stream: linear aggregators fold each reply on arrival; robust rules hold, bounded.

Hand-computed on tiny arrays, the streamed FedAvg / FedNova aggregate equals the
held-set one (:func:`fedavg_delta`, :func:`fednova_delta`) to float rounding. A
round of the strategy keeps no decoded update and no update bytes per reply
while it collects (measured with ``tracemalloc``), and a rule that needs every
update is refused, naming ``round.max-held-mb``, when they would not fit.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from strategies.aggregation import fedavg_delta, fednova_delta
from strategies.plugins.defences.multi_krum import MultiKrumDefence
from strategies.plugins.defences.norm_bound import NormBoundDefence
from strategies.plugins.registries import AGGREGATORS
from strategies.rounds.reply_intake import TrainReply
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.update_stream import UpdateStream, with_defence
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from strategies.wire.update_codec import pack_update
from tests.strategies.test_federated_strategy import _train_metrics, make_strategy

REFERENCE = [np.zeros(2, np.float32), np.zeros((1, 1), np.float32), np.array(0, np.int64)]
D1 = [np.array([1.0, 2.0], np.float32), np.array([[3.0]], np.float32), np.array(-2, np.int64)]
D2 = [np.array([5.0, -2.0], np.float32), np.array([[-1.0]], np.float32), np.array(-6, np.int64)]


def _train_reply(node: int, delta, n: int, a_norm: float = 1.0) -> TrainReply:
    return TrainReply(node_id=node, site=f"site-{node}", delta=delta, num_examples=n,
                      steps=1, train_loss=0.1, a_norm=a_norm)


def _streamed(aggregator, replies: list[TrainReply]):
    stream = UpdateStream()
    stream.start(aggregator, REFERENCE, range(len(replies)))
    kept = [stream.admit(reply) for reply in replies]
    return kept, stream.finish(kept, {})


def test_streamed_fedavg_is_the_held_weighted_mean(server_identity):
    # n = (1, 3): Delta = (D1 + 3 D2) / 4 = (4, -1), [[0]], rint(-20 / 4) = -5
    replies = [_train_reply(1, D1, 1), _train_reply(2, D2, 3)]
    kept, outcome = _streamed(AGGREGATORS.create("fedavg"), replies)
    assert all(reply.delta == [] for reply in kept)  # nothing decoded is kept
    np.testing.assert_allclose(outcome.delta[0], [4.0, -1.0])
    np.testing.assert_allclose(outcome.delta[1], [[0.0]])
    assert outcome.delta[2] == -5 and outcome.delta[2].dtype == np.int64
    for streamed, held in zip(outcome.delta, fedavg_delta([D1, D2], [1, 3])):
        assert streamed.dtype == held.dtype
        np.testing.assert_allclose(streamed, held, rtol=1e-6)
    assert [r.site for r in outcome.used] == ["site-1", "site-2"]


def test_streamed_fednova_is_the_held_normalised_mean(server_identity):
    # n = (1, 3), a = (1, 4): p = (1/4, 3/4), tau_eff = 1/4 + 3 = 3.25
    # float: 3.25 (D1 / 4 + 3 D2 / 16) = (2.859375, 0.40625), [[0.09375]]; int: -5
    replies = [_train_reply(1, D1, 1, a_norm=1.0), _train_reply(2, D2, 3, a_norm=4.0)]
    _, outcome = _streamed(AGGREGATORS.create("fednova"), replies)
    np.testing.assert_allclose(outcome.delta[0], [3.25 * (0.25 + 15 / 16), 3.25 * (0.5 - 6 / 16)])
    np.testing.assert_allclose(outcome.delta[1], [[3.25 * (0.75 - 3 / 16)]])
    assert outcome.delta[2] == -5
    assert outcome.info["tau-eff"] == pytest.approx(3.25)
    held = fednova_delta([D1, D2], [1, 3], [1.0, 4.0])
    for streamed, expected in zip(outcome.delta, held):
        np.testing.assert_allclose(streamed, expected, rtol=1e-6)


def test_streamed_fednova_matches_the_held_aggregator_round_after_round(server_identity):
    """FedNova keeps no state (its former server momentum is strategy.server-opt's, #45):
    every round's streamed update is the held one."""
    streamed, held = (AGGREGATORS.create("fednova") for _ in range(2))
    replies = [_train_reply(1, D1, 1, a_norm=1.0), _train_reply(2, D2, 3, a_norm=4.0)]
    for _ in range(2):
        _, outcome = _streamed(streamed, replies)
        delta, _ = held.aggregate(replies)
        for a, b in zip(outcome.delta, delta):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_a_rejected_reply_is_left_out_of_the_sum(server_identity):
    stream = UpdateStream()
    stream.start(AGGREGATORS.create("fedavg"), REFERENCE, range(2))
    wrong = [np.zeros(3, np.float32), D1[1], D1[2]]
    reason = stream.admit(_train_reply(1, wrong, 5))
    assert reason.startswith("rejected by the aggregation: update 0, array 0: shape (3,)")
    kept = stream.admit(_train_reply(2, D2, 3))
    outcome = stream.finish([kept], {})
    np.testing.assert_allclose(outcome.delta[0], D2[0])
    assert [r.site for r in outcome.used] == ["site-2"]


def test_an_absolute_norm_bound_clips_each_update_as_it_streams(server_identity):
    # ||D1|| = sqrt(14) > M = 1: scaled by 1/sqrt(14); ||D2 / 10|| = sqrt(30) / 10 < 1: kept
    small = [D2[0] / 10, D2[1] / 10, D2[2]]
    def aggregator():
        return with_defence(NormBoundDefence(absolute=1.0, kappa=0.0),
                            AGGREGATORS.create("fedavg"))
    replies = [_train_reply(1, D1, 1), _train_reply(2, small, 3)]
    _, outcome = _streamed(aggregator(), replies)
    held, info = aggregator().aggregate(replies)  # a fresh one: no history of earlier rounds
    assert outcome.info == pytest.approx(info)
    assert outcome.info["clip-factor/site-1"] == pytest.approx(1 / np.sqrt(14.0))
    for streamed, expected in zip(outcome.delta, held):
        np.testing.assert_allclose(streamed, expected, rtol=1e-6)


def test_a_streamed_reply_is_kept_without_its_update(server_identity):
    stream = UpdateStream()
    stream.start(AGGREGATORS.create("fedavg"), REFERENCE, range(1))
    kept = stream.admit(_train_reply(1, D1, 1))
    assert kept.delta == [] and kept.num_examples == 1


@pytest.mark.parametrize("aggregator", [
    AGGREGATORS.create("median"), AGGREGATORS.create("trimmed-mean"),
    with_defence(NormBoundDefence(kappa=3.0), AGGREGATORS.create("fedavg")),
    with_defence(MultiKrumDefence(f=1), AGGREGATORS.create("fedavg"))],
    ids=["median", "trimmed-mean", "norm-bound-kappa", "multi-krum"])
def test_rules_that_need_every_update_hold_them_within_the_bound(aggregator, server_identity):
    reference = [np.zeros(2**18, np.float32)]  # 1 MiB
    stream = UpdateStream(max_held_mb=8)
    stream.start(aggregator, reference, range(8))  # 8 MiB: fits
    reply = _train_reply(1, [np.ones(2**18, np.float32)], 2)
    assert stream.admit(reply) is reply
    assert not stream.streaming
    with pytest.raises(ConfigError, match=r"'round\.max-held-mb' = 8: .* 9 selected .*"
                                          r"9 x 1\.0 MB = 9 MB"):
        stream.start(aggregator, reference, range(9))


@pytest.mark.parametrize("aggregator", [
    AGGREGATORS.create("fedavg"), AGGREGATORS.create("fednova"),
    with_defence(NormBoundDefence(absolute=1.0, kappa=0.0), AGGREGATORS.create("fedavg"))],
    ids=["fedavg", "fednova", "absolute-norm-bound"])
def test_linear_aggregators_stream_past_the_bound(aggregator, server_identity):
    stream = UpdateStream(max_held_mb=1)
    stream.start(aggregator, [np.zeros(2**18, np.float32)], range(1000))
    assert stream.streaming


# ------------------------------------------------------ a whole round's memory
ENTRIES = 250_000  # float32: 1 MB per update
SITES = 16


class OneAtATimeGrid:
    """Answers one train message per pull with a 1 MB update, noting the memory then.

    The suite's one hand-written Grid: the engine (:class:`app.engine.InProcessGrid`)
    answers every instruction when it is pushed and holds the replies, so a memory
    trace could not tell what the round keeps per reply from what the engine holds.
    Here each reply is made only when it is pulled.
    """

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes
        self.sent: dict[str, Message] = {}
        self.traced: list[int] = []

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages):
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = f"m-{len(self.sent)}"
            self.sent[message.metadata.message_id] = message
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        self.traced.append(tracemalloc.get_traced_memory()[0])
        return [self._answer(self.sent[mid]) for mid in message_ids[:1]]

    @staticmethod
    def _answer(message: Message) -> Message:
        delta = [np.full(ENTRIES, 0.5, np.float32), np.array(0, np.int64)]
        content = RecordDict({
            keys.SITE: ConfigRecord({keys.SITE_NAME: f"site-{message.metadata.dst_node_id}"}),
            keys.DELTA: ArrayRecord({k: Array(v) for k, v in
                                     pack_update(delta, "none").items()}),
            keys.METRICS: MetricRecord(_train_metrics(4))})
        reply = Message(content, reply_to=message)
        reply.metadata.__dict__["_src_node_id"] = message.metadata.dst_node_id
        return reply


def test_a_fedavg_round_keeps_no_update_per_reply_while_it_collects(server_identity):
    """Before the stream, the intake kept every decoded update (and its bytes) to the end."""
    strategy = make_strategy(min_nodes=SITES, fraction_evaluate=0.0,
                             policy=RoundPolicy(poll_interval=0.0))
    grid = OneAtATimeGrid(list(range(2, 2 + SITES)))
    # sizes declared in an earlier round: round 1 would hold the updates until each site
    # declared its size (the relative size cap, strategies/rounds/site_book.py)
    strategy.sites.sizes.update(dict.fromkeys(grid.nodes, 4))
    initial = ArrayRecord([np.zeros(ENTRIES, np.float32), np.array(0, np.int64)])
    tracemalloc.start()
    try:
        result = strategy.start(grid, initial, num_rounds=1)
    finally:
        tracemalloc.stop()
    assert set(strategy.reports[1].train) == {f"site-{n}" for n in grid.nodes}
    np.testing.assert_allclose(result.arrays.to_numpy_ndarrays()[0], -0.5)
    model_bytes = 4 * ENTRIES
    # from the 2nd reply to the last, what the round kept per reply: ~0 (was ~2 MB each)
    kept = grid.traced[-1] - grid.traced[1]
    assert kept < 2 * model_bytes, kept
