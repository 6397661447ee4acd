"""Issue 16: Per-FedAvg-FO's local step, computed by hand (Fallah et al. 2020, FO variant).

On ``f(w; D) = (w - c_D)^2 / 2`` with batches alternating ``c_D = 1`` and ``c_D' = 2``,
``alpha = 0.1`` and SGD ``beta = 0.5`` from ``w = 3``: ``w~ = 3 - 0.1 * 2 = 2.8``,
``w = 3 - 0.5 (2.8 - 2) = 2.6``; then ``w~ = 2.6 - 0.1 * 1.6 = 2.44``,
``w = 2.6 - 0.5 (2.44 - 2) = 2.38``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clients.training.trainer import ComputeDevice
from clients.training.personalisation.per_fedavg_fo import per_fedavg_fo_steps

CPU = ComputeDevice(torch.device("cpu"), None)


class Scalar(nn.Module):
    def __init__(self, w: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([w], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.expand(x.shape[0])


def _quadratic(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((prediction - target) ** 2).mean()


BATCHES = [(torch.zeros(1, dtype=torch.float64), torch.full((1,), c, dtype=torch.float64))
           for c in (1.0, 2.0)]


def test_two_steps_match_the_hand_computation():
    model = Scalar(3.0)
    result = per_fedavg_fo_steps(model, BATCHES, _quadratic,
                                 torch.optim.SGD(model.parameters(), lr=0.5), 2, CPU,
                                 inner_lr=0.1)
    assert model.w.item() == pytest.approx(2.38)
    assert result.steps_done == 2 and result.num_examples == 4
    assert result.initial_loss == pytest.approx(2.0)  # (3 - 1)^2 / 2, at w before the step
    assert result.mean_loss == pytest.approx((2.0 + 0.5 * 1.6 ** 2) / 2)


def test_bad_arguments_are_refused():
    model = Scalar(0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with pytest.raises(ValueError, match="inner_lr > 0"):
        per_fedavg_fo_steps(model, BATCHES, _quadratic, opt, 1, CPU, inner_lr=0.0)
