"""Local training loop of a site: tau SGD steps on the site's data.

Knows nothing of Flower. It runs a fixed number of optimiser steps (the local
work tau of local-update SGD; McMahan et al., "Communication-efficient learning
of deep networks from decentralized data", AISTATS 2017, Alg. 1), optionally
stopping early at a wall-clock deadline, and reports what the server-side
aggregation needs: examples seen, steps actually done, mean training loss, and
the loss of the incoming global model (the first batch's loss, measured before
the first update).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from clients.training.device import ComputeDevice
from strategies.wire.errors import SiteError

__all__ = ["TrainResult", "NonFiniteLossError", "StepHooks", "backward_step", "cycle_batches",
           "train_steps"]

log = logging.getLogger(__name__)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class NonFiniteLossError(SiteError):
    """The training loss became NaN or infinite; the local update is unusable."""


class StepHooks(Protocol):
    """What a training loop calls around every optimiser step (pruning's masked training,
    :class:`clients.training.pruning.MaskedTraining`)."""

    def before_step(self, model: nn.Module) -> None:
        """After the backward pass (and the loss scaler's unscaling), before the step."""

    def after_step(self, model: nn.Module) -> None:
        """After the optimiser step."""


@dataclass(frozen=True)
class TrainResult:
    """Outcome of one site's local training."""

    #: Training examples seen (steps done x batch size, last batch exact).
    num_examples: int
    #: Optimiser steps actually run (can be below the request at a deadline).
    steps_done: int
    #: Mean training loss over the steps.
    mean_loss: float
    #: Loss of the received global model on the first batch (before any step).
    initial_loss: float
    #: Wall time of the loop.
    seconds: float
    #: DP-SGD only: the accountant's history ``(noise multiplier, sample rate, steps)`` of
    #: this training (:mod:`clients.site.privacy_ledger`).
    privacy_steps: tuple[tuple[float, float, int], ...] = ()


def backward_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                  scaler: torch.amp.GradScaler | None = None, model: nn.Module | None = None,
                  step_hooks: StepHooks | None = None) -> None:
    """Back-propagate ``loss`` and take one optimiser step, through ``scaler`` (fp16 AMP) if given.

    ``step_hooks`` (on ``model``) run around the step: ``before_step`` on the true-scale
    gradients (after ``scaler.unscale_``), ``after_step`` once the weights moved.
    """
    if scaler is not None:
        scaler.scale(loss).backward()
        if step_hooks is not None:
            scaler.unscale_(optimizer)
            step_hooks.before_step(model)
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        if step_hooks is not None:
            step_hooks.before_step(model)
        optimizer.step()
    if step_hooks is not None:
        step_hooks.after_step(model)


def cycle_batches(batches: Iterable) -> Iterator:
    """Iterate over a DataLoader forever (a new epoch each time it is exhausted)."""
    while True:
        empty = True
        for batch in batches:
            empty = False
            yield batch
        if empty:
            raise ValueError("the training data loader yields no batches")


def train_steps(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: LossFn,
    optimizer: torch.optim.Optimizer,
    steps: int,
    compute: ComputeDevice,
    deadline: float | None = None,
    progress_every: int = 10,
    label: str = "",
    proximal_mu: float = 0.0,
    channels_last: bool = False,
    empty_batch_step: Callable[[torch.optim.Optimizer], None] | None = None,
    step_hooks: StepHooks | None = None,
) -> TrainResult:
    """Run ``steps`` optimiser steps of ``model`` on ``batches``.

    The loop never waits for the GPU between steps: inputs are copied with
    ``non_blocking`` (from pinned memory, see :class:`ComputeDevice`), losses
    are summed on the device, and the host reads them back only for the first
    batch's loss and every ``progress_every`` steps.

    Parameters
    ----------
    model : nn.Module
        Already on ``compute.device``.
    batches : Iterable[tuple[Tensor, Tensor]]
        A DataLoader of (input, target); restarted when exhausted.
    loss_fn : callable
        ``loss_fn(logits, target) -> scalar``.
    optimizer : torch.optim.Optimizer
        Optimiser over ``model``'s parameters.
    steps : int
        Requested local steps tau (>= 1).
    compute : ComputeDevice
        Device and autocast precision (AMP on CUDA).
    deadline : float, optional
        ``time.monotonic()`` value after which no new step is started.
    progress_every : int
        Log a progress line every this many steps.
    label : str
        Prefix of the progress lines (e.g. the site name).
    proximal_mu : float
        FedProx proximal term ``mu/2 ||w - w_0||^2`` around the received model
        ``w_0`` (Li et al., "Federated optimization in heterogeneous networks",
        MLSys 2020, eq. 2); 0 disables it.
    channels_last : bool
        Copy 4D inputs as NHWC (``torch.channels_last``); the caller has put
        the model's weights in that layout.
    empty_batch_step : callable, optional
        Runs the optimiser step of an empty batch (Poisson sampling of DP-SGD
        draws them; :func:`clients.training.private_training.noise_only_step`).
        It counts as a step; the mean loss is over the non-empty batches.
    step_hooks : StepHooks, optional
        Called on ``model`` around every optimiser step (:func:`backward_step`); an empty
        batch's step has no backward pass, so only its ``after_step`` runs.

    Raises
    ------
    NonFiniteLossError
        If a loss is NaN or infinite.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    device = compute.device
    non_blocking = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda") if compute.needs_grad_scaler else None
    layout = torch.channels_last if channels_last else torch.preserve_format
    model.train()
    anchor = ([p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else [])
    start = time.monotonic()
    loss_sum = torch.zeros((), device=device)
    initial_loss = math.nan
    examples = 0
    done = 0
    with_loss = 0
    for x, y in cycle_batches(batches):
        if done >= steps or (deadline is not None and done > 0 and time.monotonic() >= deadline):
            break
        if x.shape[0] == 0:
            if empty_batch_step is None:
                raise ValueError("the training data loader yielded an empty batch")
            empty_batch_step(optimizer)
            if step_hooks is not None:
                step_hooks.after_step(model)
            done += 1
            continue
        x = x.to(device, non_blocking=non_blocking,
                 memory_format=layout if x.dim() == 4 else torch.preserve_format)
        y = y.to(device, non_blocking=non_blocking)
        optimizer.zero_grad(set_to_none=True)
        with compute.autocast():
            loss = loss_fn(model(x), y)
        if anchor:
            loss = loss + 0.5 * proximal_mu * sum(
                (p - a).pow(2).sum() for p, a in zip(model.parameters(), anchor))
        if with_loss == 0:
            initial_loss = float(loss.detach())
            if not math.isfinite(initial_loss):
                raise NonFiniteLossError(f"{label} non-finite loss {initial_loss} at step {done + 1}")
        backward_step(loss, optimizer, scaler, model, step_hooks)
        loss_sum += loss.detach().float()
        examples += int(x.shape[0])
        done += 1
        with_loss += 1
        if done % progress_every == 0 or done == steps:
            mean = float(loss_sum) / max(with_loss, 1)
            if not math.isfinite(mean):
                raise NonFiniteLossError(f"{label} non-finite mean loss at step {done}")
            log.info("%s step %d/%d loss %.4f (%.1fs)", label, done, steps, mean,
                     time.monotonic() - start)
    mean_loss = float(loss_sum) / max(with_loss, 1)
    if not math.isfinite(mean_loss):
        raise NonFiniteLossError(f"{label} non-finite mean loss after {done} steps")
    return TrainResult(
        num_examples=examples,
        steps_done=done,
        mean_loss=mean_loss,
        initial_loss=initial_loss,
        seconds=time.monotonic() - start,
    )
