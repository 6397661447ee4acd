"""Out of memory at a site: one optimiser step from micro-batches with gradient accumulation.

A batch whose forward or backward pass raises :class:`torch.OutOfMemoryError` (a site
with a smaller GPU than the run was planned for, a larger image size) does not fail
the round: :func:`~clients.training.trainer.train_steps` drops the partial pass (its
gradients, Opacus's per-example state, CUDA's cached blocks) and hands the batch to
:class:`MicroBatching`, which splits it into ``k = 2, 4, 8, ...`` micro-batches of
(nearly) equal size, halving until one fits, down to one example. The gradients of the
micro-batches are accumulated before ONE optimiser step (through the fp16 AMP
:class:`~torch.amp.GradScaler` and the :class:`~clients.training.trainer.StepHooks`, as
:func:`~clients.training.trainer.backward_step` takes it). Micro-batch ``i`` of ``n_i``
of the batch's ``n`` examples has its loss weighted by ``n_i / n``, so for a loss that
is a mean over examples

    sum_i (n_i / n) grad L_i = sum_i (n_i / n) (1 / n_i) sum_{e in i} grad l_e
                             = (1 / n) sum_e grad l_e = grad L,

the full batch's gradient (gradient accumulation; e.g. Goyal et al., "Accurate, large
minibatch SGD", arXiv:1706.02677, 2017, sec. 2, on the equivalence of batch splits).
The micro-batch size that fitted is remembered for the rest of the training (later
batches of at most that size run whole, larger ones split to it: no full-batch retry
every step) and logged once, one WARNING line naming the batch and micro-batch sizes.
The training loop's path when no OOM happens is unchanged.

Where it is NOT the same update (within fp tolerance it is for a mean-reduced,
per-example loss on a model whose examples do not interact):

- **BatchNorm** (cxr-cls's DenseNet, ct3d-cls's ConvLSTM, ``SmallCNN(norm="bn")``):
  the batch statistics of the forward pass are those of each micro-batch, not of the
  batch, and the running statistics get one update per micro-batch (and one more from
  the failed full-batch forward, if it got past a BatchNorm layer before running out).
  GroupNorm, InstanceNorm (pe-seg's U-Net) and no normalisation are per example.
- **Losses that pool over the batch**: pe-seg's training loss is MONAI's
  ``DiceCELoss(batch=True)``, whose Dice term is ONE soft Dice of all the batch's voxels
  together, not a mean of per-slab terms; the weighted sum of micro-batch Dice losses
  is a different (close, not equal) objective. Its cross-entropy term, and the
  classification tasks' ``BCEWithLogitsLoss`` (mean over examples and labels), are
  separable and give the same gradient.
- **Dropout** draws its masks per micro-batch: the same distribution, other samples.
- **The proximal term** (FedProx, ``mu/2 ||w - w_0||^2``) is not a per-example loss: it
  is added and back-propagated once per step, after the micro-batches, not per micro-batch.
- **DP-SGD** (Opacus; the optimiser has ``signal_skip_step``): made correct, the way
  Opacus's own ``BatchMemoryManager`` splits a Poisson batch into physical batches.
  Opacus's per-example gradients do not depend on the split (with ``loss_reduction=
  "mean"`` it multiplies the back-propagated errors by the micro-batch's own size), so
  the micro-batch losses are NOT weighted; each micro-batch is clipped and summed by a
  skipped optimiser step (``signal_skip_step(True)``, the step hooks' ``before_step``
  first, on its per-example gradients), and the last one's step adds the noise once,
  divides by the expected batch size once and is the accountant's one step. The
  clipped sum, hence the update and the privacy charge, is that of the whole batch.

An OOM raised by the optimiser step itself (Adam's first-step state) is not a batch-size
problem and propagates; so does one of a micro-batch of one example, as
:class:`BatchTooLargeError`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from strategies.wire.errors import SiteError

__all__ = ["BatchTooLargeError", "MicroBatching", "clear_partial_pass", "optimizer_step",
           "scaled_backward"]

log = logging.getLogger(__name__)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class _Hooks(Protocol):  # clients.training.trainer.StepHooks (not imported: no cycle)
    def before_step(self, model: nn.Module) -> None: ...

    def after_step(self, model: nn.Module) -> None: ...


class BatchTooLargeError(SiteError):
    """Not even one training example fits in the device's memory."""


def scaled_backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
    """Back-propagate ``loss``, through ``scaler`` (fp16 AMP) if given."""
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
                   model: nn.Module | None, step_hooks: _Hooks | None) -> None:
    """One optimiser step on the accumulated gradients (``before_step`` on the true-scale
    gradients after ``scaler.unscale_``, ``after_step`` once the weights moved)."""
    if scaler is not None:
        if step_hooks is not None:
            scaler.unscale_(optimizer)
            step_hooks.before_step(model)
        scaler.step(optimizer)
        scaler.update()
    else:
        if step_hooks is not None:
            step_hooks.before_step(model)
        optimizer.step()
    if step_hooks is not None:
        step_hooks.after_step(model)


def _is_private(optimizer: torch.optim.Optimizer) -> bool:
    """Opacus's DPOptimizer (its virtual-step API, what ``BatchMemoryManager`` uses)."""
    return callable(getattr(optimizer, "signal_skip_step", None))


def clear_partial_pass(model: nn.Module, optimizer: torch.optim.Optimizer,
                       device: torch.device) -> None:
    """Forget a forward/backward pass cut short by an OOM: gradients, Opacus's per-example
    state (activations stacked by its forward hooks, partial per-example gradients, the
    clipped sum of earlier micro-batches, a pending skip signal; Opacus 1.6 attributes) and,
    on CUDA, the allocator's cached blocks."""
    if _is_private(optimizer):
        getattr(optimizer, "_step_skip_queue", []).clear()
        optimizer._is_last_step_skipped = False  # so zero_grad drops p.summed_grad too
    optimizer.zero_grad(set_to_none=True)
    for module in model.modules():
        for name in ("activations", "max_batch_len"):
            if hasattr(module, name):
                delattr(module, name)
    for p in model.parameters():
        if hasattr(p, "_current_grad_sample"):
            del p._current_grad_sample
        if hasattr(p, "_forward_counter"):
            p._forward_counter = 0
        if getattr(p, "summed_grad", None) is not None:
            p.summed_grad = None
    if device.type == "cuda":
        torch.cuda.empty_cache()


class MicroBatching:
    """The micro-batch size of one training (see the module docstring); starts unlimited.

    Parameters
    ----------
    device : torch.device
        Where the steps run (CUDA's cache is emptied after an OOM).
    label : str
        Prefix of the log line (e.g. the site name).
    """

    def __init__(self, device: torch.device, label: str = "") -> None:
        self.device = device
        self.label = label
        #: Examples per micro-batch once a batch did not fit (``None``: no OOM so far).
        self.limit: int | None = None

    def fits(self, batch_size: int) -> bool:
        """Whether a batch of this size runs whole (no OOM yet, or within the limit)."""
        return self.limit is None or batch_size <= self.limit

    def clear(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """:func:`clear_partial_pass` on this training's device (after a full batch's OOM)."""
        clear_partial_pass(model, optimizer, self.device)

    def step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn,
             optimizer: torch.optim.Optimizer, autocast: Callable[[], object],
             scaler: torch.amp.GradScaler | None = None, step_hooks: _Hooks | None = None,
             proximal: Callable[[], torch.Tensor] | None = None,
             check: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """One optimiser step of the batch ``(x, y)`` in micro-batches; its loss, detached.

        ``autocast`` makes the forward passes' precision context; ``proximal`` (if given)
        returns the proximal term, back-propagated once; ``check`` sees the batch's loss
        (the weighted sum of the micro-batches', plus the proximal term) before the weights
        move, and may raise.

        Raises
        ------
        BatchTooLargeError
            If a micro-batch of one example still runs out of memory.
        """
        n = int(x.shape[0])
        parts = 2 if self.limit is None else math.ceil(n / self.limit)
        parts = min(max(parts, 2), n) if n > 1 else 1
        while True:
            loss = self._accumulate(model, x, y, parts, loss_fn, optimizer, autocast, scaler,
                                    step_hooks, proximal)
            if loss is not None:
                break
            if parts >= n:
                raise BatchTooLargeError(
                    f"{self.label} out of memory with one training example (batch size {n} "
                    f"split down to micro-batches of 1): the rule splits a batch, never an "
                    f"example; lower the task's image or model size".strip())
            parts = min(2 * parts, n)
        size = math.ceil(n / parts)
        if self.limit is None or size < self.limit:
            log.warning("%s batch of %d examples does not fit in memory: micro-batches of %d "
                        "examples with gradient accumulation, one optimiser step per batch",
                        self.label, n, size)
            self.limit = size
        if check is not None:
            check(loss)
        if _is_private(optimizer):
            optimizer.signal_skip_step(do_skip=False)
            optimizer.step()  # clips the last micro-batch, adds the noise once, accounts once
            if step_hooks is not None:
                step_hooks.after_step(model)
        else:
            optimizer_step(optimizer, scaler, model, step_hooks)
        return loss

    def _accumulate(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, parts: int,
                    loss_fn: LossFn, optimizer: torch.optim.Optimizer,
                    autocast: Callable[[], object], scaler: torch.amp.GradScaler | None,
                    step_hooks: _Hooks | None,
                    proximal: Callable[[], torch.Tensor] | None) -> torch.Tensor | None:
        """Gradients of ``parts`` micro-batches accumulated; the batch loss, or ``None`` after
        an OOM (the partial pass cleared, outside the ``except`` so that its traceback no
        longer holds the activations)."""
        out_of_memory = False
        try:
            return self._backward_parts(model, x, y, parts, loss_fn, optimizer, autocast,
                                        scaler, step_hooks, proximal)
        except torch.OutOfMemoryError:
            out_of_memory = True
        if out_of_memory:
            clear_partial_pass(model, optimizer, self.device)
        return None

    @staticmethod
    def _backward_parts(model: nn.Module, x: torch.Tensor, y: torch.Tensor, parts: int,
                        loss_fn: LossFn, optimizer: torch.optim.Optimizer,
                        autocast: Callable[[], object], scaler: torch.amp.GradScaler | None,
                        step_hooks: _Hooks | None,
                        proximal: Callable[[], torch.Tensor] | None) -> torch.Tensor:
        private = _is_private(optimizer)
        n = int(x.shape[0])
        xs, ys = torch.tensor_split(x, parts), torch.tensor_split(y, parts)
        total = torch.zeros((), device=x.device)
        for i, (xi, yi) in enumerate(zip(xs, ys)):
            share = xi.shape[0] / n
            with autocast():
                part = loss_fn(model(xi), yi)
            if private:  # Opacus's per-example gradients are already split-independent
                part.backward()
                total += share * part.detach().float()
                if step_hooks is not None:
                    step_hooks.before_step(model)
                if i < parts - 1:
                    optimizer.signal_skip_step(do_skip=True)
                    optimizer.step()  # clip and add to the sum; no noise, no move
                    optimizer.zero_grad(set_to_none=True)  # keeps the clipped sum
            else:
                part = part * share
                scaled_backward(part, scaler)
                total += part.detach().float()
            del part
        if proximal is not None:
            term = proximal()
            scaled_backward(term, scaler)
            total += term.detach().float()
        return total
