"""The site-overhead benchmark's breakdown of a message, read from a node's log."""

from __future__ import annotations

import importlib

import pytest

# Lines as a hospital's node process logs them (trace of 2026-11-24 11:28, round 2 and 3
# train messages of hospital-a; Flower's request lines left out).
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
    assert (first["answer_s"], first["runner_push_s"]) == (0.15, 0.10)
    assert "runner_pull_after_receipt_s" not in second  # a runner line without a receipt
    assert second["receive_s"] == pytest.approx(1.186)  # then Flower's lines
    assert second["send_s"] == pytest.approx(0.645)


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
