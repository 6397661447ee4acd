"""How a site's local steps run: on which device, from which batches, tau SGD steps.

Knows nothing of Flower. Three parts, in the order a training round uses them:

- **Device** (:class:`ComputeDevice`, :func:`select_device`): CUDA with AMP when
  present, else CPU. Besides the device and the autocast precision it holds the
  host-side settings that keep a GPU fed: pinned host memory with non-blocking
  copies, channels-last activations for 2D convolutions (the layout cuDNN's
  tensor-core kernels use under AMP) and DataLoader worker processes. On CPU all
  three are off and only the thread count (``FEDMED_TORCH_THREADS``) applies.
- **Batches** (:func:`positive_share_sampler`, :func:`positive_share_weights`):
  training-set sampling that sets the share of positive examples in the batches.
  Rare targets (emboli in a few slices of a CT, one class at a skewed site) would
  hardly reach the batches under uniform sampling; the sampler draws with
  replacement so that, in expectation, a chosen share of the drawn examples is
  positive: each positive has weight ``share / n_pos`` and each negative
  ``(1 - share) / n_neg``.
- **Steps** (:func:`train_steps`, :func:`backward_step`, :func:`cycle_batches`): a
  fixed number of optimiser steps (the local work tau of local-update SGD; McMahan
  et al., "Communication-efficient learning of deep networks from decentralized
  data", AISTATS 2017, Alg. 1), optionally stopping early at a wall-clock
  deadline, reporting what the server-side aggregation needs: examples seen, steps
  actually done, mean training loss, and the loss of the incoming global model
  (the first batch's loss, measured before the first update). A batch that runs out
  of memory is trained in micro-batches with gradient accumulation, one step per
  batch (:mod:`clients.training.micro_batches`, where it says when that is not the
  same update).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import WeightedRandomSampler

from clients.training.micro_batches import MicroBatching, optimizer_step, scaled_backward
from strategies.wire.errors import SiteError

__all__ = ["ComputeDevice", "select_device", "THREADS_ENV", "WORKERS_ENV",
           "positive_share_weights", "positive_share_sampler",
           "TrainResult", "NonFiniteLossError", "StepHooks", "backward_step", "cycle_batches",
           "train_steps"]

log = logging.getLogger(__name__)


# --- device: where the steps run, in which precision, how batches are fed -------------

#: Environment variable: torch intra-op threads on CPU (unset or 0: torch's default).
THREADS_ENV = "FEDMED_TORCH_THREADS"
#: Environment variable: DataLoader worker processes (unset: 0 on CPU, min(4, cores // 2) on CUDA).
WORKERS_ENV = "FEDMED_LOADER_WORKERS"


@dataclass(frozen=True)
class ComputeDevice:
    """Where a trainer runs, in which precision, and how its batches are fed."""

    #: ``cuda`` when available, else ``cpu``.
    device: torch.device
    #: Autocast dtype on CUDA (bfloat16 where supported, else float16); ``None`` on CPU (full
    #: float32).
    amp_dtype: torch.dtype | None
    #: Run 2D convolutional models with NHWC (``torch.channels_last``) weights and inputs; on by
    #: default on CUDA.
    channels_last: bool = False
    #: DataLoader worker processes for training batches (0: load in the training process).
    loader_workers: int = 0

    def __post_init__(self) -> None:
        if self.loader_workers < 0:
            raise ValueError(f"loader_workers must be >= 0, got {self.loader_workers}")

    @property
    def needs_grad_scaler(self) -> bool:
        """Float16 autocast needs loss scaling; bfloat16 and float32 do not."""
        return self.amp_dtype is torch.float16

    @property
    def pin_memory(self) -> bool:
        """Page-locked host batches, so host-to-GPU copies can be asynchronous."""
        return self.device.type == "cuda"

    def autocast(self) -> AbstractContextManager:
        """The autocast context of this device (a no-op in full precision)."""
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def loader_kwargs(self, workers: bool = True) -> dict[str, Any]:
        """DataLoader keyword arguments: pinned memory, and workers when ``workers``.

        Evaluation loaders pass ``workers=False``: they run once per round over
        in-memory data, where starting worker processes costs more than it saves.
        """
        kwargs: dict[str, Any] = {"pin_memory": self.pin_memory}
        if workers and self.loader_workers > 0:
            kwargs.update(num_workers=self.loader_workers, prefetch_factor=4)
        return kwargs


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < 0:
        raise ValueError(f"{name} must be >= 0, got {number}")
    return number


def select_device(prefer: str = "auto") -> ComputeDevice:
    """Pick the compute device and its feeding settings.

    Parameters
    ----------
    prefer : str
        ``"auto"`` (CUDA if available), ``"cuda"`` or ``"cpu"``.

    Raises
    ------
    ValueError
        For an unknown choice, ``"cuda"`` on a machine without CUDA, or a
        malformed ``FEDMED_TORCH_THREADS`` / ``FEDMED_LOADER_WORKERS``.
    """
    if prefer not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {prefer!r}")
    if prefer == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    workers = _env_int(WORKERS_ENV)
    if prefer != "cpu" and torch.cuda.is_available():
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if workers is None:
            workers = min(4, (os.cpu_count() or 1) // 2)
        return ComputeDevice(torch.device("cuda"), dtype, channels_last=True,
                             loader_workers=workers)
    threads = _env_int(THREADS_ENV)
    if threads:
        torch.set_num_threads(threads)
    return ComputeDevice(torch.device("cpu"), None, loader_workers=workers or 0)


# --- batches: the share of positive examples drawn ------------------------------------

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


# --- steps: the local training loop ---------------------------------------------------

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
    scaled_backward(loss, scaler)
    optimizer_step(optimizer, scaler, model, step_hooks)


def _proximal_term(model: nn.Module, anchor: list[torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx's ``mu/2 ||w - w_0||^2`` (Li et al. 2020, eq. 2)."""
    return 0.5 * mu * sum((p - a).pow(2).sum() for p, a in zip(model.parameters(), anchor))


def _first_loss(loss: torch.Tensor, label: str, step: int) -> float:
    """The first batch's loss (the global model's), raising if it is not finite."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise NonFiniteLossError(f"{label} non-finite loss {value} at step {step}")
    return value


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

    A batch whose forward or backward pass raises :class:`torch.OutOfMemoryError` is
    trained in micro-batches with gradient accumulation, still one optimiser step
    (:class:`~clients.training.micro_batches.MicroBatching`; the micro-batch size is kept
    for the later steps and logged once; it says where that is not the same update:
    BatchNorm, pe-seg's batch Dice, dropout; the proximal term is added once; DP-SGD is
    split the way Opacus's BatchMemoryManager does).

    Raises
    ------
    NonFiniteLossError
        If a loss is NaN or infinite.
    BatchTooLargeError
        If one training example alone runs out of memory
        (:class:`clients.training.micro_batches.BatchTooLargeError`).
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
    micro = MicroBatching(device, label)
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
        loss = None
        if micro.fits(int(x.shape[0])):
            out_of_memory = False
            try:
                with compute.autocast():
                    loss = loss_fn(model(x), y)
                if anchor:
                    loss = loss + _proximal_term(model, anchor, proximal_mu)
                if with_loss == 0:
                    initial_loss = _first_loss(loss, label, done + 1)
                scaled_backward(loss, scaler)
            except torch.OutOfMemoryError:
                out_of_memory = True
            if out_of_memory:  # outside the except: its traceback holds the activations
                loss = None
                micro.clear(model, optimizer)
            else:
                optimizer_step(optimizer, scaler, model, step_hooks)
        if loss is None:
            loss = micro.step(
                model, x, y, loss_fn, optimizer, compute.autocast, scaler, step_hooks,
                proximal=(lambda: _proximal_term(model, anchor, proximal_mu)) if anchor else None,
                check=(lambda value: _first_loss(value, label, done + 1)) if with_loss == 0
                else None)
            if with_loss == 0:
                initial_loss = float(loss)
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
