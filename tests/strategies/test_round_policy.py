"""Deadline and quorum: a stalled site does not hold the round; its late reply is logged."""

from __future__ import annotations

import time

import pytest
from flwr.app import ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from strategies.rounds.round_policy import RoundPolicy, collect_replies


pytestmark = pytest.mark.usefixtures("server_identity")


class TimedGrid:
    """Nodes answer after a per-node delay (None: never)."""

    def __init__(self, delays: dict[int, float | None]) -> None:
        self.delays = delays
        self.sent: dict[str, tuple[Message, float]] = {}

    def push_messages(self, messages):
        ids = []
        for message in messages:
            mid = f"id-{len(self.sent)}"
            message.metadata.__dict__["_message_id"] = mid
            self.sent[mid] = (message, time.monotonic())
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        out = []
        for mid in message_ids:
            message, sent_at = self.sent[mid]
            delay = self.delays[message.metadata.dst_node_id]
            if delay is not None and time.monotonic() - sent_at >= delay:
                reply = Message(RecordDict({"metrics": MetricRecord({"x": 1.0})}),
                                reply_to=message)
                reply.metadata.__dict__["_src_node_id"] = message.metadata.dst_node_id
                out.append(reply)
        return out


def _messages(nodes):
    return [Message(RecordDict({"config": ConfigRecord()}), dst_node_id=n,
                    message_type="train") for n in nodes]


def test_quorum_at_the_deadline_closes_the_round_without_the_straggler():
    grid = TimedGrid({1: 0.0, 2: 0.0, 3: 0.6})
    late: dict[str, int] = {}
    policy = RoundPolicy(deadline=0.2, quorum=2, timeout=5.0, poll_interval=0.02)
    got = collect_replies(grid, _messages([1, 2, 3]), policy, lambda m: True, late)
    assert sorted(r.metadata.src_node_id for r in got.replies) == [1, 2]
    assert got.missing == [3]
    assert got.seconds < 0.6
    time.sleep(0.7)
    nxt = collect_replies(grid, [], policy, lambda m: True, late)
    assert [r.metadata.src_node_id for r in nxt.late] == [3]
    assert late == {}


def test_without_quorum_it_waits_past_the_deadline_until_the_timeout():
    grid = TimedGrid({1: 0.0, 2: None})
    policy = RoundPolicy(deadline=0.05, quorum=2, timeout=0.3, poll_interval=0.02)
    got = collect_replies(grid, _messages([1, 2]), policy, lambda m: True, {})
    assert [r.metadata.src_node_id for r in got.replies] == [1]
    assert got.missing == [2]
    assert got.seconds >= 0.3


def test_invalid_replies_do_not_count_towards_the_quorum():
    grid = TimedGrid({1: 0.0, 2: 0.0, 3: 0.3})
    policy = RoundPolicy(deadline=0.05, quorum=2, timeout=5.0, poll_interval=0.02)
    got = collect_replies(grid, _messages([1, 2, 3]), policy,
                          lambda m: m.metadata.src_node_id != 2, {})
    assert len(got.replies) == 3  # waited for node 3 since node 2's reply was invalid


def test_everyone_answers_returns_at_once():
    grid = TimedGrid({1: 0.0, 2: 0.0})
    got = collect_replies(grid, _messages([1, 2]), RoundPolicy(timeout=5.0, poll_interval=0.02),
                          lambda m: True, {})
    assert got.missing == [] and got.seconds < 0.5


def test_bad_policy():
    with pytest.raises(ValueError):
        RoundPolicy(deadline=-1)


class UnreachableGrid(TimedGrid):
    """Like :class:`TimedGrid`; for the nodes in ``gone`` (once ``gone`` is set) the
    SuperLink answers itself, as Flower does when a node's heartbeat expired: an
    error reply (NODE_UNAVAILABLE) whose source is the SuperLink's node id."""

    def __init__(self, delays: dict[int, float | None]) -> None:
        super().__init__(delays)
        self.gone: set[int] = set()

    def pull_messages(self, message_ids):
        out = list(super().pull_messages(message_ids))
        answered = {r.metadata.reply_to_message_id for r in out}
        for mid in message_ids:
            message, _ = self.sent[mid]
            if mid not in answered and message.metadata.dst_node_id in self.gone:
                reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE,
                                      reason="Error: Node Unavailable"), reply_to=message)
                reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
                out.append(reply)
        return out


def test_the_superlinks_node_unavailable_reply_is_attributed_to_the_unreachable_node():
    grid = UnreachableGrid({5: 0.0, 6: None})
    grid.gone = {6}
    policy = RoundPolicy(deadline=0.0, quorum=0, timeout=5.0, poll_interval=0.02)
    got = collect_replies(grid, _messages([5, 6]), policy, lambda m: m.has_content(), {})
    assert got.missing == [] and got.seconds < 1.0  # the error reply closes the wait
    sources = {r.metadata.src_node_id: r for r in got.replies}
    assert sorted(sources) == [5, 6]  # not the SuperLink's own id
    assert sources[6].has_error() and sources[6].error.code == ErrorCode.NODE_UNAVAILABLE
    assert not sources[5].has_error()


def test_a_late_node_unavailable_reply_is_attributed_to_its_node():
    grid = UnreachableGrid({5: 0.0, 6: None})
    late: dict[str, int] = {}
    policy = RoundPolicy(deadline=0.05, quorum=1, timeout=5.0, poll_interval=0.02)
    got = collect_replies(grid, _messages([5, 6]), policy, lambda m: True, late)
    assert got.missing == [6] and list(late.values()) == [6]
    grid.gone = {6}  # its heartbeat expires after the round closed
    nxt = collect_replies(grid, [], policy, lambda m: True, late)
    assert [r.metadata.src_node_id for r in nxt.late] == [6]
    assert nxt.late[0].has_error() and late == {}


def test_each_reply_carries_the_seconds_from_send_to_receipt():
    """``reply_seconds`` orders like ``replies``: a slow node's reply took longer."""
    grid = TimedGrid({1: 0.0, 2: 0.15})
    got = collect_replies(grid, _messages([1, 2]), RoundPolicy(timeout=5.0, poll_interval=0.01),
                          lambda m: True, {})
    by_node = dict(zip((r.metadata.src_node_id for r in got.replies), got.reply_seconds))
    assert by_node[1] < by_node[2] and 0.15 <= by_node[2] <= got.seconds


class AnswersOnThirdPull(TimedGrid):
    """Every node answers on the third pull; the round's waits between pulls are recorded."""

    def __init__(self) -> None:
        super().__init__({})
        self.pulls = 0

    def pull_messages(self, message_ids):
        self.pulls += 1
        if self.pulls < 3:
            return []
        self.delays = {m.metadata.dst_node_id: 0.0 for m, _ in self.sent.values()}
        return super().pull_messages(message_ids)


def test_the_default_policy_asks_for_replies_every_tenth_of_a_second(monkeypatch):
    """Found in bench/site_overhead.py: a reply waited 0.25 s on average for the next pull
    (0.5 s apart), a share of the < 1 s a message may cost at a hospital."""
    import strategies.rounds.round_policy as round_policy

    waits: list[float] = []
    monkeypatch.setattr(round_policy.time, "sleep", waits.append)
    grid = AnswersOnThirdPull()
    got = collect_replies(grid, _messages([1, 2]), RoundPolicy(), lambda m: True, {})
    assert len(got.replies) == 2 and grid.pulls == 3
    assert waits == [pytest.approx(0.1)] * 2
