r"""Per-FedAvg-FO at a site: first-order MAML steps inside FedAvg's local training.

Fallah, Mokhtari, Ozdaglar, "Personalized federated learning with theoretical
guarantees: a model-agnostic meta-learning approach", NeurIPS 2020, Algorithm 1
with the first-order approximation (Sec. 5, "Per-FedAvg (FO)"). Each local step
draws two batches :math:`D, D'` and, with the personalisation step :math:`\alpha`
(``personalisation.inner-lr``) and the site's optimiser (step :math:`\beta` = run
config ``lr``),

.. math::

    \tilde w = w - \alpha \nabla f(w; D), \qquad
    w \leftarrow w - \beta \nabla f(\tilde w; D')

(the Hessian term of the MAML gradient dropped). The optimiser update is the one
of plain local SGD with the gradient taken at :math:`\tilde w`, so FedNova's
a-norm from the step count stays exact (heavy-ball momentum included). A step
costs two forward/backward passes. With float16 autocast (which would need loss
scaling for both gradients) the loop runs in full precision.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from contextlib import nullcontext

import torch
from torch import nn

from clients.training.trainer import (ComputeDevice, LossFn, NonFiniteLossError, StepHooks,
                                      TrainResult, cycle_batches)

__all__ = ["per_fedavg_fo_steps"]


def per_fedavg_fo_steps(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], loss_fn: LossFn,
    optimizer: torch.optim.Optimizer, steps: int, compute: ComputeDevice, *, inner_lr: float,
    deadline: float | None = None, label: str = "", channels_last: bool = False,
    proximal_mu: float = 0.0, step_hooks: StepHooks | None = None,
) -> TrainResult:
    r"""Run ``steps`` Per-FedAvg-FO steps of ``model`` (in place); the loop of
    :func:`clients.training.trainer.train_steps`, same arguments and result.

    ``step_hooks`` run around the outer (optimiser) step, on the gradient taken at
    :math:`\tilde w` once :math:`w` is restored.

    ``num_examples`` counts both batches of a step; ``mean_loss`` and
    ``initial_loss`` are the losses :math:`f(w; D)` at the current point.

    Raises
    ------
    ValueError
        For ``steps < 1``, ``inner_lr <= 0`` or ``proximal_mu > 0`` (not defined here).
    NonFiniteLossError
        If a loss is NaN or infinite.
    """
    if steps < 1 or not inner_lr > 0 or proximal_mu:
        raise ValueError(f"need steps >= 1, inner_lr > 0 and no proximal term, got {steps}, "
                         f"{inner_lr}, {proximal_mu}")
    device = compute.device
    layout = torch.channels_last if channels_last else torch.preserve_format
    autocast = nullcontext() if compute.needs_grad_scaler else compute.autocast()
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    start, losses, examples, done = time.monotonic(), [], 0, 0
    stream = cycle_batches(batches)

    def loss_on(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.to(device, memory_format=layout if x.dim() == 4 else torch.preserve_format)
        with autocast:
            loss = loss_fn(model(x), y.to(device))
        if not math.isfinite(float(loss.detach())):
            raise NonFiniteLossError(f"{label} non-finite loss at step {done + 1}")
        return loss

    while done < steps and not (deadline is not None and done and time.monotonic() >= deadline):
        (x, y), (x2, y2) = next(stream), next(stream)
        point = [p.detach().clone() for p in params]
        loss = loss_on(x, y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(inner_lr * g)
        optimizer.zero_grad(set_to_none=True)
        loss_on(x2, y2).backward()
        with torch.no_grad():
            for p, value in zip(params, point):
                p.copy_(value)
        if step_hooks is not None:
            step_hooks.before_step(model)
        optimizer.step()
        if step_hooks is not None:
            step_hooks.after_step(model)
        losses.append(float(loss.detach()))
        examples += int(x.shape[0]) + int(x2.shape[0])
        done += 1
    return TrainResult(num_examples=examples, steps_done=done, mean_loss=sum(losses) / done,
                       initial_loss=losses[0], seconds=time.monotonic() - start)
