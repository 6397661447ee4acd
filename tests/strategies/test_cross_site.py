"""End-of-federation test evaluation and cross-site matrix against an in-memory grid."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType
from flwr.app import MetricRecord, RecordDict

from strategies.wire import message_keys as keys
from strategies.wire.local_solver import LocalSolver
from strategies.rounds.cross_site import (
    GLOBAL_ROW,
    NO_TEST_ITEMS,
    CrossSiteSetup,
    cross_site_evaluation,
)
from strategies.rounds.instructions import Uplink, unpack_arrays
from strategies.rounds.reply_intake import NO_REPLY
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.site_book import SiteBook
from strategies.wire.update_codec import pack_update
from tests.strategies.scripted_grid import scripted_grid

pytestmark = pytest.mark.usefixtures("server_identity")

GLOBAL = [np.array([0.5, 1.0], dtype=np.float32), np.array(3, dtype=np.int64)]


class Site:
    """A fake site: test score (a metric without a range) = its offset + the model's first
    weight; it trains to +shift."""

    def __init__(self, name: str, offset: float, shift: float, examples: int = 10,
                 trains: bool = True, silent: bool = False) -> None:
        self.name, self.offset, self.shift, self.examples = name, offset, shift, examples
        self.trains, self.silent = trains, silent
        self.received: list[Message] = []

    def __call__(self, message: Message) -> Message:
        self.received.append(message)
        site = ConfigRecord({keys.SITE_NAME: self.name})
        weights = unpack_arrays(message.content[keys.ARRAYS]).to_numpy_ndarrays()
        if message.metadata.message_type == MessageType.TRAIN:
            if not self.trains:
                return Message(Error(code=4010, reason=f"site {self.name}: no train split"),
                               reply_to=message)
            delta = [np.full_like(weights[0], -self.shift), np.zeros_like(weights[1])]
            packed = pack_update(delta, "none")
            metrics = {keys.NUM_EXAMPLES: 20, keys.STEPS: 2, keys.TRAIN_LOSS: 0.4,
                       keys.INITIAL_LOSS: 0.5}
            return Message(RecordDict({
                keys.SITE: site, keys.METRICS: MetricRecord(metrics),
                keys.DELTA: ArrayRecord({k: Array(v) for k, v in packed.items()})}),
                reply_to=message)
        metrics = {keys.NUM_EXAMPLES: self.examples, "test-studies": self.examples}
        if self.examples:
            metrics.update({"test-loss": 1.0, "test-score": self.offset + float(weights[0][0])})
        return Message(RecordDict({keys.SITE: site, keys.METRICS: MetricRecord(metrics)}),
                       reply_to=message)


def _setup() -> CrossSiteSetup:
    return CrossSiteSetup(policy=RoundPolicy(timeout=0.3, poll_interval=0.01), sites=SiteBook(),
                          uplink=Uplink(codec="qsgd-8", error_feedback=True, federation="fed-1"),
                          solver=LocalSolver(), node_wait_timeout=1)


def _arrays() -> ArrayRecord:
    return ArrayRecord({"w": Array(GLOBAL[0].copy()), "n": Array(GLOBAL[1].copy())})


def _run(sites: dict[int, Site], k: int):
    grid = scripted_grid(sites, silent=[node for node, site in sites.items() if site.silent])
    return cross_site_evaluation(grid, _setup(), _arrays(), "score", k, 7,
                                 on_stage=lambda line: None)


def test_global_row_per_site_and_weighted_test_metrics_with_no_finetuning():
    a, b = Site("a", 0.0, 1.0, examples=10), Site("b", 0.25, 1.0, examples=30)
    result = _run({4: a, 2: b}, k=0)
    assert result.metric == "test-score"
    assert result.sites["a"]["test-score"] == pytest.approx(0.5)
    assert result.sites["b"]["test-score"] == pytest.approx(0.75)
    assert result.weighted["test-score"] == pytest.approx((10 * 0.5 + 30 * 0.75) / 40)
    assert result.weighted[keys.NUM_EXAMPLES] == 40
    assert result.rows == [GLOBAL_ROW] and result.columns == ["a", "b"]
    np.testing.assert_allclose(result.matrix, [[0.5, 0.75]])
    for site in (a, b):  # one evaluate message on the test split, no train message
        (message,) = site.received
        assert message.metadata.message_type == MessageType.EVALUATE
        assert message.content[keys.CONFIG][keys.EVAL_SPLIT] == "test"
        assert message.content[keys.CONFIG][keys.SERVER_ROUND] == 7
    assert result.dropped == {}


def test_finetuned_rows_are_the_sites_models_evaluated_everywhere():
    a, b = Site("a", 0.0, 1.0), Site("b", 10.0, 2.0)
    result = _run({4: a, 2: b}, k=2)
    assert result.rows == [GLOBAL_ROW, "a-finetuned", "b-finetuned"]
    # x_a = x - delta_a = 0.5 + 1.0, x_b = 0.5 + 2.0; cell = column's offset + model weight
    np.testing.assert_allclose(result.matrix, [[0.5, 10.5], [1.5, 11.5], [2.5, 12.5]])
    train = [m for m in a.received if m.metadata.message_type == MessageType.TRAIN]
    (instruction,) = train
    config = instruction.content[keys.CONFIG]
    assert config[keys.LOCAL_STEPS] == 2 and config[keys.SERVER_ROUND] == 7
    assert config[keys.CODEC] == "none" and config[keys.ERROR_FEEDBACK] is False
    assert config[keys.FEDERATION] == "fed-1"
    assert result.table() == {"model": result.rows, "a": [0.5, 1.5, 2.5],
                              "b": [10.5, 11.5, 12.5]}


def test_a_test_only_site_is_a_column_without_a_row():
    a, c = Site("a", 0.0, 1.0), Site("c", 5.0, 1.0, trains=False)
    result = _run({4: a, 3: c}, k=2)
    assert result.rows == [GLOBAL_ROW, "a-finetuned"]
    assert result.columns == ["a", "c"]
    np.testing.assert_allclose(result.matrix, [[0.5, 5.5], [1.5, 6.5]])
    assert "no train split" in result.dropped["finetune/c"]


def test_a_site_without_test_items_or_reply_is_nan_and_recorded():
    a = Site("a", 0.0, 1.0)
    empty, silent = Site("empty", 0.0, 1.0, examples=0), Site("quiet", 0.0, 1.0, silent=True)
    result = _run({4: a, 2: empty, 3: silent}, k=0)
    assert result.columns == ["a", "empty", "node-3"]
    assert result.matrix[0, 0] == pytest.approx(0.5)
    assert math.isnan(result.matrix[0, 1]) and math.isnan(result.matrix[0, 2])
    assert result.dropped["test/empty"] == NO_TEST_ITEMS
    assert result.dropped["test/node-3"] == NO_REPLY
    assert result.weighted[keys.NUM_EXAMPLES] == 10  # the empty site adds nothing


def test_a_malformed_test_reply_is_dropped_not_fatal():
    a, b = Site("a", 0.0, 1.0), Site("b", float("nan"), 1.0)
    result = _run({4: a, 2: b}, k=0)
    assert list(result.sites) == ["a"]
    assert "not finite" in result.dropped["test/b"]
    assert math.isnan(result.matrix[0, 1])


def test_negative_finetune_steps_are_refused():
    with pytest.raises(ValueError, match="finetune_steps"):
        _run({4: Site("a", 0.0, 1.0)}, k=-1)
