"""The training loops' step hooks (clients/training/trainer.py ``StepHooks``): where they run."""

from __future__ import annotations

import copy

import torch
from torch import nn

from clients.training.personalisation.per_fedavg_fo import per_fedavg_fo_steps
from clients.training.trainer import backward_step, select_device, train_steps


class Recorder:
    """Records, around every step, the gradient seen and the weight before and after."""

    def __init__(self) -> None:
        self.events: list[tuple[str, torch.Tensor | None, torch.Tensor]] = []

    def before_step(self, model: nn.Module) -> None:
        grad = model.weight.grad
        self.events.append(("before", None if grad is None else grad.clone(),
                            model.weight.detach().clone()))

    def after_step(self, model: nn.Module) -> None:
        self.events.append(("after", None, model.weight.detach().clone()))


def _data(n_batches: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of 4 examples of a noiseless linear target."""
    x = torch.randn(4 * n_batches, 2, generator=torch.Generator().manual_seed(0))
    return list(zip(x.split(4), (x @ torch.tensor([[1.0], [-2.0]])).split(4)))


def test_hooks_run_around_every_step_on_the_backward_gradient():
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    hooks = Recorder()
    train_steps(model, _data(), nn.functional.mse_loss,
                torch.optim.SGD(model.parameters(), lr=0.1), steps=4,
                compute=select_device("cpu"), step_hooks=hooks)
    kinds = [kind for kind, _, _ in hooks.events]
    assert kinds == ["before", "after"] * 4
    for (_, grad, w_before), (_, _, w_after) in zip(hooks.events[::2], hooks.events[1::2]):
        assert grad is not None
        torch.testing.assert_close(w_after, w_before - 0.1 * grad)


def test_a_hook_that_zeroes_the_gradient_freezes_the_weights():
    """``before_step`` runs before the optimiser reads the gradient."""

    class Freeze:
        def before_step(self, model: nn.Module) -> None:
            for p in model.parameters():
                p.grad.zero_()

        def after_step(self, model: nn.Module) -> None:
            pass

    model = nn.Linear(2, 1)
    start = [p.detach().clone() for p in model.parameters()]
    train_steps(model, _data(), nn.functional.mse_loss,
                torch.optim.SGD(model.parameters(), lr=0.1), steps=3,
                compute=select_device("cpu"), step_hooks=Freeze())
    for a, p in zip(start, model.parameters()):
        assert torch.equal(a, p)


def test_an_empty_batch_step_runs_after_step_only():
    model = nn.Linear(2, 1)
    hooks = Recorder()
    batches = [(torch.zeros(0, 2), torch.zeros(0, 1)), *_data(1)]
    train_steps(model, batches, nn.functional.mse_loss,
                torch.optim.SGD(model.parameters(), lr=0.1), steps=2,
                compute=select_device("cpu"), empty_batch_step=lambda opt: opt.step(),
                step_hooks=hooks)
    assert [kind for kind, _, _ in hooks.events] == ["after", "before", "after"]


def test_per_fedavg_fo_runs_the_hooks_around_its_outer_step():
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    hooks = Recorder()
    per_fedavg_fo_steps(model, _data(4), nn.functional.mse_loss,
                        torch.optim.SGD(model.parameters(), lr=0.1), steps=2,
                        compute=select_device("cpu"), inner_lr=0.05, step_hooks=hooks)
    assert [kind for kind, _, _ in hooks.events] == ["before", "after"] * 2
    for (_, grad, w_before), (_, _, w_after) in zip(hooks.events[::2], hooks.events[1::2]):
        torch.testing.assert_close(w_after, w_before - 0.1 * grad)  # w restored before the step


def test_under_a_loss_scaler_before_step_sees_the_true_scale_gradient():
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    plain = copy.deepcopy(model)
    x, y = _data(1)[0]
    nn.functional.mse_loss(plain(x), y).backward()
    hooks = Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backward_step(nn.functional.mse_loss(model(x), y), opt,
                  torch.amp.GradScaler("cpu", init_scale=1024.0), model, hooks)
    (_, grad, _), (_, _, after) = hooks.events
    torch.testing.assert_close(grad, plain.weight.grad)
    torch.testing.assert_close(after, plain.weight.detach() - 0.1 * plain.weight.grad)
