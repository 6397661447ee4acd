"""Client selectors: Power-of-Choice variants, adaptive d, fairness floor."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from strategies.plugins.registries import SELECTORS
from strategies.plugins.selectors.power_of_choice import adaptive_d, fairness_floor, power_of_choice

SIZES = {0: 10, 1: 10, 2: 20, 3: 20, 4: 20, 5: 20}            # fractions .1 .1 .2 .2 .2 .2
LOSSES = {0: 2.0, 1: 0.5, 2: 1.5, 3: 0.9, 4: 3.1, 5: 0.2}


@dataclass
class Ctx:
    sizes: dict = field(default_factory=lambda: dict(SIZES))
    last_losses: dict = field(default_factory=dict)
    queried: list = field(default_factory=list)

    def query_losses(self, candidates, subset):
        self.queried.append((sorted(candidates), subset))
        return {c: LOSSES[c] for c in candidates}


def test_hand_computed_power_of_choice():
    assert sorted(power_of_choice([0, 2, 3, 5], [2.0, 1.5, 0.9, 0.2], 2)) == [0, 2]


@pytest.mark.parametrize("name, subset", [("pow-d", 0), ("cpow-d", 8)])
def test_pow_d_trains_the_highest_loss_candidates(name, subset):
    options = {"m": 2, "d": 4, "seed": 3}
    if subset:
        options["subset"] = subset
    selector = SELECTORS.create(name, **options)
    ctx = Ctx()
    chosen = selector.select(1, list(SIZES), ctx)
    (candidates, asked_subset), = ctx.queried
    assert len(candidates) == 4 and asked_subset == subset
    expected = sorted(sorted(candidates, key=lambda c: -LOSSES[c])[:2])
    assert chosen == expected
    assert selector.last["losses"] == {c: LOSSES[c] for c in selector.last["candidates"]}


def test_rpow_d_puts_never_selected_sites_first_and_sends_no_query():
    selector = SELECTORS.create("rpow-d", m=2, d=6, seed=0)
    ctx = Ctx(last_losses={0: 2.0, 1: 0.5, 2: 1.5, 3: 0.9})   # 4 and 5 never trained
    assert selector.select(1, list(SIZES), ctx) == [4, 5]
    assert ctx.queried == []


def test_adaptive_d_goes_from_all_sites_to_m():
    assert [adaptive_d(r, 5, 20, 4) for r in range(1, 6)] == [20, 16, 12, 8, 4]
    selector = SELECTORS.create("pow-d", m=2, d=0, num_rounds=3, seed=0)
    selector.select(1, list(SIZES), Ctx())
    assert selector.last["d"] == 6
    selector.select(3, list(SIZES), Ctx())
    assert selector.last["d"] == 2


def test_fairness_floor_lets_no_site_starve():
    # site 5 has the lowest loss and would never be chosen by pow-d with d = all
    selector = SELECTORS.create("pow-d", m=2, d=6, fairness_rounds=3, seed=0)
    picked = [selector.select(r, list(SIZES), Ctx()) for r in range(1, 10)]
    for site in SIZES:
        rounds = [r for r, chosen in enumerate(picked, start=1) if site in chosen]
        gaps = [b - a for a, b in zip([0] + rounds, rounds + [10])]
        assert max(gaps) <= 3, (site, rounds)
    assert sum(selector.times_selected.values()) == 2 * 9


def test_fairness_floor_replaces_the_lowest_priority_picks():
    # site 1 last trained in round 1: due by round 4, overdue now -> forced in first
    assert fairness_floor([4, 0], {4: 5, 0: 5, 1: 1}, 5, 3, [0, 1, 4]) == [1, 4]
    # nobody due soon: the selector's picks stand
    assert fairness_floor([4, 0], {4: 4, 0: 4, 1: 4}, 5, 3, [0, 1, 4]) == [4, 0]
    assert fairness_floor([4, 0], {}, 5, 0, [0, 1, 4]) == [4, 0]


def test_uniform_counts_selections():
    selector = SELECTORS.create("uniform", m=3, seed=1)
    chosen = selector.select(1, list(SIZES))
    assert len(chosen) == 3 and sum(selector.times_selected.values()) == 3
