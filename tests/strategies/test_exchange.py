"""The one exchange under a deadline and quorum: a stalled site does not hold the round;
its late reply is logged; each reply is taken in once, for the node it answers."""

from __future__ import annotations

import time

import pytest
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict

from app.engine import InProcessGrid, SiteFaults, VirtualSite
from strategies.rounds.instructions import exchange
from strategies.rounds.reply_intake import NO_REPLY, InvalidReplyError, MetricsReply, ReplyIntake
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.site_book import SiteBook
from strategies.wire import message_keys as keys

pytestmark = pytest.mark.usefixtures("server_identity")

NEVER = None


def _answer(message: Message, context: Context) -> Message:
    """A site's reply: its name and one metric; node 2 answers with an unusable reply."""
    if context.node_id == 2:
        return Message(Error(code=0, reason="site bad: unusable"), reply_to=message)
    return Message(RecordDict({
        keys.SITE: ConfigRecord({keys.SITE_NAME: f"site-{context.node_id}"}),
        keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: 1})}), reply_to=message)


def _grid(delays: dict[int, float | None], gone: frozenset[int] = frozenset()) -> InProcessGrid:
    """Node ``n`` answers after ``delays[n]`` seconds (None: never); nodes in ``gone``
    are unreachable and the SuperLink answers for them after their delay."""
    return InProcessGrid([VirtualSite({}, _answer, SiteFaults(
        latency=delay or 0.0, silent_from_round=0 if delay is NEVER and node not in gone
        else None, disconnect_from_round=0 if node in gone else None), node_id=node)
        for node, delay in delays.items()])


def _parse(message: Message, node_id: int) -> MetricsReply:
    if message.has_error():
        raise InvalidReplyError(message.error.reason)
    return MetricsReply(node_id, f"site-{node_id}", 1)


def _intake(nodes) -> ReplyIntake[MetricsReply]:
    return ReplyIntake("test", SiteBook(), _parse, {n: f"node-{n}" for n in nodes})


def _messages(nodes):
    return [Message(RecordDict({"config": ConfigRecord()}), dst_node_id=n,
                    message_type="train") for n in nodes]


def _nodes(exchanged) -> list[int]:
    return sorted(reply.node_id for reply in exchanged.taken.accepted)


def test_quorum_at_the_deadline_closes_the_round_without_the_straggler():
    grid = _grid({3: 0.0, 4: 0.0, 5: 0.6})
    late: dict[str, int] = {}
    policy = RoundPolicy(deadline=0.2, quorum=2, timeout=5.0, poll_interval=0.02)
    got = exchange(grid, _messages([3, 4, 5]), policy, _intake([3, 4, 5]), late)
    assert _nodes(got) == [3, 4]
    assert got.missing == [5] and got.taken.dropped == {"node-5": NO_REPLY}
    assert list(late.values()) == [5]
    time.sleep(0.7)
    nxt = exchange(grid, [], policy, _intake([]), late)
    assert nxt.late == ["site-5"]  # its declared name
    assert late == {}


def test_without_quorum_it_waits_past_the_deadline_until_the_timeout():
    grid = _grid({3: 0.0, 4: NEVER})
    policy = RoundPolicy(deadline=0.05, quorum=2, timeout=0.3, poll_interval=0.02)
    got = exchange(grid, _messages([3, 4]), policy, _intake([3, 4]))
    assert _nodes(got) == [3]
    assert got.missing == [4]
    assert got.seconds >= 0.3  # it waited for the hard timeout, not the deadline


def test_invalid_replies_do_not_count_towards_the_quorum():
    grid = _grid({2: 0.0, 3: 0.0, 4: 0.3})
    policy = RoundPolicy(deadline=0.05, quorum=2, timeout=5.0, poll_interval=0.02)
    got = exchange(grid, _messages([2, 3, 4]), policy, _intake([2, 3, 4]))
    assert _nodes(got) == [3, 4]  # waited for node 4 since node 2's reply was invalid
    assert got.missing == [] and "unusable" in got.taken.dropped["bad"]


def test_everyone_answers_returns_at_once():
    grid = _grid({3: 0.0, 4: 0.0})
    got = exchange(grid, _messages([3, 4]), RoundPolicy(timeout=5.0, poll_interval=0.02),
                   _intake([3, 4]))
    assert got.missing == [] and _nodes(got) == [3, 4]


def test_bad_policy():
    with pytest.raises(ValueError):
        RoundPolicy(deadline=-1)


def test_the_superlinks_node_unavailable_reply_is_attributed_to_the_unreachable_node():
    grid = _grid({5: 0.0, 6: 0.0}, gone=frozenset({6}))
    policy = RoundPolicy(deadline=0.0, quorum=0, timeout=5.0, poll_interval=0.02)
    got = exchange(grid, _messages([5, 6]), policy, _intake([5, 6]))
    assert got.missing == []  # the error reply closes the wait
    assert _nodes(got) == [5]
    assert set(got.taken.labels) == {5, 6}  # not the SuperLink's own id
    assert "Node Unavailable" in got.taken.dropped["node-6"]


def test_a_late_node_unavailable_reply_is_attributed_to_its_node():
    grid = _grid({5: 0.0, 6: 0.3}, gone=frozenset({6}))  # noticed gone after 0.3 s
    late: dict[str, int] = {}
    policy = RoundPolicy(deadline=0.05, quorum=1, timeout=5.0, poll_interval=0.02)
    got = exchange(grid, _messages([5, 6]), policy, _intake([5, 6]), late)
    assert got.missing == [6] and list(late.values()) == [6]
    time.sleep(0.4)
    nxt = exchange(grid, [], policy, _intake([]), late)
    assert nxt.late == ["node-6"] and late == {}


def test_each_reply_carries_the_seconds_from_send_to_receipt():
    """``reply_seconds``, by site: a slow node's reply took longer."""
    grid = _grid({3: 0.0, 4: 0.15})
    got = exchange(grid, _messages([3, 4]), RoundPolicy(timeout=5.0, poll_interval=0.01),
                   _intake([3, 4]))
    seconds = got.reply_seconds
    assert seconds["site-3"] < seconds["site-4"] and 0.15 <= seconds["site-4"] <= got.seconds


def test_each_reply_is_taken_in_once_and_not_kept():
    """The intake sees each reply once, for the node it answers; the exchange keeps none."""
    seen: list[int] = []

    def counting(message: Message, node_id: int) -> MetricsReply:
        seen.append(node_id)
        return _parse(message, node_id)

    grid = _grid({3: 0.0, 4: 0.05})
    intake = ReplyIntake("test", SiteBook(), counting, {3: "node-3", 4: "node-4"})
    got = exchange(grid, _messages([3, 4]), RoundPolicy(timeout=5.0, poll_interval=0.01),
                   intake)
    assert sorted(seen) == [3, 4] and _nodes(got) == [3, 4]
    assert not any(isinstance(value, Message) for value in vars(got).values())


def test_the_default_policy_asks_for_replies_every_tenth_of_a_second(monkeypatch):
    """Found in bench/site_overhead.py: a reply waited 0.25 s on average for the next pull
    (0.5 s apart), a share of the < 1 s a message may cost at a hospital."""
    import strategies.rounds.instructions as instructions_module

    waits: list[float] = []
    sleep = time.sleep

    def recorded(seconds: float) -> None:
        waits.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(instructions_module.time, "sleep", recorded)
    grid = _grid({3: 0.15, 4: 0.15})
    got = exchange(grid, _messages([3, 4]), RoundPolicy(), _intake([3, 4]))
    assert _nodes(got) == [3, 4]
    assert waits and waits == [pytest.approx(0.1)] * len(waits)

