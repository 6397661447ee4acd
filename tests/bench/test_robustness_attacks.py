"""The server's round of the attack benchmarks (``bench/robustness_attacks.py``), tiny replies."""

from __future__ import annotations

import numpy as np
import pytest

from robustness_attacks import ATTACKS, build_aggregator, merge_report, server_update
from strategies.plugins.run_settings import RunSettings
from strategies.replies import TrainReply
from strategies.rounds.site_book import SiteBook

SETUP = {"inflated_n": 10**15, "scale": 1000.0, "noise_std": 1.0}
SETTINGS = RunSettings(local_steps=1, num_rounds=1, fraction_train=1.0, min_nodes=3, seed=0,
                       optimizer="adam")


def replies(n_attacker: int = 10) -> list[TrainReply]:
    deltas = [[np.full((2, 2), v, np.float32), np.full(3, v, np.float32)] for v in (1.0, 2.0, 4.0)]
    sizes = (n_attacker, 30, 60)
    return [TrainReply(node_id=i, site=f"site-{i}", delta=d, num_examples=n, steps=1,
                       train_loss=0.0, a_norm=1.0) for i, (d, n) in enumerate(zip(deltas, sizes))]


def update(attack: str, book: SiteBook | None = None, batch: list | None = None):
    return server_update(build_aggregator("fedavg", SETTINGS), batch or replies(), 0, attack,
                         np.random.default_rng(0), SETUP, book or SiteBook())


def test_every_attack_keeps_the_shapes_of_a_multi_array_update():
    rng = np.random.default_rng(0)
    for name, attack in ATTACKS.items():
        out = attack(replies()[0], rng, SETUP)
        if out is not None:
            assert [(a.shape, a.dtype) for a in out.delta] == [((2, 2), np.float32),
                                                               ((3,), np.float32)], name


def test_a_non_finite_reply_is_dropped_like_a_missing_one():
    dropped = update("nan")
    assert all(np.isfinite(a).all() for a in dropped)
    for got, want in zip(dropped, update("always-fails")):
        np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(dropped[1], np.full(3, (2 * 30 + 4 * 60) / 90))


def test_the_first_declared_size_caps_a_later_inflation_but_not_an_inflation_from_round_one():
    book = SiteBook()
    honest = update("none", book)
    np.testing.assert_allclose(update("inflated-n", book)[1], honest[1])  # capped at 10
    inflated_from_start = update("inflated-n")
    assert inflated_from_start[1] == pytest.approx(np.ones(3), rel=1e-9)  # the attacker's own


def test_a_merge_replaces_only_the_sets_it_brings(tmp_path):
    path = tmp_path / "r.json"
    run = {"set": "a", "attack": "none", "defence": "fedavg", "metric": 1.0,
           "relative_to_clean": 1.0}
    merge_report(path, {"clean": {"a": 1.0, "b": 2.0}, "runs": [run, {**run, "set": "b"}],
                        "sets": {"a": {}, "b": {}}, "setup": {"x": 1}})
    merged = merge_report(path, {"clean": {"b": 3.0}, "runs": [{**run, "set": "b", "metric": 3.0}],
                                 "sets": {"b": {"direction": "higher"}}, "setup": {"x": 2}})
    assert merged["clean"] == {"a": 1.0, "b": 3.0}
    assert [(r["set"], r["metric"]) for r in merged["runs"]] == [("a", 1.0), ("b", 3.0)]
    assert merged["details"] == {"a": {"setup": {"x": 1}}, "b": {"setup": {"x": 2}}}
    assert merged["sets"]["b"] == {"direction": "higher"}
