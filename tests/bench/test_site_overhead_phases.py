"""The site-overhead benchmark's breakdown of a message, read from a node's log."""

from __future__ import annotations

import importlib

import pytest

# Lines as a hospital's node process logs them (trace of 2026-11-24 11:28, round 2 and 3
# train messages of hospital-a; Flower's request lines left out): the runner's older line.
LOG = """\
\x1b[92mINFO 2026-11-24 11:27:57,638:      Receiving: train message (ID: 78f1)
INFO 2026-11-24 11:27:58,900:      Received successfully
2026-11-24 11:27:59,300 fedmed.site_runner site hospital-a: train message: pull 1.40 s \
(receipt 1.20 s), answer 0.15 s, push 0.10 s
INFO 2026-11-24 11:27:59,400:      Sending: train message (ID: aa01)
INFO 2026-11-24 11:28:00,000:      Sent successfully
INFO 2026-11-24 11:28:04,464:      Receiving: train message (ID: 21d2)
INFO 2026-11-24 11:28:05,650:      Received successfully
2026-11-24 11:28:06,335 fedmed.site_runner site hospital-a: train message: pull 1.50 s, \
answer 0.18 s, push 0.13 s
INFO 2026-11-24 11:28:06,405:      Sending: train message (ID: f6ce)
INFO 2026-11-24 11:28:07,050:      Sent successfully
"""

# The runner's line with the worker's round trip inside the answer and the audit append
# after the push, logged once the audit is written (after Flower's Sending line).
LOG_PARTS = """\
INFO 2026-12-01 10:00:00,000:      Receiving: evaluate message (ID: 0a0a)
INFO 2026-12-01 10:00:00,300:      Received successfully
INFO 2026-12-01 10:00:00,700:      Sending: evaluate message (ID: 0b0b)
2026-12-01 10:00:00,760 fedmed.site_runner site hospital-b: evaluate message: pull 0.30 s \
(receipt 0.20 s), answer 0.35 s (worker 0.31 s, egress 0.01 s), push 0.05 s, audit 0.01 s
INFO 2026-12-01 10:00:01,000:      Sent successfully
"""


def _phases():
    return importlib.import_module("site_overhead_phases")


def test_each_message_gets_its_spans_and_the_runners_parts():
    first, second = _phases().message_phases(LOG)
    assert first["kind"] == second["kind"] == "train"
    # the runner's receipt (59.300 - 1.65 + 1.20 = 58.850) comes before Flower's
    # "Received successfully" (58.900, after its confirmation to the SuperLink)
    assert first["receive_s"] == pytest.approx(58.850 - 57.638)
    assert first["at_site_s"] == pytest.approx(59.400 - 58.850)
    assert first["send_s"] == pytest.approx(0.6)
    assert first["runner_pull_after_receipt_s"] == pytest.approx(0.2)
    assert (first["pull_s"], first["answer_s"], first["push_s"]) == (1.40, 0.15, 0.10)
    assert "runner_pull_after_receipt_s" not in second  # a runner line without a receipt
    assert second["receive_s"] == pytest.approx(1.186)  # then Flower's lines
    assert second["send_s"] == pytest.approx(0.645)


def test_the_answer_is_the_runners_own_and_every_part_is_a_phase():
    (message,) = _phases().message_phases(LOG_PARTS)
    assert message["answer_s"] == pytest.approx(0.35 - 0.31 - 0.01)  # less what lies inside
    assert (message["worker_s"], message["egress_s"]) == (0.31, 0.01)
    assert (message["push_s"], message["audit_s"]) == (0.05, 0.01)
    assert message["runner_pull_after_receipt_s"] == pytest.approx(0.10)
    # receipt: the line's time less all four parts, plus the receipt (0.760 - 0.71 + 0.20)
    assert message["receive_s"] == pytest.approx(0.25)
    assert message["at_site_s"] == pytest.approx(0.70 - 0.25)
    medians = _phases().median_phases([message], [1.5])
    named = [p for p in _phases().PHASES if p in medians]
    assert list(medians) == [*named, "egress_s"]  # a new part comes after the known ones
    assert "audit_s" in named and "worker_s" in named
    assert medians["rest_s"] == pytest.approx(1.5 - 0.25 - 0.45 - 0.30)


def test_runner_parts_reads_parts_and_sub_parts():
    parts = _phases().runner_parts("pull 0.30 s (receipt 0.20 s), answer 0.35 s "
                                   "(worker 0.31 s), push 0.05 s")
    assert parts == {"pull": (0.30, {"receipt": 0.20}), "answer": (0.35, {"worker": 0.31}),
                     "push": (0.05, {})}


def test_medians_and_the_rest_of_the_reply_seconds():
    messages = _phases().message_phases(LOG)
    medians = _phases().median_phases(messages, [3.0, 3.0])
    assert medians["rest_s"] == pytest.approx((3.0 - 2.362 + 3.0 - 2.586) / 2)
    assert medians["answer_s"] == pytest.approx((0.15 + 0.18) / 2)
    assert list(medians) == [p for p in _phases().PHASES if p in medians]


def test_the_benchmark_matches_log_messages_to_rounds_and_drops_round_one():
    bench = importlib.import_module("site_overhead")
    seconds = {("hospital-a", "train", 1): 20.0, ("hospital-a", "train", 2): 3.0}
    medians = bench.later_phases({"hospital-a": LOG}, seconds)
    assert medians["send_s"] == pytest.approx(0.645)  # only the second message: round 2
    assert medians["rest_s"] == pytest.approx(3.0 - 2.586)
