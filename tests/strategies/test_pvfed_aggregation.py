"""pvFed's aggregations of the local-encoder outputs, against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.wire.errors import ConfigError, ReplyError
from strategies.wire.vertical_options import AGGREGATIONS
from strategies.vertical.pvfed_aggregation import (VECTOR_AGGREGATIONS, AggregationSettings,
                                                   aggregate, pca_aggregation)

RNG = np.random.default_rng(7)
#: Two sites' outputs for 6 patients: widths 2 and 2, i.e. Z is 6 x 4.
Z1 = RNG.normal(size=(6, 2)) * [1.0, 5.0]
Z2 = np.column_stack([Z1[:, 0] * 2 + RNG.normal(scale=0.1, size=6), RNG.normal(size=6)])


def hand_pca(z: np.ndarray, dim: int) -> np.ndarray:
    """Correlation-matrix PCA by hand: standardise, eigh of Zs^T Zs / (N-1), top dim by value."""
    zs = (z - z.mean(axis=0)) / z.std(axis=0)
    values, vectors = np.linalg.eigh(zs.T @ zs / (len(z) - 1))
    order = np.argsort(values)[::-1][:dim]
    return zs @ vectors[:, order]


def test_every_run_config_aggregation_is_registered():
    assert VECTOR_AGGREGATIONS.names() == sorted(AGGREGATIONS)


def test_pca_is_the_projection_on_the_top_eigenvectors_up_to_the_sign_rule():
    z = np.concatenate([Z1, Z2], axis=1)
    expected = hand_pca(z, 2)
    got = aggregate("pca", [Z1, Z2], AggregationSettings(dim=2))
    assert got.shape == (6, 2) and got.dtype == np.float32
    for j in range(2):  # each component equals the hand one up to its sign
        sign = np.sign(got[:, j] @ expected[:, j])
        np.testing.assert_allclose(got[:, j], sign * expected[:, j], atol=1e-5)


def test_pca_sign_rule_makes_the_largest_loading_positive():
    settings = AggregationSettings(dim=3)
    got = pca_aggregation([Z1, Z2], settings)
    flipped = pca_aggregation([-Z1, -Z2], settings)  # the same data mirrored: same loadings' sizes
    zs = (np.concatenate([Z1, Z2], 1) - np.concatenate([Z1, Z2], 1).mean(0)) / np.concatenate(
        [Z1, Z2], 1).std(0)
    loadings, *_ = np.linalg.lstsq(zs, got.astype(np.float64), rcond=None)
    largest = np.abs(loadings).argmax(axis=0)
    assert (loadings[largest, np.arange(3)] > 0).all()
    np.testing.assert_allclose(flipped, -got, atol=1e-5)  # mirrored data, mirrored scores


def test_pca_scores_have_the_eigenvalues_as_variances():
    z = np.concatenate([Z1, Z2], axis=1)
    zs = (z - z.mean(axis=0)) / z.std(axis=0)
    values = np.sort(np.linalg.eigvalsh(zs.T @ zs / 5))[::-1]
    got = aggregate("pca", [Z1, Z2], AggregationSettings(dim=4))
    np.testing.assert_allclose(got.var(axis=0, ddof=1), values, rtol=1e-4, atol=1e-6)


def test_mean_is_the_mean_of_the_site_outputs():
    got = aggregate("mean", [Z1, Z2, 3 * Z1], AggregationSettings(dim=8))
    np.testing.assert_allclose(got, (Z1 + Z2 + 3 * Z1) / 3, rtol=1e-6)


def test_mean_refuses_outputs_of_different_widths_naming_the_key():
    with pytest.raises(ConfigError, match=r"vertical\.aggregation.*\[2, 3\]"):
        aggregate("mean", [Z1, np.ones((6, 3))], AggregationSettings(dim=2))


def test_pca_refuses_more_components_than_columns_naming_the_key():
    with pytest.raises(ConfigError, match=r"vertical\.dim = 5 .* 4 concatenated"):
        aggregate("pca", [Z1, Z2], AggregationSettings(dim=5))


def test_unknown_aggregation_names_the_key():
    with pytest.raises(ConfigError, match="vertical.aggregation"):
        aggregate("median", [Z1], AggregationSettings(dim=2))


@pytest.mark.parametrize("outputs", [[Z1, np.ones((5, 2))], [Z1, np.full((6, 2), np.nan)],
                                     [np.ones(6)], []])
def test_outputs_that_disagree_or_are_not_finite_are_refused(outputs):
    with pytest.raises(ReplyError, match="pvFed aggregation"):
        aggregate("pca", outputs, AggregationSettings(dim=1), sources=["clinic", "lab"])
