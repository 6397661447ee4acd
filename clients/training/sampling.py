"""Training-set sampling that sets the share of positive examples in the batches.

Rare targets (emboli in a few slices of a CT, one class at a skewed site) would
hardly reach the batches under uniform sampling. :func:`positive_share_sampler`
draws with replacement so that, in expectation, a chosen share of the drawn
examples is positive: each positive has weight ``share / n_pos`` and each
negative ``(1 - share) / n_neg``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import WeightedRandomSampler

__all__ = ["positive_share_weights", "positive_share_sampler"]


def positive_share_weights(n: int, positives: Sequence[int], share: float,
                           at_least: bool = False) -> torch.Tensor:
    """Per-example weights giving positives the expected ``share`` of the draws.

    With ``at_least`` the share is ``max(share, natural share)``: positives are
    only ever up-weighted (segmentation, where negatives are the cheap,
    uninformative examples). Uniform when the set has no positive or no negative.

    Raises
    ------
    ValueError
        If ``share`` is not in ``[0, 1]``.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"positive share must be in [0, 1], got {share}")
    weights = torch.ones(n, dtype=torch.double)
    is_positive = torch.zeros(n, dtype=torch.bool)
    is_positive[list(positives)] = True
    n_pos = int(is_positive.sum())
    if not 0 < n_pos < n or (at_least and n_pos / n >= share):
        return weights
    weights[is_positive] = share / n_pos
    weights[~is_positive] = (1.0 - share) / (n - n_pos)
    return weights


def positive_share_sampler(n: int, positives: Sequence[int], share: float, seed: int,
                           at_least: bool = False) -> WeightedRandomSampler:
    """An epoch of ``n`` seeded draws with replacement under :func:`positive_share_weights`."""
    return WeightedRandomSampler(positive_share_weights(n, positives, share, at_least),
                                 num_samples=n, replacement=True,
                                 generator=torch.Generator().manual_seed(seed))
