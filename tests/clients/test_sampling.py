"""Positive-share sampling: exact share for classifiers, at-least share for segmentation."""

from __future__ import annotations

import pytest
import torch

from clients.training.trainer import positive_share_sampler, positive_share_weights


def _share(weights: torch.Tensor, positives: list[int]) -> float:
    return float(weights[positives].sum() / weights.sum())


def test_rare_positives_get_the_share_in_both_modes():
    for at_least in (False, True):
        weights = positive_share_weights(10, [3], 0.5, at_least=at_least)
        assert _share(weights, [3]) == pytest.approx(0.5)


def test_common_positives_are_down_weighted_only_in_exact_mode():
    positives = list(range(9))  # 90% positive, like most MSD lung-tumour patches
    assert _share(positive_share_weights(10, positives, 0.5), positives) == pytest.approx(0.5)
    natural = positive_share_weights(10, positives, 0.5, at_least=True)
    assert torch.equal(natural, torch.ones(10, dtype=torch.double))


def test_one_class_only_is_uniform_and_bad_share_refused():
    assert torch.equal(positive_share_weights(4, [], 0.5), torch.ones(4, dtype=torch.double))
    assert torch.equal(positive_share_weights(4, [0, 1, 2, 3], 0.5), torch.ones(4, dtype=torch.double))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        positive_share_weights(4, [0], 1.5)


def test_sampler_is_seeded():
    draws = [list(positive_share_sampler(20, [1, 2], 0.5, seed=7)) for _ in range(2)]
    assert draws[0] == draws[1] and len(draws[0]) == 20
    assert sum(i in (1, 2) for i in draws[0]) >= 4  # ~10 expected, 2 of 20 naturally
