"""The local training loop: step counting, deadline, first-batch loss, NaN guard."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from clients.training.trainer import NonFiniteLossError, select_device, train_steps


def _data(n_batches: int = 3, batch: int = 4):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 2, generator=g), torch.randn(batch, 1, generator=g))
            for _ in range(n_batches)]


def test_runs_exactly_the_requested_steps_cycling_the_data():
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    batches = _data(n_batches=3)
    first_x, first_y = batches[0]
    with torch.no_grad():
        expected_initial = float(nn.functional.mse_loss(model(first_x), first_y))
    result = train_steps(model, batches, nn.functional.mse_loss,
                         torch.optim.SGD(model.parameters(), lr=0.1), steps=7,
                         compute=select_device("cpu"))
    assert result.steps_done == 7
    assert result.num_examples == 7 * 4
    assert result.initial_loss == pytest.approx(expected_initial)
    assert result.mean_loss > 0


def test_deadline_stops_early_and_reports_the_steps_done():
    model = nn.Linear(2, 1)
    result = train_steps(model, _data(), nn.functional.mse_loss,
                         torch.optim.SGD(model.parameters(), lr=0.1), steps=50,
                         compute=select_device("cpu"), deadline=time.monotonic() - 1.0)
    assert result.steps_done == 1


def test_non_finite_loss_is_refused():
    model = nn.Linear(2, 1)
    batches = [(torch.full((4, 2), float("nan")), torch.zeros(4, 1))]
    with pytest.raises(NonFiniteLossError, match="non-finite"):
        train_steps(model, batches, nn.functional.mse_loss,
                    torch.optim.SGD(model.parameters(), lr=0.1), steps=2,
                    compute=select_device("cpu"))


def test_bad_requests():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        train_steps(model, _data(), nn.functional.mse_loss, opt, 0, select_device("cpu"))
    with pytest.raises(ValueError, match="no batches"):
        train_steps(model, [], nn.functional.mse_loss, opt, 1, select_device("cpu"))
    with pytest.raises(ValueError, match="device must be"):
        select_device("tpu")
