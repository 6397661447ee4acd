"""The strategy's train stage with a downlink codec: headers, acknowledgements, bytes down."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from strategies import message_keys as keys
from strategies.downlink_header import PAYLOAD_KEY, RAW_KEY, DownlinkHeader
from strategies.model_packing import pack_arrays
from strategies.plugins.registries import AGGREGATORS, SCHEDULES, SELECTORS
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.update_codec import pack_update

pytestmark = pytest.mark.usefixtures("server_identity")

WEIGHTS = np.linspace(-1.0, 1.0, 4000, dtype=np.float32)


class Grid:
    """The part of flwr's Grid the strategy uses."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)


def _strategy(downlink: str) -> FederatedStrategy:
    return FederatedStrategy(aggregator=AGGREGATORS.create("fedavg"),
                             schedule=SCHEDULES.create("fixed", tau0=4),
                             selector=SELECTORS.create("uniform"), min_nodes=2,
                             node_wait_timeout=1, downlink_codec=downlink)


def _model(weights: np.ndarray) -> ArrayRecord:
    return ArrayRecord({"w": Array(weights), "n": Array(np.array(3, np.int64))})


def _train(strategy: FederatedStrategy, server_round: int, model: ArrayRecord) -> list[Message]:
    messages = list(strategy.configure_train(server_round, model, ConfigRecord({"lr": 0.1}),
                                             Grid([11, 12])))
    for i, message in enumerate(messages):  # as Flower stamps them when it pushes them
        message.metadata.__dict__["_message_id"] = f"msg-{server_round}-{i}"
        message.metadata.__dict__["_src_node_id"] = 1
    return messages


def _reply(instruction: Message, site: str, version: int | None) -> Message:
    delta = [np.full(WEIGHTS.size, 0.01, np.float32), np.array(0, np.int64)]
    metrics = {keys.NUM_EXAMPLES: 10, keys.STEPS: 4, keys.TRAIN_LOSS: 0.5,
               keys.INITIAL_LOSS: 1.0}
    if version is not None:
        metrics[keys.DOWNLINK_VERSION] = version
    packed = pack_update(delta, "none")
    return Message(RecordDict({
        keys.SITE: ConfigRecord({keys.SITE_NAME: site}), keys.METRICS: MetricRecord(metrics),
        keys.DELTA: ArrayRecord({k: Array(v) for k, v in packed.items()})}),
        reply_to=instruction)


def test_downlink_none_sends_the_packed_model_as_before():
    model, strategy = _model(WEIGHTS), _strategy("none")
    messages = _train(strategy, 1, model)
    for message in messages:
        assert not any(k.startswith("downlink-") for k in message.content[keys.CONFIG])
        sent, packed = message.content[keys.ARRAYS], pack_arrays(model)
        assert list(sent.keys()) == list(packed.keys())
        assert all(sent[k].numpy().tobytes() == packed[k].numpy().tobytes() for k in packed)
    strategy.aggregate_train(1, [_reply(m, f"s{i}", None) for i, m in enumerate(messages)])
    assert not any(k.startswith("downlink-") for k in strategy.reports[1].strategy)


def test_acknowledged_site_gets_the_step_the_other_a_snapshot():
    strategy = _strategy("topk:0.01")
    first = _train(strategy, 1, _model(WEIGHTS))
    headers = [DownlinkHeader.from_config(m.content[keys.CONFIG]) for m in first]
    assert [h.dense for h in headers] == [True, True] and headers[0].version == 1
    by_node = {m.metadata.dst_node_id: m for m in first}
    new, _ = strategy.aggregate_train(1, [_reply(by_node[11], "a", 1),
                                          _reply(by_node[12], "b", None)])
    report = strategy.reports[1]
    assert report.strategy["downlink-dense"] == 2.0
    down = sum(t["bytes-down"] for t in report.traffic.values())
    assert report.strategy["downlink-ratio"] == pytest.approx(2 * (WEIGHTS.nbytes + 8) / down)
    second = {m.metadata.dst_node_id: m for m in _train(strategy, 2, new)}
    step = DownlinkHeader.from_config(second[11].content[keys.CONFIG])
    assert (step.base, step.version) == (1, 2)
    assert set(second[11].content[keys.ARRAYS].keys()) == {PAYLOAD_KEY, RAW_KEY}
    assert DownlinkHeader.from_config(second[12].content[keys.CONFIG]).dense
    strategy.aggregate_train(2, [_reply(second[11], "a", 2), _reply(second[12], "b", 2)])
    traffic = strategy.reports[2].traffic
    assert traffic["a"]["bytes-down"] * 10 < traffic["b"]["bytes-down"]
    assert strategy.train.downlink.held == {11: 2, 12: 2}
