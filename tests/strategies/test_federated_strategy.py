"""FederatedStrategy on the in-process engine: messages, validation, FedAvg, waits."""

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

from app.engine import SiteFaults
from strategies.plugins.registries import AGGREGATORS, SCHEDULES, SELECTORS
from strategies.rounds.instructions import NodeWaitTimeout, wait_for_nodes
from strategies.rounds.federated_strategy import FederatedStrategy, NoValidRepliesError
from strategies.rounds.round_policy import RoundPolicy
from strategies.wire import message_keys as keys
from strategies.wire.update_codec import pack_update
from tests.strategies.scripted_grid import connected, flower_round, scripted_grid

def make_strategy(min_nodes: int = 2, aggregator: str = "fedavg", schedule: str = "fixed",
                  **kwargs) -> FederatedStrategy:
    return FederatedStrategy(
        aggregator=AGGREGATORS.create(aggregator),
        schedule=SCHEDULES.create(schedule, tau0=8),
        selector=SELECTORS.create("uniform"),
        min_nodes=min_nodes, node_wait_timeout=1, **kwargs)


pytestmark = pytest.mark.usefixtures("server_identity")


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


def test_each_site_gets_its_own_content_and_config():
    strategy = make_strategy(min_nodes=2)
    messages = list(strategy.configure_train(1, _global_record(), ConfigRecord({"lr": 0.1}),
                                             connected([11, 12, 13])))
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
    d1 = [np.array([1.0, 1.0], np.float32), np.array([[2.0]], np.float32), np.array(-1, np.int64)]
    d2 = [np.array([4.0, -2.0], np.float32), np.array([[-1.0]], np.float32), np.array(-1, np.int64)]
    nan = pack_update(d1, "none")
    nan["payload"] = nan["payload"].copy()
    nan["payload"][7:11] = np.frombuffer(np.float32(np.nan).tobytes(), np.uint8)
    wrong_shape = [np.zeros(3, np.float32), d1[1], d1[2]]
    grid = scripted_grid({
        11: lambda m: _reply(m, d1, _train_metrics(1), "site-a"),
        12: lambda m: _reply(m, d2, _train_metrics(3), "site-b"),
        13: lambda m: _reply(m, nan, _train_metrics(5), "site-nan"),
        14: lambda m: _reply(m, wrong_shape, _train_metrics(5), "site-shape"),
        15: lambda m: _reply(m, d1, {keys.NUM_EXAMPLES: 5}, "site-missing"),
        16: lambda m: Message(Error(code=0, reason="boom: disk full"), reply_to=m)})
    arrays, metrics = flower_round(strategy, 1, grid, _global_record())
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
    assert "boom: disk full" in dropped["node-16"]
    assert metrics[keys.NUM_EXAMPLES] == 4.0
    assert metrics[keys.TRAIN_LOSS] == pytest.approx(0.5)


def _zeros(message: Message) -> Message:
    """A train reply of a zero update from site ``site-<node>``."""
    node = message.metadata.dst_node_id
    return _reply(message, [np.zeros_like(g) for g in GLOBAL], _train_metrics(2), f"site-{node}")


def test_missing_replies_are_recorded_as_timeouts():
    strategy = make_strategy(min_nodes=1)
    flower_round(strategy, 1, scripted_grid({11: _zeros}, silent=[12]), _global_record())
    assert strategy.reports[1].train_dropped == {
        "node-12": "no reply before the round closed (deadline or timeout)"}


def test_rounds_without_usable_replies_keep_the_model_then_abort():
    strategy = make_strategy(min_nodes=1, max_empty_rounds=2, fraction_evaluate=0.0,
                             policy=RoundPolicy(timeout=0.2, poll_interval=0.01))
    seen = []
    with pytest.raises(NoValidRepliesError, match="2 consecutive rounds"):
        strategy.start(scripted_grid({}, silent=[11]), _global_record(), num_rounds=3,
                       on_round_end=lambda report, arrays: seen.append(arrays))
    assert len(seen) == 1  # round 1 kept the model; round 2 aborted
    np.testing.assert_array_equal(seen[0].to_numpy_ndarrays()[0], GLOBAL[0])


def test_evaluate_metrics_are_example_weighted():
    strategy = make_strategy(min_nodes=2)
    grid = scripted_grid({
        11: lambda m: _reply(m, None, {keys.NUM_EXAMPLES: 10, "val-dice": 0.2}, "a"),
        12: lambda m: _reply(m, None, {keys.NUM_EXAMPLES: 30, "val-dice": 0.6}, "b")})
    messages = strategy.configure_evaluate(1, _global_record(), ConfigRecord(), grid)
    metrics = strategy.aggregate_evaluate(1, grid.send_and_receive(messages, timeout=5.0))
    assert metrics["val-dice"] == pytest.approx(0.5)
    assert strategy.reports[1].evaluate["b"]["val-dice"] == pytest.approx(0.6)


def test_node_wait_is_bounded():
    with pytest.raises(NodeWaitTimeout, match="only 1 of the required 3 sites"):
        wait_for_nodes(connected([5]), min_nodes=3, timeout=0.2, poll_interval=0.05)
    assert wait_for_nodes(connected([3, 2]), min_nodes=2, timeout=0.2) == [2, 3]


@pytest.mark.parametrize(("aggregator", "expected"), [("fedavg", 0.30), ("fednova", 0.0)])
def test_hand_computed_fedavg_and_fednova(aggregator, expected):
    """Scalar model, F_i(x) = g_i x, eta 0.1, p = (.5, .5), tau = (2, 8), g = (1, -1), x = 0.

    Local SGD gives delta_i = eta tau_i g_i = (0.2, -0.8): FedAvg moves x to
    -(0.5 * 0.2 - 0.5 * 0.8) = +0.30; FedNova normalises by ||a_i|| = tau_i and
    rescales by tau_eff = 5, which gives exactly 0.0 (Wang et al. 2020, Sec. 3).
    """
    # FedNova's steps floor at 2 of 8 (fednova.min-steps-fraction 0.25) keeps tau_2 = 2
    options = {"min_steps_fraction": 0.25} if aggregator == "fednova" else {}
    strategy = FederatedStrategy(aggregator=AGGREGATORS.create(aggregator, **options),
                                 schedule=SCHEDULES.create("fixed", tau0=8),
                                 selector=SELECTORS.create("uniform"),
                                 min_nodes=2, node_wait_timeout=1)
    grid = scripted_grid({
        11: lambda m: _reply(m, [np.array([0.2])], _train_metrics(10, steps=2, a_norm=2.0),
                             "a"),
        12: lambda m: _reply(m, [np.array([-0.8])], _train_metrics(10, steps=8, a_norm=8.0),
                             "b")})
    arrays, _ = flower_round(strategy, 1, grid, ArrayRecord([np.zeros(1)]))
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
    from strategies.rounds.reply_intake import TrainReply  # noqa: PLC0415

    return TrainReply(node_id=1, site="s", delta=[], num_examples=10, steps=1, train_loss=1.0,
                      metrics={keys.INITIAL_LOSS: initial_loss})


def _query_answer(losses: dict[int, float]):
    """Answers a query with the node's loss in ``losses``."""
    def answer(message: Message) -> Message:
        node = message.metadata.dst_node_id
        assert message.metadata.message_type == MessageType.QUERY
        return _reply(message, None, {keys.NUM_EXAMPLES: 10 * node,
                                      keys.QUERY_LOSS: losses[node]}, f"site-{node}")
    return answer


def test_pow_d_queries_candidates_and_records_the_selection():
    losses = {5: 0.3, 2: 2.0, 3: 1.0, 4: 5.0}
    grid = scripted_grid({node: _query_answer(losses) for node in (2, 3, 5)}, silent=[4])
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
    assert report.selection["losses"] == {"site-5": 0.3, "site-2": 2.0, "site-3": 1.0}
    assert report.strategy["query-bytes-down"] > 0 and report.strategy["query-bytes-up"] > 0
    assert report.times_selected == {"site-2": 1.0, "site-3": 1.0}


def test_a_known_site_that_disconnected_is_recorded_as_failed():
    strategy = make_strategy(min_nodes=1)
    flower_round(strategy, 1, scripted_grid({2: _zeros, 3: _zeros}), _global_record())
    # site-3's SuperNode is gone: the grid of round 2 no longer lists it
    messages = list(strategy.configure_train(2, _global_record(), ConfigRecord(),
                                             scripted_grid({2: _zeros})))
    assert [msg.metadata.dst_node_id for msg in messages] == [2]
    assert strategy.reports[2].train_dropped == {
        "site-3": "site offline: not connected to the SuperLink"}


def _answers(message: Message) -> Message:
    """Evaluate: 5 examples, val-dice 0.5; train: a zero update (site ``site-<node>``)."""
    node = message.metadata.dst_node_id
    if message.metadata.message_type == MessageType.EVALUATE:
        return _reply(message, None, {keys.NUM_EXAMPLES: 5, "val-dice": 0.5}, f"site-{node}")
    return _zeros(message)


def _superlink_grid(nodes: list[int], gone: int, gone_from: int):
    """Sites answer train and evaluate at once; from round ``gone_from`` on node ``gone`` is
    unreachable and the SuperLink answers for it as Flower 1.41 does: an error reply
    (NODE_UNAVAILABLE) whose source is the SuperLink's node id."""
    return scripted_grid({node: _answers for node in nodes},
                         faults={gone: SiteFaults(disconnect_from_round=gone_from)})


def test_a_site_the_superlink_reports_unavailable_is_recorded_failed_under_its_name():
    strategy = make_strategy(min_nodes=1, fraction_evaluate=0.0,
                             policy=RoundPolicy(timeout=5.0, poll_interval=0.01))
    grid = _superlink_grid([2, 3], gone=3, gone_from=2)
    strategy.start(grid, _global_record(), num_rounds=2)
    assert strategy.reports[1].train_dropped == {}
    dropped = strategy.reports[2].train_dropped
    assert list(dropped) == ["site-3"]  # not "node-1" (the SuperLink's id)
    assert "Node Unavailable" in dropped["site-3"]
    assert list(strategy.reports[2].train) == ["site-2"]


def test_each_reply_is_validated_and_decoded_once_per_round(monkeypatch):
    """The reply counted toward the quorum is the one aggregated: one parse, one decode."""
    from strategies.rounds import reply_intake  # noqa: PLC0415
    calls = {"decode": 0, "metrics": 0}

    def counting(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(reply_intake, "dense_update",
                        counting("decode", reply_intake.dense_update))
    monkeypatch.setattr(reply_intake, "unpack_update",
                        counting("decode", reply_intake.unpack_update))
    monkeypatch.setattr(reply_intake, "_metrics", counting("metrics", reply_intake._metrics))
    strategy = make_strategy(min_nodes=1, policy=RoundPolicy(deadline=5.0, quorum=2,
                                                             timeout=5.0, poll_interval=0.01))
    grid = _superlink_grid([2, 3], gone=3, gone_from=2)
    strategy.start(grid, _global_record(), num_rounds=2)
    # round 1: 2 train + 2 evaluate replies; round 2: 2 train replies (site-3's is the
    # SuperLink's error, rejected before any update is decoded) and site-2's evaluate reply
    # (site-3 is no longer listed); each validated once
    assert calls == {"decode": 2 + 1, "metrics": 4 + 3}
    assert list(strategy.reports[2].train) == ["site-2"]
    assert strategy.reports[1].evaluate_aggregate["val-dice"] == pytest.approx(0.5)


def test_each_reply_is_identity_checked_once(monkeypatch):
    """The site book sees each train and evaluate reply once (it was twice for train)."""
    from strategies.rounds.site_book import SiteBook  # noqa: PLC0415

    checked: list[tuple[int, str]] = []
    check = SiteBook.identity_problem

    def counting(book, node_id, site):
        checked.append((node_id, site))
        return check(book, node_id, site)

    monkeypatch.setattr(SiteBook, "identity_problem", counting)
    strategy = make_strategy(min_nodes=2, policy=RoundPolicy(timeout=5.0, poll_interval=0.01))
    strategy.start(_superlink_grid([2, 3], gone=99, gone_from=1000), _global_record(),
                   num_rounds=1)
    assert sorted(checked) == [(2, "site-2"), (2, "site-2"), (3, "site-3"), (3, "site-3")]
    assert sorted(strategy.reports[1].train) == ["site-2", "site-3"]


def test_a_round_observer_returning_true_stops_the_federation_after_that_round():
    """Early stopping: ``on_round_end`` returning true ends the loop (issue 15)."""
    strategy = make_strategy(min_nodes=1, fraction_evaluate=0.0,
                             policy=RoundPolicy(timeout=5.0, poll_interval=0.01))
    seen = []

    def observer(report, arrays):
        seen.append(report.server_round)
        return report.server_round == 2

    result = strategy.start(_superlink_grid([2], gone=99, gone_from=1000), _global_record(),
                            num_rounds=5, on_round_end=observer)
    assert seen == [1, 2] and sorted(strategy.reports) == [1, 2]
    assert result.arrays is not None
