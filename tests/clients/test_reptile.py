"""Issue 16: the Reptile meta step and Per-FedAvg-Reptile's site loop, computed by hand.

On ``f(w) = (w - c)^2 / 2`` one SGD step of size ``eta`` maps ``w - c`` to
``(1 - eta)(w - c)``; ``tau_in`` steps give ``w~ - c = (1 - eta)^tau_in (w - c)``, and the
meta step ``w <- w - alpha (w - w~)`` multiplies ``w - c`` by
``1 - alpha (1 - (1 - eta)^tau_in)`` per task.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clients.training.personalisation.reptile import reptile_meta_step, reptile_train
from clients.training.trainer import ComputeDevice, TrainResult, train_steps

CPU = ComputeDevice(torch.device("cpu"), None)
C, ETA = 1.0, 0.1


class Scalar(nn.Module):
    """One parameter ``w`` (the model's output) and an integer buffer."""

    def __init__(self, w: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([w], dtype=torch.float64))
        self.register_buffer("count", torch.tensor(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.expand(x.shape[0])


def _quadratic(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((prediction - target) ** 2).mean()


def _inner(model: Scalar, seen: list[int]):
    batches = [(torch.zeros(1, dtype=torch.float64), torch.full((1,), C, dtype=torch.float64))]

    def inner(task: int, steps: int) -> TrainResult:
        seen.append(task)
        model.count += 10  # what the task left in an integer buffer
        return train_steps(model, batches, _quadratic, torch.optim.SGD(model.parameters(), lr=ETA),
                           steps, CPU)

    return inner


def test_meta_step_moves_alpha_of_the_way_and_keeps_integer_buffers():
    model = Scalar(2.0)
    start = {name: value.clone() for name, value in model.state_dict().items()}
    with torch.no_grad():
        model.w.fill_(1.0)
        model.count.fill_(3)
    reptile_meta_step(model, start, alpha=0.25)
    assert model.w.item() == pytest.approx(2.0 - 0.25 * (2.0 - 1.0))
    assert model.count.item() == 3


def test_reptile_on_a_quadratic_matches_the_hand_computation():
    model, seen = Scalar(3.0), []
    result = reptile_train(model, _inner(model, seen), tau_out=2, tau_in=2, alpha=0.5)
    factor = 1 - 0.5 * (1 - (1 - ETA) ** 2)  # 0.905
    assert factor == pytest.approx(0.905)
    assert model.w.item() == pytest.approx(C + (3.0 - C) * factor ** 2)  # 2.63805
    assert model.w.item() == pytest.approx(2.63805)
    assert seen == [0, 1] and result.steps_done == 4 and result.num_examples == 4
    assert result.initial_loss == pytest.approx(0.5 * (3.0 - C) ** 2)
    assert model.count.item() == 20


def test_alpha_one_is_plain_sgd_over_all_the_steps():
    model = Scalar(3.0)
    reptile_train(model, _inner(model, []), tau_out=3, tau_in=2, alpha=1.0)
    assert model.w.item() == pytest.approx(C + (3.0 - C) * (1 - ETA) ** 6)


def test_a_step_budget_shortens_the_last_task_and_drops_the_rest():
    model, seen = Scalar(3.0), []
    result = reptile_train(model, _inner(model, seen), tau_out=4, tau_in=2, alpha=0.5,
                           max_steps=3)
    assert seen == [0, 1] and result.steps_done == 3
    after_one = 1 - 0.5 * (1 - (1 - ETA) ** 2)
    assert model.w.item() == pytest.approx(C + (3.0 - C) * after_one * (1 - 0.5 * ETA))


def test_a_task_stopped_early_ends_the_loop_after_its_meta_step():
    model, seen = Scalar(3.0), []
    inner = _inner(model, seen)

    def short(task: int, steps: int) -> TrainResult:
        return inner(task, 1)  # as if the time budget ran out after one step

    result = reptile_train(model, short, tau_out=4, tau_in=2, alpha=0.5)
    assert seen == [0] and result.steps_done == 1
    assert model.w.item() == pytest.approx(3.0 - 0.5 * ETA * (3.0 - C))
