"""What a pruned model keeps, recorded with it in MLflow, and the smaller network it runs as.

A federation with ``strategy.pruning`` logs and registers the pruned global model itself: its
weights in full shapes, pruned coordinates exactly 0, so any consumer loads it densely (the
state dict of the task's network). :func:`sparsity` measures it for the model's ``fedmed``
metadata (``pruning``) and the run's metrics: the parameters kept, their fraction, the bytes a
kept-weights-only copy takes (float32 values plus one mask bit per covered coordinate) and the
forward pass's FLOPs of the network that runs (torch-pruning's count).

A structured model runs as the network without its pruned channels (:func:`runnable_network`:
a channel whose weights are all 0 in its group is removed by torch-pruning,
:func:`clients.training.pruning.shrink`), so ``make predict`` really is faster; an unstructured
one runs dense (its zeros save bytes, not dense-kernel FLOPs).

Example::

    record = sparsity(model, example, "structured")   # {"params-kept": ..., "flops": ...}
    fast = runnable_network(model, example, "structured")
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from clients.training.pruning import model_cost, model_structure, shrink

__all__ = ["runnable_network", "sparsity"]


def _masks(model: nn.Module, mode: str, example: torch.Tensor) -> dict[str, np.ndarray]:
    """The model's mask read off its weights: a covered coordinate is kept iff it is not 0."""
    structure = model_structure(model, mode, example)
    state = {name: value.detach().cpu().numpy() for name, value in model.state_dict().items()}
    names = {group.get("array") for group in structure["groups"]} | {
        item["array"] for group in structure["groups"] for item in group.get("slices", ())}
    return {name: state[name] != 0 for name in sorted(names - {None})}


def runnable_network(model: nn.Module, example_input: np.ndarray | torch.Tensor,
                     mode: str) -> nn.Module:
    """``model`` as it runs: structured, without its pruned channels (a copy); else itself."""
    if mode != "structured":
        return model
    example = torch.as_tensor(example_input)
    return shrink(model, model_structure(model, mode, example),
                  _masks(model, mode, example), example).model.eval()


def sparsity(model: nn.Module, example_input: np.ndarray | torch.Tensor,
             mode: str) -> dict[str, float]:
    """The pruned ``model``'s size: ``params-total``, ``params-kept``, ``density``, ``bytes``
    (kept float32 values and the mask's bits), ``flops`` (of :func:`runnable_network`) and
    ``flops-dense``."""
    example = torch.as_tensor(example_input)
    params = [p.detach().cpu().numpy() for p in model.parameters()]
    total = sum(p.size for p in params)
    kept = sum(int(np.count_nonzero(p)) for p in params)
    covered = sum(m.size for m in _masks(model, mode, example).values())
    dense_cost = model_cost(model, example)
    cost = model_cost(runnable_network(model, example, mode), example)
    return {"params-total": float(total), "params-kept": float(kept),
            "density": kept / max(total, 1), "bytes": float(4 * kept + math.ceil(covered / 8)),
            "flops": float(cost["flops"]), "flops-dense": float(dense_cost["flops"])}
