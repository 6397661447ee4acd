"""Reply channels: the side payloads a train reply may carry are the active features' (#45).

A round feature declares its channels (``RoundFeature.channels``); the reply parser takes
those and names no feature; a side payload no active feature asked for makes the reply
unusable (dropped, the reason logged), where it was once carried along unread.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from strategies.compression import encode
from strategies.rounds.reply_intake import InvalidReplyError, parse_train_reply
from strategies.rounds.round_feature import RoundFeature, RoundReplies
from strategies.rounds.round_report import RoundReport
from strategies.wire import message_keys as keys
from strategies.wire.update_codec import pack_update
from tests.strategies.scripted_grid import flower_round, scripted_grid
from tests.strategies.test_round_feature_seam import FEATURE_NAMES, WEIGHTS, _strategy

pytestmark = pytest.mark.usefixtures("server_identity")

ROOT = Path(__file__).resolve().parents[2]
SIDE = "spy-side"
METRICS = {keys.NUM_EXAMPLES: 10, keys.STEPS: 2, keys.TRAIN_LOSS: 0.5, keys.INITIAL_LOSS: 1.0}


def _reply(instruction: Message | None = None) -> Message:
    packed = pack_update([np.full(WEIGHTS.size, 0.01, np.float32)], "none")
    packed[SIDE] = encode(np.ones(3, np.float32), "none")
    node = 0 if instruction is None else instruction.metadata.dst_node_id
    content = RecordDict({
        keys.SITE: ConfigRecord({keys.SITE_NAME: f"s{node}"}),
        keys.METRICS: MetricRecord(METRICS),
        keys.DELTA: ArrayRecord({k: Array(v) for k, v in packed.items()})})
    if instruction is None:
        return Message(content, dst_node_id=0, message_type="train")
    return Message(content, reply_to=instruction)


class Side(RoundFeature):
    """A feature whose replies carry the channel ``spy-side``; records what it observes."""

    channels = (SIDE,)

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def observe(self, report: RoundReport, replies: RoundReplies) -> dict[str, float]:
        self.seen.extend(reply.channels[SIDE] for reply in replies.accepted)
        return {}


#: The reply module's metric table: the names of every metric the sites send, a feature's
#: among them (``personalised-val-dice``, ``pruning-version``), with their ranges.
METRIC_TABLE = frozenset({"MetricRange", "SPLITS", "TASK_METRICS", "_SPLIT", "_RATES", "_COUNTS",
                          "_LOSSES", "_names", "DECLARED", "declared", "range_problem"})


def _bound(node: ast.stmt) -> set[str]:
    """The names a top-level statement defines."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {target.id for target in targets if isinstance(target, ast.Name)}


def test_the_reply_parser_names_no_feature():
    """The reply module's code (its parsers and intake; not its docstring or metric table)."""
    text = (ROOT / "strategies" / "rounds" / "reply_intake.py").read_text()
    body = ast.parse(text).body[1:]
    assert METRIC_TABLE <= set().union(*map(_bound, body))  # the table is still there
    code = "\n".join(ast.get_source_segment(text, node) or "" for node in body
                     if not _bound(node) & METRIC_TABLE)
    assert not FEATURE_NAMES.search(code)
    assert keys.PRUNING_SQGRAD not in code and "CONTROL_DELTA" not in code


def test_a_side_payload_is_taken_only_on_a_channel_asked_for():
    reference = [np.zeros(WEIGHTS.size, np.float32)]
    taken = parse_train_reply(_reply(), reference, node_id=1, channels=(SIDE,))
    assert list(taken.channels) == [SIDE] and taken.channels[SIDE].dtype == np.uint8
    with pytest.raises(InvalidReplyError, match=f"unexpected array '{SIDE}'"):
        parse_train_reply(_reply(), reference, node_id=1)


def test_an_unrequested_side_payload_is_dropped_with_its_reason_logged(caplog):
    strategy = _strategy([])
    with caplog.at_level(logging.WARNING):
        new, _ = flower_round(strategy, 1, scripted_grid({11: _reply, 12: _reply}),
                              ArrayRecord({"w": Array(WEIGHTS)}))
    assert new is None  # no usable reply: the model is kept
    dropped = strategy.reports[1].train_dropped
    assert set(dropped) == {"s11", "s12"}
    assert all(f"unexpected array '{SIDE}'" in why for why in dropped.values())
    assert f"dropped reply of s11: unexpected array '{SIDE}'" in caplog.text


def test_a_feature_that_declares_the_channel_reads_it():
    side = Side()
    strategy = _strategy([side])
    new, _ = flower_round(strategy, 1, scripted_grid({11: _reply, 12: _reply}),
                          ArrayRecord({"w": Array(WEIGHTS)}))
    assert new is not None and not strategy.reports[1].train_dropped
    assert len(side.seen) == 2 and all(s.dtype == np.uint8 for s in side.seen)
