"""``bench/egress_filter.py`` on two small PE hospitals: every genuine reply passes the filter
and the rows hold its cost per reply kind and codec."""

from __future__ import annotations

import egress_filter
from tests.integration.conftest import write_small_hospitals


def test_the_bench_times_genuine_replies_that_pass(tmp_path):
    folders = write_small_hospitals(tmp_path / "pe", seed=4)
    rows = egress_filter.measure(egress_filter.MODELS[:1], ("none", "topk:0.01"), 2,
                                 tmp_path / "work", {"pe-seg": folders})
    assert [(r["codec"], r["kind"]) for r in rows] == [
        ("none", "train"), ("none", "evaluate"), ("topk:0.01", "train")]
    assert all(r["passed"] and r["replies"] == 2 and r["check_ms_median"] > 0 for r in rows)
    dense, _, sparse = rows
    assert dense["entries"] == sparse["entries"] > 0
    assert sparse["reply_bytes"] < dense["reply_bytes"] / 10
