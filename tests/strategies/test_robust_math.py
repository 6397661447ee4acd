"""Tests for strategies.robust: norm bound, trimmed mean, median, Multi-Krum."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.wire.errors import ConfigError
from strategies.robust import (
    NormBound,
    clip_to_bound,
    coordinate_median,
    krum_scores,
    multi_krum_select,
    round_bound,
    trimmed_mean,
)


def honest(n: int = 6, d: int = 50, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal((n, d)) + 1.0).astype(np.float32)


def test_norm_bound_clips_only_rows_above_the_absolute_bound() -> None:
    u = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]], dtype=np.float32)
    clipped, factors, m = clip_to_bound(u, NormBound(absolute=1.0))
    assert m == 1.0
    np.testing.assert_allclose(clipped[0], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_array_equal(clipped[1:], u[1:])
    np.testing.assert_allclose(factors, [0.2, 1.0, 1.0])
    assert clipped.dtype == np.float32


def test_kappa_bound_follows_the_round_lower_median_and_stops_a_scaled_update() -> None:
    u = honest()
    u[0] *= 1000.0
    norms = np.linalg.norm(u.astype(np.float64), axis=1)
    # six norms: the lower of the two middle ones (#29: one of two sites cannot raise it)
    assert round_bound(norms, NormBound(kappa=2.0)) == pytest.approx(2.0 * np.sort(norms)[2])
    clipped, factors, m = clip_to_bound(u, NormBound(kappa=2.0))
    assert np.linalg.norm(clipped[0]) == pytest.approx(m, rel=1e-5)
    assert factors[0] < 0.01 and (factors[1:] == 1.0).all()
    # the smaller of the two bounds holds
    assert clip_to_bound(u, NormBound(absolute=0.5, kappa=2.0))[2] == 0.5


@pytest.mark.parametrize(
    "kwargs, key", [({}, "give"), ({"absolute": 0.0}, "absolute"), ({"absolute": float("nan")}, "absolute"), ({"kappa": 0.5}, "kappa")]
)
def test_norm_bound_rejects_bad_settings(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        NormBound(**kwargs)


def test_trimmed_mean_drops_b_extremes_per_coordinate() -> None:
    u = np.array([[1.0, -50.0], [2.0, 2.0], [3.0, 3.0], [100.0, 4.0]], dtype=np.float32)
    np.testing.assert_allclose(trimmed_mean(u, 0.25), [2.5, 2.5])
    np.testing.assert_allclose(trimmed_mean(u, 0.0), u.mean(axis=0), rtol=1e-6)
    with pytest.raises(ConfigError, match="beta"):
        trimmed_mean(u, 0.5)


def test_median_ignores_a_minority_of_arbitrary_rows() -> None:
    u = honest(7)
    clean = coordinate_median(u)
    u[:3] = 1e6  # 3 of 7 attackers: still a minority
    attacked = coordinate_median(u)
    assert np.abs(attacked - clean).max() < 0.5
    assert attacked.dtype == np.float32


def test_multi_krum_never_selects_an_outlier_when_2f_plus_2_is_below_n() -> None:
    u = honest(8)
    u[2] = -u[2] * 10.0  # sign flip, scaled
    u[5] += 5.0  # shifted
    chosen = multi_krum_select(u, f=2, m=4)
    assert 2 not in chosen and 5 not in chosen and len(chosen) == 4
    scores = krum_scores(u, f=2)
    assert scores[2] > scores[[0, 1, 3, 4, 6, 7]].max()


def test_multi_krum_scores_equal_the_definition() -> None:
    u = honest(5, 7)
    f = 1
    expected = []
    for k in range(5):
        d = sorted(float(np.sum((u[k].astype(np.float64) - u[l]) ** 2)) for l in range(5) if l != k)
        expected.append(sum(d[: 5 - f - 2]))
    np.testing.assert_allclose(krum_scores(u, f), expected, rtol=1e-6)


@pytest.mark.parametrize("f, m", [(-1, 1), (5, 1), (1, 0), (1, 6), (1.0, 1)])
def test_multi_krum_rejects_bad_f_and_m(f, m) -> None:
    with pytest.raises(ConfigError, match="multi-krum"):
        multi_krum_select(honest(5), f=f, m=m)


@pytest.mark.parametrize("rule", [trimmed_mean, coordinate_median])
def test_rules_reject_non_finite_or_badly_shaped_stacks(rule) -> None:
    args = (0.1,) if rule is trimmed_mean else ()
    with pytest.raises(ConfigError, match="finite"):
        rule(np.array([[1.0, np.nan]]), *args)
    with pytest.raises(ConfigError, match="shape"):
        rule(np.zeros(3), *args)
