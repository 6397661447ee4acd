"""The strategy's train stage with a downlink codec: headers, acknowledgements, bytes down."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from strategies.downlink_feature import DownlinkFeature
from strategies.rounds.instructions import pack_arrays
from strategies.plugins.registries import AGGREGATORS, SCHEDULES, SELECTORS
from strategies.rounds.active_features import active_features
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.wire import message_keys as keys
from strategies.wire.downlink_header import DownlinkHeader, PAYLOAD_KEY, RAW_KEY
from strategies.wire.update_codec import pack_update
from tests.strategies.scripted_grid import flower_round, scripted_grid

pytestmark = pytest.mark.usefixtures("server_identity")

WEIGHTS = np.linspace(-1.0, 1.0, 4000, dtype=np.float32)


class Site:
    """A scripted site: it keeps each instruction it receives and answers it with a small
    update, acknowledging the downlink version ``acks[server round]`` (None: none)."""

    def __init__(self, name: str, acks: dict[int, int | None]) -> None:
        self.name, self.acks = name, acks
        self.received: list[Message] = []

    def __call__(self, instruction: Message) -> Message:
        self.received.append(instruction)
        return _reply(instruction, self.name,
                      self.acks[instruction.content[keys.CONFIG][keys.SERVER_ROUND]])


def _strategy(downlink: str) -> FederatedStrategy:
    return FederatedStrategy(aggregator=AGGREGATORS.create("fedavg"),
                             schedule=SCHEDULES.create("fixed", tau0=4),
                             selector=SELECTORS.create("uniform"), min_nodes=2,
                             node_wait_timeout=1,
                             features=active_features(downlink_codec=downlink))


def _model(weights: np.ndarray) -> ArrayRecord:
    return ArrayRecord({"w": Array(weights), "n": Array(np.array(3, np.int64))})


def _train(strategy: FederatedStrategy, server_round: int, model: ArrayRecord,
           sites: dict[int, Site]) -> tuple[ArrayRecord | None, dict[int, Message]]:
    """One train round on ``sites``: the new model and the instruction each node received."""
    new, _ = flower_round(strategy, server_round, scripted_grid(sites), model,
                          ConfigRecord({"lr": 0.1}))
    return new, {node: site.received[-1] for node, site in sites.items()}


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
    _, messages = _train(strategy, 1, model, {11: Site("s0", {1: None}),
                                              12: Site("s1", {1: None})})
    for message in messages.values():
        assert not any(k.startswith("downlink-") for k in message.content[keys.CONFIG])
        sent, packed = message.content[keys.ARRAYS], pack_arrays(model)
        assert list(sent.keys()) == list(packed.keys())
        assert all(sent[k].numpy().tobytes() == packed[k].numpy().tobytes() for k in packed)
    assert not any(k.startswith("downlink-") for k in strategy.reports[1].strategy)


def test_acknowledged_site_gets_the_step_the_other_a_snapshot():
    strategy = _strategy("topk:0.01")
    sites = {11: Site("a", {1: 1, 2: 2}), 12: Site("b", {1: None, 2: 2})}
    new, first = _train(strategy, 1, _model(WEIGHTS), sites)
    headers = [DownlinkHeader.from_config(m.content[keys.CONFIG]) for m in first.values()]
    assert [h.dense for h in headers] == [True, True] and headers[0].version == 1
    report = strategy.reports[1]
    assert report.strategy["downlink-dense"] == 2.0
    down = sum(t["bytes-down"] for t in report.traffic.values())
    assert report.strategy["downlink-ratio"] == pytest.approx(2 * (WEIGHTS.nbytes + 8) / down)
    _, second = _train(strategy, 2, new, sites)
    step = DownlinkHeader.from_config(second[11].content[keys.CONFIG])
    assert (step.base, step.version) == (1, 2)
    assert set(second[11].content[keys.ARRAYS].keys()) == {PAYLOAD_KEY, RAW_KEY}
    assert DownlinkHeader.from_config(second[12].content[keys.CONFIG]).dense
    traffic = strategy.reports[2].traffic
    assert traffic["a"]["bytes-down"] * 10 < traffic["b"]["bytes-down"]
    assert strategy.train.feature(DownlinkFeature).downlink.held == {11: 2, 12: 2}
