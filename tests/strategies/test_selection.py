"""The selectors' kernels: Power-of-Choice's two stages and uniform sampling.

(strategies/plugins/selectors/power_of_choice.py and uniform.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

from strategies.plugins.selectors.power_of_choice import power_of_choice, sample_candidates
from strategies.plugins.selectors.uniform import SelectionError, uniform_sample

FRACTIONS = (0.1, 0.1, 0.2, 0.2, 0.2, 0.2)
LOSSES = (2.0, 0.5, 1.5, 0.9, 3.1, 0.2)


def test_power_of_choice_hand_example() -> None:
    candidates = [0, 2, 3, 5]
    chosen = power_of_choice(candidates, [LOSSES[c] for c in candidates], m=2)
    assert chosen == [0, 2]  # losses 2.0 and 1.5, descending


def test_power_of_choice_descending_order_and_ties() -> None:
    assert power_of_choice(["a", "b", "c", "d"], [1.0, 3.0, 3.0, 2.0], 3) == ["b", "c", "d"]
    assert power_of_choice(["x", "y"], [1.0, 1.0], 1) == ["x"]
    assert power_of_choice([7, 8, 9], [0.1, 0.3, 0.2], 3) == [8, 9, 7]


@pytest.mark.parametrize(
    ("candidates", "losses", "m", "match"),
    [
        ([0, 1], [1.0], 1, "2 candidates but 1 losses"),
        ([0, 1], [1.0, 2.0], 3, "exceeds the 2 available"),
        ([0, 1], [1.0, 2.0], 0, "m must be >= 1"),
        ([0, 1], [1.0, 2.0], 1.0, "m must be an int"),
        ([0, 0], [1.0, 2.0], 1, "duplicates"),
        ([0, 1], [1.0, float("nan")], 1, "not finite"),
    ],
)
def test_power_of_choice_validation(candidates, losses, m, match) -> None:
    with pytest.raises(SelectionError, match=match):
        power_of_choice(candidates, losses, m)


def test_sample_candidates_reproducible_distinct_and_proportional() -> None:
    sites = list(range(6))
    a = sample_candidates(sites, FRACTIONS, 4, np.random.default_rng(7))
    b = sample_candidates(sites, FRACTIONS, 4, np.random.default_rng(7))
    assert a == b and len(set(a)) == 4 and set(a) <= set(sites)

    rng = np.random.default_rng(0)
    trials = 20000
    counts = np.zeros(6)
    for _ in range(trials):
        counts[sample_candidates(sites, FRACTIONS, 1, rng)[0]] += 1
    np.testing.assert_allclose(counts / trials, FRACTIONS, atol=0.015)


def test_sample_candidates_skips_zero_weight_sites() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        assert "z" not in sample_candidates(["a", "z", "b"], [1.0, 0.0, 3.0], 2, rng)
    with pytest.raises(SelectionError, match="only 2 sites have a positive"):
        sample_candidates(["a", "z", "b"], [1.0, 0.0, 3.0], 3, rng)


def test_two_stage_power_of_choice_pipeline() -> None:
    rng = np.random.default_rng(3)
    candidates = sample_candidates(list(range(6)), FRACTIONS, 4, rng)
    chosen = power_of_choice(candidates, [LOSSES[c] for c in candidates], 2)
    expected = sorted(candidates, key=lambda c: -LOSSES[c])[:2]
    assert chosen == expected


def test_sampling_validation() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(SelectionError, match="2 sites but 3 data fractions"):
        sample_candidates([0, 1], [0.5, 0.5, 0.1], 1, rng)
    with pytest.raises(SelectionError, match="finite and >= 0"):
        sample_candidates([0, 1], [0.5, -0.5], 1, rng)
    with pytest.raises(SelectionError, match="numpy.random.Generator"):
        sample_candidates([0, 1], [0.5, 0.5], 1, np.random.RandomState(0))
    with pytest.raises(SelectionError, match="exceeds"):
        uniform_sample([0, 1], 3, rng)


def test_uniform_sample() -> None:
    sites = [f"h{i}" for i in range(10)]
    a = uniform_sample(sites, 4, np.random.default_rng(5))
    assert a == uniform_sample(sites, 4, np.random.default_rng(5))
    assert len(set(a)) == 4 and set(a) <= set(sites)
    assert sorted(uniform_sample(sites, 10, np.random.default_rng(0))) == sorted(sites)
