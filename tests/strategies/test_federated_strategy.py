"""FederatedStrategy against an in-memory grid: messages, validation, FedAvg, waits."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from strategies import message_keys as keys
from strategies.rounds.federated_strategy import FederatedStrategy, NoValidRepliesError
from strategies.rounds.node_wait import NodeWaitTimeout, wait_for_nodes
from strategies.plugins.registries import AGGREGATORS, SCHEDULES, SELECTORS
from strategies.update_codec import pack_update


def make_strategy(min_nodes: int = 2, aggregator: str = "fedavg", schedule: str = "fixed",
                  **kwargs) -> FederatedStrategy:
    return FederatedStrategy(
        aggregator=AGGREGATORS.create(aggregator),
        schedule=SCHEDULES.create(schedule, tau0=8),
        selector=SELECTORS.create("uniform"),
        min_nodes=min_nodes, node_wait_timeout=1, **kwargs)


pytestmark = pytest.mark.usefixtures("server_identity")


class FakeGrid:
    """The part of flwr's Grid the strategy uses: node ids."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)


GLOBAL = [np.array([1.0, 2.0], dtype=np.float32), np.array([[3.0]], dtype=np.float32),
          np.array(7, dtype=np.int64)]


def _global_record() -> ArrayRecord:
    return ArrayRecord([a.copy() for a in GLOBAL])


def _reply(instruction: Message, delta: list[np.ndarray] | dict | None, metrics: dict | None,
           site: str) -> Message:
    """A site's reply; a list ``delta`` is packed as the ClientApp does (codec none)."""
    content = RecordDict({keys.SITE: ConfigRecord({keys.SITE_NAME: site})})
    if delta is not None:
        packed = pack_update(delta, "none") if isinstance(delta, list) else delta
        content[keys.DELTA] = ArrayRecord({k: Array(v) for k, v in packed.items()})
    if metrics is not None:
        content[keys.METRICS] = MetricRecord(metrics)
    return Message(content, reply_to=instruction)


def _train_metrics(n: int, loss: float = 0.5, steps: int = 3, a_norm: float = 3.0,
                   initial_loss: float = 1.0) -> dict:
    return {keys.NUM_EXAMPLES: n, keys.STEPS: steps, keys.TRAIN_LOSS: loss,
            keys.INITIAL_LOSS: initial_loss, keys.A_NORM: a_norm}


def _configured(strategy: FederatedStrategy, nodes: list[int]) -> list[Message]:
    grid = FakeGrid(nodes)
    config = ConfigRecord({"lr": 0.1})
    messages = list(strategy.configure_train(1, _global_record(), config, grid))
    # Flower stamps ids when it pushes messages; do the same so replies can refer to them.
    for i, m in enumerate(messages):
        m.metadata.__dict__["_message_id"] = f"msg-{i}"
        m.metadata.__dict__["_src_node_id"] = 1
    return messages


def test_each_site_gets_its_own_content_and_config():
    strategy = make_strategy(min_nodes=2)
    messages = _configured(strategy, [11, 12, 13])
    assert sorted(m.metadata.dst_node_id for m in messages) == [11, 12, 13]
    assert all(m.metadata.message_type == MessageType.TRAIN for m in messages)
    contents = {id(m.content) for m in messages}
    configs = {id(m.content[keys.CONFIG]) for m in messages}
    assert len(contents) == 3 and len(configs) == 3
    messages[0].content[keys.CONFIG]["lr"] = 99.0
    assert messages[1].content[keys.CONFIG]["lr"] == 0.1
    assert all(m.content[keys.CONFIG][keys.SERVER_ROUND] == 1 for m in messages)
    assert all(m.content[keys.CONFIG][keys.LOCAL_STEPS] == 8 for m in messages)


def test_fedavg_of_updates_with_bad_replies_dropped():
    strategy = make_strategy(min_nodes=2)
    m = _configured(strategy, [1, 2, 3, 4, 5, 6])
    d1 = [np.array([1.0, 1.0], np.float32), np.array([[2.0]], np.float32), np.array(-1, np.int64)]
    d2 = [np.array([4.0, -2.0], np.float32), np.array([[-1.0]], np.float32), np.array(-1, np.int64)]
    nan = pack_update(d1, "none")
    nan["payload"] = nan["payload"].copy()
    nan["payload"][7:11] = np.frombuffer(np.float32(np.nan).tobytes(), np.uint8)
    wrong_shape = [np.zeros(3, np.float32), d1[1], d1[2]]
    replies = [
        _reply(m[0], d1, _train_metrics(1), "site-a"),
        _reply(m[1], d2, _train_metrics(3), "site-b"),
        _reply(m[2], nan, _train_metrics(5), "site-nan"),
        _reply(m[3], wrong_shape, _train_metrics(5), "site-shape"),
        _reply(m[4], d1, {keys.NUM_EXAMPLES: 5}, "site-missing"),
        Message(Error(code=0, reason="boom: disk full"), reply_to=m[5]),
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    # p = (1/4, 3/4): delta = (3.25, -1.25), [[-0.25]], -1 ; x - delta
    new = arrays.to_numpy_ndarrays()
    np.testing.assert_allclose(new[0], [1.0 - 3.25, 2.0 + 1.25])
    np.testing.assert_allclose(new[1], [[3.25]])
    assert new[2] == 8 and new[2].dtype == np.int64
    report = strategy.reports[1]
    assert set(report.train) == {"site-a", "site-b"}
    dropped = report.train_dropped
    assert dropped["site-nan"] == "payload rejected: payload values contain NaN or inf"
    assert "payload rejected" in dropped["site-shape"]
    assert "missing metrics" in dropped["site-missing"]
    assert "boom: disk full" in dropped["node-6"]
    assert metrics[keys.NUM_EXAMPLES] == 4.0
    assert metrics[keys.TRAIN_LOSS] == pytest.approx(0.5)


def test_missing_replies_are_recorded_as_timeouts():
    strategy = make_strategy(min_nodes=1)
    m = _configured(strategy, [1, 2])
    d = [np.zeros(2, np.float32), np.zeros((1, 1), np.float32), np.array(0, np.int64)]
    strategy.aggregate_train(1, [_reply(m[0], d, _train_metrics(2), "site-a")])
    assert strategy.reports[1].train_dropped == {
        "node-2": "no reply before the round closed (deadline or timeout)"}


def test_rounds_without_usable_replies_keep_the_model_then_abort():
    strategy = make_strategy(min_nodes=1, max_empty_rounds=2)
    _configured(strategy, [1])
    assert strategy.aggregate_train(1, []) == (None, None)
    _configured(strategy, [1])
    with pytest.raises(NoValidRepliesError, match="2 consecutive rounds"):
        strategy.aggregate_train(2, [])


def test_evaluate_metrics_are_example_weighted():
    strategy = make_strategy(min_nodes=2)
    grid = FakeGrid([1, 2])
    messages = list(strategy.configure_evaluate(1, _global_record(), ConfigRecord(), grid))
    for i, m in enumerate(messages):
        m.metadata.__dict__["_message_id"] = f"e-{i}"
    replies = [
        _reply(messages[0], None, {keys.NUM_EXAMPLES: 10, "val-dice": 0.2}, "a"),
        _reply(messages[1], None, {keys.NUM_EXAMPLES: 30, "val-dice": 0.6}, "b"),
    ]
    metrics = strategy.aggregate_evaluate(1, replies)
    assert metrics["val-dice"] == pytest.approx(0.5)
    assert strategy.reports[1].evaluate["b"]["val-dice"] == pytest.approx(0.6)


def test_node_wait_is_bounded():
    with pytest.raises(NodeWaitTimeout, match="only 1 of the required 3 sites"):
        wait_for_nodes(FakeGrid([5]), min_nodes=3, timeout=0.2, poll_interval=0.05)
    assert wait_for_nodes(FakeGrid([2, 1]), min_nodes=2, timeout=0.2) == [1, 2]


@pytest.mark.parametrize(("aggregator", "expected"), [("fedavg", 0.30), ("fednova", 0.0)])
def test_hand_computed_fedavg_and_fednova(aggregator, expected):
    """Scalar model, F_i(x) = g_i x, eta 0.1, p = (.5, .5), tau = (2, 8), g = (1, -1), x = 0.

    Local SGD gives delta_i = eta tau_i g_i = (0.2, -0.8): FedAvg moves x to
    -(0.5 * 0.2 - 0.5 * 0.8) = +0.30; FedNova normalises by ||a_i|| = tau_i and
    rescales by tau_eff = 5, which gives exactly 0.0 (Wang et al. 2020, Sec. 3).
    """
    strategy = FederatedStrategy(aggregator=AGGREGATORS.create(aggregator),
                                 schedule=SCHEDULES.create("fixed", tau0=8),
                                 selector=SELECTORS.create("uniform"),
                                 min_nodes=2, node_wait_timeout=1)
    grid = FakeGrid([1, 2])
    messages = list(strategy.configure_train(1, ArrayRecord([np.zeros(1)]), ConfigRecord(),
                                             grid))
    for i, m in enumerate(messages):
        m.metadata.__dict__["_message_id"] = f"m-{i}"
    replies = [
        _reply(messages[0], [np.array([0.2])], _train_metrics(10, steps=2, a_norm=2.0), "a"),
        _reply(messages[1], [np.array([-0.8])], _train_metrics(10, steps=8, a_norm=8.0), "b"),
    ]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays.to_numpy_ndarrays()[0][0] == pytest.approx(expected, abs=1e-7)  # float32 wire
    if aggregator == "fednova":
        assert strategy.reports[1].strategy["tau-eff"] == pytest.approx(5.0)


def test_adacomm_schedule_follows_the_global_loss():
    schedule = SCHEDULES.create("adacomm", tau0=8, tau_min=1, smoothing=0.0)
    first = [_fake_reply(initial_loss=2.0)]
    assert schedule.observe(first)["schedule-tau"] == 8
    assert schedule.observe([_fake_reply(initial_loss=0.5)])["schedule-tau"] == 4  # sqrt(1/4)*8
    capped = SCHEDULES.create("adacomm", tau0=8, tau_min=6, smoothing=0.0)
    capped.observe(first)
    assert capped.observe([_fake_reply(initial_loss=0.02)])["schedule-tau"] == 6


def _fake_reply(initial_loss: float):
    from strategies.replies import TrainReply  # noqa: PLC0415

    return TrainReply(node_id=1, site="s", delta=[], num_examples=10, steps=1, train_loss=1.0,
                      metrics={keys.INITIAL_LOSS: initial_loss})


class RecordingGrid(FakeGrid):
    """Keeps every pushed message under a fresh message id; ``answer`` replies to it."""

    def __init__(self, nodes: list[int]) -> None:
        super().__init__(nodes)
        self.sent: dict[str, Message] = {}

    def push_messages(self, messages):
        ids = []
        for message in messages:
            mid = f"m-{len(self.sent)}"
            message.metadata.__dict__["_message_id"] = mid
            self.sent[mid] = message
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        replies = (self.answer(self.sent[mid]) for mid in message_ids)
        return [reply for reply in replies if reply is not None]

    def answer(self, message: Message) -> Message | None:
        """The reply to ``message`` available now (None: not yet)."""
        raise NotImplementedError


def _from(reply: Message, node: int) -> Message:
    reply.metadata.__dict__["_src_node_id"] = node
    return reply


class AnsweringGrid(RecordingGrid):
    """Answers query messages at once with a per-node loss; nodes in ``silent`` never answer."""

    def __init__(self, losses: dict[int, float], silent: set[int] = frozenset()) -> None:
        super().__init__(list(losses))
        self.losses, self.silent = losses, silent

    def answer(self, message: Message) -> Message | None:
        node = message.metadata.dst_node_id
        if node in self.silent:
            return None
        assert message.metadata.message_type == MessageType.QUERY
        return _from(_reply(message, None, {keys.NUM_EXAMPLES: 10 * node,
                                            keys.QUERY_LOSS: self.losses[node]},
                            f"site-{node}"), node)


def test_pow_d_queries_candidates_and_records_the_selection():
    from strategies.rounds.round_policy import RoundPolicy  # noqa: PLC0415

    grid = AnsweringGrid({1: 0.3, 2: 2.0, 3: 1.0, 4: 5.0}, silent={4})
    strategy = FederatedStrategy(
        aggregator=AGGREGATORS.create("fedavg"), schedule=SCHEDULES.create("fixed", tau0=2),
        selector=SELECTORS.create("pow-d", m=2, d=4, seed=0), min_nodes=2,
        node_wait_timeout=1, policy=RoundPolicy(deadline=0.1, quorum=3, timeout=0.3,
                                                poll_interval=0.02))
    messages = list(strategy.configure_train(1, _global_record(), ConfigRecord(), grid))
    # node 4 (highest loss) never answered the query: the best two that did are 2 and 3
    assert sorted(m.metadata.dst_node_id for m in messages) == [2, 3]
    assert all(m.metadata.message_type == MessageType.TRAIN for m in messages)
    report = strategy.reports[1]
    assert sorted(report.selection["selected"]) == ["site-2", "site-3"]
    assert report.selection["losses"] == {"site-1": 0.3, "site-2": 2.0, "site-3": 1.0}
    assert report.strategy["query-bytes-down"] > 0 and report.strategy["query-bytes-up"] > 0
    assert report.times_selected == {"site-2": 1.0, "site-3": 1.0}


def test_a_known_site_that_disconnected_is_recorded_as_failed():
    strategy = make_strategy(min_nodes=1)
    m = _configured(strategy, [1, 2])
    d = [np.zeros(2, np.float32), np.zeros((1, 1), np.float32), np.array(0, np.int64)]
    strategy.aggregate_train(1, [_reply(m[0], d, _train_metrics(2), "site-a"),
                                 _reply(m[1], d, _train_metrics(2), "site-b")])
    grid = FakeGrid([1])  # site-b's SuperNode is gone
    messages = list(strategy.configure_train(2, _global_record(), ConfigRecord(), grid))
    assert [msg.metadata.dst_node_id for msg in messages] == [1]
    assert strategy.reports[2].train_dropped == {
        "site-b": "site offline: not connected to the SuperLink"}


class SuperLinkGrid(RecordingGrid):
    """Sites answer train and evaluate messages at once; from round ``gone_from`` on,
    node ``gone`` is unreachable and the SuperLink answers for it as Flower 1.41 does:
    an error reply (NODE_UNAVAILABLE) whose source is the SuperLink's node id."""

    def __init__(self, nodes: list[int], gone: int, gone_from: int) -> None:
        super().__init__(nodes)
        self.gone, self.gone_from = gone, gone_from

    def answer(self, message: Message) -> Message:
        node = message.metadata.dst_node_id
        if node == self.gone and (message.content[keys.CONFIG][keys.SERVER_ROUND]
                                  >= self.gone_from):
            return _from(Message(Error(code=ErrorCode.NODE_UNAVAILABLE,
                                       reason="Error: Node Unavailable"), reply_to=message),
                         SUPERLINK_NODE_ID)
        if message.metadata.message_type == MessageType.EVALUATE:
            return _from(_reply(message, None, {keys.NUM_EXAMPLES: 5, "val-dice": 0.5},
                                f"site-{node}"), node)
        delta = [np.zeros_like(g) for g in GLOBAL]
        return _from(_reply(message, delta, _train_metrics(2), f"site-{node}"), node)


def test_a_site_the_superlink_reports_unavailable_is_recorded_failed_under_its_name():
    from strategies.rounds.round_policy import RoundPolicy  # noqa: PLC0415

    strategy = make_strategy(min_nodes=1, fraction_evaluate=0.0,
                             policy=RoundPolicy(timeout=5.0, poll_interval=0.01))
    grid = SuperLinkGrid([2, 3], gone=3, gone_from=2)
    strategy.start(grid, _global_record(), num_rounds=2)
    assert strategy.reports[1].train_dropped == {}
    dropped = strategy.reports[2].train_dropped
    assert list(dropped) == ["site-3"]  # not "node-1" (the SuperLink's id)
    assert "Node Unavailable" in dropped["site-3"]
    assert list(strategy.reports[2].train) == ["site-2"]


def test_each_reply_is_validated_and_decoded_once_per_round(monkeypatch):
    """The reply counted toward the quorum is the one aggregated: one parse, one decode."""
    from strategies import replies  # noqa: PLC0415
    from strategies.rounds.round_policy import RoundPolicy  # noqa: PLC0415

    calls = {"decode": 0, "metrics": 0}

    def counting(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(replies, "unpack_update", counting("decode", replies.unpack_update))
    monkeypatch.setattr(replies, "_metrics", counting("metrics", replies._metrics))
    strategy = make_strategy(min_nodes=2, policy=RoundPolicy(deadline=5.0, quorum=2,
                                                             timeout=5.0, poll_interval=0.01))
    grid = SuperLinkGrid([2, 3], gone=3, gone_from=2)
    strategy.start(grid, _global_record(), num_rounds=2)
    # 2 rounds x (2 train + 2 evaluate replies), each validated once; in round 2
    # site-3's replies are SuperLink errors, rejected before their update is decoded
    assert calls == {"decode": 2 + 1, "metrics": 2 * 4}
    assert list(strategy.reports[2].train) == ["site-2"]
    assert strategy.reports[1].evaluate_aggregate["val-dice"] == pytest.approx(0.5)


def test_a_round_observer_returning_true_stops_the_federation_after_that_round():
    """Early stopping: ``on_round_end`` returning true ends the loop (issue 15)."""
    from strategies.rounds.round_policy import RoundPolicy  # noqa: PLC0415

    strategy = make_strategy(min_nodes=1, fraction_evaluate=0.0,
                             policy=RoundPolicy(timeout=5.0, poll_interval=0.01))
    seen = []

    def observer(report, arrays):
        seen.append(report.server_round)
        return report.server_round == 2

    result = strategy.start(SuperLinkGrid([2], gone=99, gone_from=1), _global_record(),
                            num_rounds=5, on_round_end=observer)
    assert seen == [1, 2] and sorted(strategy.reports) == [1, 2]
    assert result.arrays is not None
