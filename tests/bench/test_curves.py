"""bench/curves.py: the trailing mean and the first round it reaches a target."""

from __future__ import annotations

import numpy as np

import curves


def test_trailing_mean_and_rounds_to_target():
    np.testing.assert_allclose(curves.trailing_mean(np.array([1.0, 3.0, 5.0, 7.0]), 2), [1, 2, 4, 6])
    assert curves.rounds_to_target([0.5, 0.9, 0.9, 0.9], 0.8, 2) == 3  # trailing 0.5, 0.7, 0.9
    assert curves.rounds_to_target([0.5, 0.9], 0.8, 1) == 2
    assert curves.rounds_to_target([0.5, 0.6], 0.8, 1) is None
