"""Power-of-Choice vs uniform through the product (``bench/selection_powd.py``) on a tiny
federation: four PneumoniaMNIST sites, two rounds, the real ServerApp and ClientApp.

What the JSON must show: pow-d asks exactly ``d`` candidates each round (Flower ``query``
messages; the examples forwarded are their training splits) and trains the ``m`` with the
highest reported loss; cpow-d forwards at most ``subset`` examples per candidate; rpow-d and
uniform send no query at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = pytest.mark.skipif(
    not (SHARED / "cxr2d" / "pneumoniamnist_balanced.npz").is_file(),
    reason="needs the shared data folder (../shared/data)")

SITES, M, D, ROUNDS = 4, 1, 3, 2


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    import selection_powd

    tmp = tmp_path_factory.mktemp("selection")
    path = tmp / "selection_powd.json"
    assert selection_powd.main([
        "--rounds", str(ROUNDS), "--seeds", "1", "--num-sites", str(SITES), "--m", str(M),
        "--d", str(D), "--tau", "2", "--methods", "pow-d,cpow-d,rpow-d",
        "--output", str(path), "--workdir", str(tmp)]) == 0
    return json.loads(path.read_text())


def test_the_report_has_every_method_and_its_curve(report):
    assert report["engine"] == "in-process"
    assert set(report["summary"]) == {"uniform", "pow-d", "cpow-d", "rpow-d"}
    sizes = report["splits"]["0"]["sizes"]
    assert len(sizes) == SITES and min(sizes) > 0
    for method, (run,) in report["runs"].items():
        assert len(run["val_accuracy"]) == ROUNDS, method
        assert all(0.0 <= a <= 1.0 for a in run["val_accuracy"])
        assert [len(s) for s in run["selected_per_round"]] == [M] * ROUNDS, method
        assert sum(run["times_selected"]) == M * ROUNDS


def test_pow_d_queries_d_candidates_and_trains_the_highest_loss_one(report):
    (run,) = report["runs"]["pow-d"]
    sizes = report["splits"]["0"]["sizes"]
    for losses, selected, passes in zip(run["candidate_losses_per_round"],
                                        run["selected_per_round"],
                                        run["query_forward_passes_per_round"]):
        assert len(losses) == D
        assert passes == sum(sizes[int(c)] for c in losses)
        assert selected == [int(max(losses, key=losses.get))]
    assert run["query_bytes_down"] > 0


def test_cpow_d_forwards_a_subset_and_rpow_d_and_uniform_send_no_query(report):
    (cpow,) = report["runs"]["cpow-d"]
    sizes = report["splits"]["0"]["sizes"]
    subset = report["config"]["cpow_subset"]
    for losses, passes in zip(cpow["candidate_losses_per_round"],
                              cpow["query_forward_passes_per_round"]):
        assert len(losses) == D and passes == sum(min(subset, sizes[int(c)]) for c in losses)
    for method in ("rpow-d", "uniform"):
        (run,) = report["runs"][method]
        assert run["query_forward_passes"] == 0 and run["query_bytes_down"] == 0, method
