"""The in-process engine's Grid: Flower's message metadata, persistent site state, faults,
and the real strategy's round policy against slow, failing and vanished sites."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from app.config.run_config import RunConfig
from app.engine import InProcessGrid, SiteFaults, VirtualSite
from app.engine.grid import FIRST_NODE_ID
from app.server_app import build_strategy
from strategies.rounds.instructions import pack_arrays
from strategies.rounds.reply_intake import NO_REPLY
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from tests.fixtures.scripted_site import ScriptedSite

pytestmark = pytest.mark.usefixtures("server_identity")  # run 42, the SuperLink's node 1

WEIGHTS = [np.array([1.0, 2.0], np.float32), np.array(3, np.int64)]


def _site(name: str, faults: SiteFaults | None = None, handler=None) -> VirtualSite:
    return VirtualSite({"site-name": name}, handler or ScriptedSite(name), faults or SiteFaults())


def _instruction(node: int, server_round: int = 1,
                 kind: str = MessageType.EVALUATE) -> Message:
    content = RecordDict({keys.ARRAYS: pack_arrays(ArrayRecord(WEIGHTS)),
                          keys.CONFIG: ConfigRecord({keys.SERVER_ROUND: server_round})})
    return Message(content, dst_node_id=node, message_type=kind)


def test_metadata_is_what_flowers_grid_gives():
    seen: list[Message] = []

    def recording(message: Message, context: Context) -> Message:
        seen.append(message)
        return ScriptedSite("a")(message, context)

    grid = InProcessGrid([_site("a", handler=recording)], run_id=42)
    node = next(iter(grid.get_node_ids()))
    sent = _instruction(node)
    [message_id] = grid.push_messages([sent])
    [reply] = grid.pull_messages([message_id])
    assert sent.metadata.message_id == message_id != ""
    received = seen[0]
    assert received is not sent  # the site gets its own copy, as over the wire
    assert received.metadata.message_id == message_id and received.metadata.delivered_at
    assert received.metadata.run_id == 42 and received.metadata.src_node_id == SUPERLINK_NODE_ID
    meta = reply.metadata
    assert meta.reply_to_message_id == message_id and meta.message_id not in ("", message_id)
    assert (meta.src_node_id, meta.dst_node_id, meta.run_id) == (node, SUPERLINK_NODE_ID, 42)
    assert meta.message_type == MessageType.EVALUATE and meta.delivered_at
    assert list(grid.pull_messages([message_id])) == []  # each reply is pulled once


def test_each_site_keeps_one_context_across_messages():
    sites = [_site("a"), _site("b")]
    grid = InProcessGrid(sites, run_config={"seed": 3}, run_id=42)
    for _ in range(3):
        grid.send_and_receive([_instruction(sites[0].node_id)])
    grid.send_and_receive([_instruction(sites[1].node_id)])
    assert [s.context.state["scripted"]["answered"] for s in sites] == [3, 1]
    assert sites[0].context.run_config == {"seed": 3} and sites[0].context.run_id == 42
    assert sites[0].context.node_config == {"site-name": "a"}
    assert sites[0].node_id != sites[1].node_id and SUPERLINK_NODE_ID not in grid.get_node_ids()


def test_a_raising_handler_is_answered_as_a_supernode_does():
    def broken(message: Message, context: Context) -> Message:
        raise ZeroDivisionError("division by zero")

    grid = InProcessGrid([_site("a", handler=broken)], run_id=42)
    [reply] = grid.send_and_receive([_instruction(grid.sites.popitem()[0])])
    assert reply.has_error() and reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert reply.error.reason == "<class 'ZeroDivisionError'>:<'division by zero'>"


def test_a_reply_that_claims_another_node_is_refused_and_the_site_is_silent():
    def forger(message: Message, context: Context) -> Message:
        reply = ScriptedSite("a")(message, context)
        reply.metadata.__dict__["_src_node_id"] = 777
        return reply

    grid = InProcessGrid([_site("a", handler=forger)], run_id=42)
    ids = list(grid.push_messages([_instruction(grid.sites.popitem()[0])]))
    assert list(grid.pull_messages(ids)) == [] and grid.unanswered() == set(ids)


def test_an_instruction_to_an_unknown_node_is_not_stored():
    grid = InProcessGrid([_site("a")], run_id=42)
    assert list(grid.push_messages([_instruction(999)])) == []


def test_latency_holds_the_reply_back():
    grid = InProcessGrid([_site("a", SiteFaults(latency=3600))], run_id=42)
    ids = list(grid.push_messages([_instruction(grid.sites.popitem()[0])]))
    assert list(grid.pull_messages(ids)) == [] and not grid.unanswered()


def test_disconnect_unlists_the_node_and_the_superlink_answers_for_it():
    sites = [_site("a"), _site("b", SiteFaults(disconnect_from_round=2))]
    grid = InProcessGrid(sites, run_id=42)
    gone = sites[1].node_id
    assert sorted(grid.get_node_ids()) == sorted(s.node_id for s in sites)
    [answered] = grid.send_and_receive([_instruction(gone, server_round=1)])
    assert answered.has_content()
    [reply] = grid.send_and_receive([_instruction(gone, server_round=2)])
    assert reply.has_error() and reply.error.code == ErrorCode.NODE_UNAVAILABLE
    assert reply.metadata.src_node_id == SUPERLINK_NODE_ID
    assert list(grid.get_node_ids()) == [sites[0].node_id]


def test_faults_are_checked():
    with pytest.raises(ValueError, match="latency"):
        SiteFaults(latency=-1)
    with pytest.raises(ValueError, match="distinct"):
        InProcessGrid([VirtualSite({}, node_id=5), VirtualSite({}, node_id=5)])


def _one_round(faults: dict[int, SiteFaults], **run_config) -> dict:
    """One round of the real strategy on three scripted sites; its report."""
    sites = [_site(f"site-{i}", faults.get(i)) for i in range(3)]
    grid = InProcessGrid(sites, run_id=42)
    config = RunConfig.from_mapping({"min-nodes": 3, "node-wait-timeout": 5, **run_config})
    strategy = build_strategy(config)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(
        [np.zeros(2, np.float32), np.array(0, np.int64)]), num_rounds=1)
    return strategy.reports[1]


def test_a_slow_site_past_the_deadline_is_dropped_once_the_quorum_is_in():
    report = _one_round({2: SiteFaults(latency=3600)}, **{
        "round.deadline": 0.2, "round.quorum": 2, "round-timeout": 3600})
    # never heard from: recorded under its node id (a site's name comes with its first reply)
    assert report.train_dropped == {f"node-{FIRST_NODE_ID + 2}": NO_REPLY}
    assert sorted(report.train) == ["site-0", "site-1"]


def test_a_failing_site_is_dropped_with_its_error():
    report = _one_round({1: SiteFaults(fail_from_round=1)})
    assert list(report.train_dropped) == [f"node-{FIRST_NODE_ID + 1}"]
    assert "InjectedFault" in report.train_dropped[f"node-{FIRST_NODE_ID + 1}"]
    assert sorted(report.train) == ["site-0", "site-2"]


def test_a_silent_site_is_not_waited_for_beyond_the_round_policy():
    report = _one_round({0: SiteFaults(silent_from_round=1)}, **{
        "round.deadline": 0.2, "round.quorum": 2, "round-timeout": 3600})
    assert report.train_dropped == {f"node-{FIRST_NODE_ID}": NO_REPLY}
    assert report.evaluate_dropped == {f"node-{FIRST_NODE_ID}": NO_REPLY}
    assert sorted(report.evaluate) == ["site-1", "site-2"]


def test_a_site_can_drop_out_at_one_secure_aggregation_stage():
    faults = SiteFaults(silent_stages=("unmask",))
    assert faults.silent(1, "unmask") and faults.silent(7, "unmask")
    assert not faults.silent(1, "collect") and not faults.silent(1)
    with pytest.raises(ConfigError, match="not SecAgg\\+ stages"):
        SiteFaults(silent_stages=("train",))
