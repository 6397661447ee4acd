"""pvFed's supervised fits at a site: the local model, then the redefined output layer.

Both are the same loop (Nishikawa et al. 2024, section 3): epochs of shuffled
mini-batches with the site's run-config optimiser, learning rate and batch size,
the task's loss, and the epoch whose model has the best validation ROC AUC kept
(the paper's "local best"; the last epoch when the validation AUC is undefined,
a one-class validation split). The local model trains end to end; the redefined
output layer trains on ``[global vector, extractor(x)]`` with the extractor frozen,
i.e. on fixed inputs computed once.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from clients.prediction.classifier import macro_auc
from clients.training.site_task import make_optimizer
from clients.training.trainer import NonFiniteLossError

__all__ = ["FitSettings", "Fitted", "outputs", "auc", "fit_classifier"]


@dataclass(frozen=True)
class FitSettings:
    """A fit's schedule: run config ``batch-size``, ``optimizer``, ``lr``, ``momentum``; a seed."""

    epochs: int
    batch_size: int
    lr: float
    optimizer: str = "adam"
    momentum: float = 0.9
    seed: int = 0


@dataclass(frozen=True)
class Fitted:
    """The kept epoch (0: the starting weights) and its validation AUC (None: undefined, the
    last epoch kept)."""

    epoch: int
    val_auc: float | None


@torch.no_grad()
def outputs(model: nn.Module, inputs: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """``model(inputs)`` in eval mode, batch by batch, on the model's device; returned on CPU."""
    model.eval()
    device = next(model.parameters()).device
    parts = [model(inputs[i:i + batch_size].to(device)).float().cpu()
             for i in range(0, len(inputs), batch_size)]
    return torch.cat(parts) if parts else torch.zeros((0,))


def auc(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Macro ROC AUC of ``model``'s sigmoid outputs; None when undefined or no item."""
    if not len(inputs):
        return None
    return macro_auc(torch.sigmoid(outputs(model, inputs)), labels)


def _batches(count: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """A shuffled epoch's index batches; a last batch of one item is dropped (batch norm)."""
    order = torch.randperm(count, generator=generator)
    batches = list(order.split(batch_size))
    if len(batches) > 1 and len(batches[-1]) == 1:
        batches.pop()
    return batches


def fit_classifier(model: nn.Module, loss_fn: nn.Module,
                   train: tuple[torch.Tensor, torch.Tensor],
                   val: tuple[torch.Tensor, torch.Tensor], settings: FitSettings,
                   keep_start: bool = False) -> Fitted:
    """Train ``model`` in place and leave it at its best validation-AUC epoch.

    With ``keep_start`` the starting weights compete as epoch 0: the fit never leaves
    the model worse on the validation patients than it started (the redefined output
    layer, which starts as the local model's, :mod:`clients.vertical.pvfed_site`).

    Parameters
    ----------
    model : nn.Module
        Trained from its current weights, on its current device.
    loss_fn : nn.Module
        The task's loss on logits (``BCEWithLogitsLoss`` for a classification task).
    train, val : tuple of torch.Tensor
        ``(inputs, labels)`` of the training and validation patients.
    settings : FitSettings
    keep_start : bool
        Whether the starting weights may be kept (epoch 0).

    Raises
    ------
    NonFiniteLossError
        If a training loss is NaN or infinite.
    ValueError
        If there is no training patient.
    """
    inputs, labels = train
    if not len(inputs):
        raise ValueError("no training patient among the aligned patients")
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(settings.seed)
    optimiser = make_optimizer(settings.optimizer, model.parameters(), settings.lr,
                               settings.momentum)
    best = Fitted(settings.epochs, None)
    best_state = None
    for epoch in range(0 if keep_start else 1, settings.epochs + 1):
        model.train()
        for batch in _batches(len(inputs), settings.batch_size, generator) if epoch else ():
            optimiser.zero_grad()
            loss = loss_fn(model(inputs[batch].to(device)), labels[batch].to(device))
            if not math.isfinite(float(loss.detach())):
                raise NonFiniteLossError(f"pvFed fit: non-finite training loss at epoch {epoch}")
            loss.backward()
            optimiser.step()
        score = auc(model, *val)
        if score is not None and (best.val_auc is None or score > best.val_auc):
            best, best_state = Fitted(epoch, score), copy.deepcopy(model.state_dict())
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return best
