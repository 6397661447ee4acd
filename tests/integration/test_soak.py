"""The soak in CI: ``bench/soak.py``'s :func:`~bench.soak.soak` at 20 rounds x 4 sites.

A real TLS deployment on 127.0.0.1 (SuperLink, four authenticated SuperNodes with
their site runners and sandboxed warm workers, one ``flwr run``), measured after
every round's progress line. It checks that every round was measured in the
issue's format, that nothing the deployment started outlives its stop, and that
what must stay bounded does: open descriptors, the SuperLink's database (Flower
deletes delivered messages), the server checkpoints (one per federation, replaced
each round). The audit log and the MLflow record grow by design, a little per round.
The JSON goes to the test's tmp folder, never to ``bench/results/``.
"""

from __future__ import annotations

import json

import pytest

from bench.soak import soak

pytestmark = pytest.mark.integration

ROUNDS, SITES = 20, 4
#: Issue #47's keys of a round's row.
ROW_KEYS = {"round", "rss_mb", "fds", "state_mb", "superlink_db_mb"}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """The 20-round soak's JSON document, as bench/soak.py writes it."""
    root = tmp_path_factory.mktemp("soak")
    out = root / "soak.json"
    out.write_text(json.dumps(soak(root / "work", ROUNDS, SITES)))
    return json.loads(out.read_text())


def test_every_round_is_measured_in_the_issue_format(result):
    assert result["status"] == "finished:completed", result["status"]
    assert (result["rounds"], result["sites"]) == (ROUNDS, SITES)
    rows = result["per_round"]
    assert [row["round"] for row in rows] == list(range(1, ROUNDS + 1))
    for row in rows:
        assert ROW_KEYS <= row.keys(), row
        assert row["rss_mb"] > 0 and row["fds"] > 0 and row["superlink_db_mb"] > 0, row
        # one SuperLink, ServerApp, four SuperNodes and their workers at least
        assert row["processes"] >= 2 + 2 * SITES, row
        assert {"superlink", "serverapp", "supernode", "worker"} <= row["rss_mb_by_kind"].keys()
    assert isinstance(result["rss_slope_mb_per_100_rounds"], float)


def test_nothing_is_left_behind(result):
    assert result["left_behind"] == []


def test_descriptors_and_disk_stay_bounded_after_warm_up(result):
    rows = {row["round"]: row for row in result["per_round"]}
    first, second = range(1, 11), range(11, ROUNDS + 1)
    # A descriptor kept per round (one per site) would add 40 over the second half.
    assert max(rows[r]["fds"] for r in second) <= max(rows[r]["fds"] for r in first) + 20
    # A message kept per round would add about a megabyte per message.
    assert rows[ROUNDS]["superlink_db_mb"] <= rows[2]["superlink_db_mb"] + 2.0
    # One checkpoint per federation, replaced each round: not one per round.
    assert max(r["checkpoint_mb"] for r in rows.values()) <= 2.5 * rows[1]["checkpoint_mb"]
    # The audit log and the MLflow record: a few tens of kB per round (0.25 MB generous).
    growth = [(rows[r]["state_mb"] - rows[r]["checkpoint_mb"]) for r in (2, ROUNDS)]
    assert growth[1] - growth[0] <= 0.25 * (ROUNDS - 2)
