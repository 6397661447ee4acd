"""Pruning at a site: the model's prunable structure and training under a mask (PruneFL).

PruneFL (Jiang et al., "Model pruning enables efficient federated learning on edge
devices", arXiv:1909.12326) trains a sparse model: the coordinator holds a mask of the
kept weights (``strategies/plugins/pruning``); a site trains only those and, in the
rounds the coordinator asks for it, reports the squared gradients of EVERY weight, pruned
ones included, summed over its local steps (the first-order estimate of the empirical
risk's reduction of a weight, sec. IV-B, eq. 6), from which the mask is re-chosen.

- :func:`model_structure` says what a unit of pruning is, in the JSON-able form the
  numpy side reads: one weight (``unstructured``) or one output channel of a
  torch-pruning dependency group (``structured``, :mod:`clients.training.pruning_graph`).
- :class:`MaskedTraining` is the training loop's :class:`~clients.training.trainer.StepHooks`:
  pruned coordinates neither receive a gradient nor move.
- :func:`~clients.training.pruning_surgery.shrink` removes a structured mask's pruned
  channels for real (a smaller, faster network), and :func:`model_cost` counts a model's
  parameters and FLOPs.

No Flower here; masks are ``{parameter name: bool array of its full shape}``, True = kept.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from clients.training.pruning_graph import (PruningSurgeryError, model_cost,
                                            structured_groups)
from clients.training.pruning_surgery import Shrunk, shrink
from clients.training.trainer import StepHooks

__all__ = ["MODES", "MaskedTraining", "PruningSurgeryError", "Shrunk", "StepHooks",
           "model_cost", "model_structure", "shrink"]

#: What one unit of pruning is: one weight, or one output channel of a dependency group.
MODES = ("unstructured", "structured")


def model_structure(model: nn.Module, mode: str, example_input: torch.Tensor) -> dict:
    """The prunable units of ``model``: ``{"mode": mode, "groups": [...]}`` (JSON-able).

    ``unstructured``: one group ``{"name": p, "array": p}`` per trainable parameter of two
    or more dimensions (weights of convolutions and linear layers, not biases or norms),
    in state-dict order; every element of it is a unit. ``structured``: one group per
    torch-pruning dependency group of a layer's output channels
    (:func:`clients.training.pruning_graph.structured_groups`). Deterministic.

    Raises
    ------
    PruningSurgeryError
        On a mode other than :data:`MODES`.
    """
    if mode == "structured":
        return {"mode": mode, "groups": structured_groups(model, example_input)}
    if mode != "unstructured":
        raise PruningSurgeryError(f"run config key 'pruning.mode' must be one of {MODES}, "
                                  f"got {mode!r}")
    params = dict(model.named_parameters())
    return {"mode": mode, "groups": [
        {"name": name, "array": name} for name in model.state_dict()
        if name in params and params[name].requires_grad and params[name].dim() >= 2]}


class MaskedTraining:
    """Step hooks that train only a mask's kept coordinates (and collect squared gradients).

    Before each optimiser step (:meth:`before_step`) the squared gradient of every
    parameter, all coordinates, is added to a running sum when ``collect``, then the
    gradient is zeroed at the pruned coordinates; after it (:meth:`after_step`) the pruned
    weights are set back to exactly 0 (an optimiser with momentum or Adam's state would
    otherwise move them).

    Under DP-SGD (Opacus; a parameter carries ``grad_sample``) the per-example gradients
    are zeroed at the pruned coordinates before Opacus clips them, so the clipping norm
    is that of the kept coordinates only; the squared gradients are then those of the
    privatised step's gradient (clipped, noised, averaged: read in :meth:`after_step`),
    post-processing of what DP-SGD releases anyway, never of a raw gradient. Its pruned
    coordinates carry the noise only.

    Parameters
    ----------
    masks : Mapping[str, np.ndarray]
        ``{parameter name: bool array of the parameter's shape}``; True = kept. Parameters
        not named are fully kept.
    collect : bool
        Whether to sum the squared gradients (the rounds PruneFL re-prunes after).
    """

    def __init__(self, masks: Mapping[str, np.ndarray], collect: bool) -> None:
        self.masks = {name: np.asarray(mask, dtype=bool) for name, mask in masks.items()}
        self.collect = collect
        self._squared: dict[str, torch.Tensor] = {}
        self._on: dict[str, torch.Tensor] = {}

    def _mask_tensors(self, model: nn.Module) -> dict[str, tuple[nn.Parameter, torch.Tensor]]:
        """``{name: (parameter, kept mask as a tensor of its dtype and device)}``.

        Raises
        ------
        PruningSurgeryError
            If a mask names no parameter of ``model`` or has another shape.
        """
        params = dict(model.named_parameters())
        out = {}
        for name, mask in self.masks.items():
            p = params.get(name)
            if p is None:
                raise PruningSurgeryError(f"pruning mask names {name!r}, not a parameter of "
                                          f"{type(model).__name__}")
            if tuple(mask.shape) != tuple(p.shape):
                raise PruningSurgeryError(f"pruning mask of {name!r} has shape {mask.shape}, "
                                          f"the parameter {tuple(p.shape)}")
            on = self._on.get(name)
            if on is None or on.device != p.device or on.dtype != p.dtype:
                on = self._on[name] = torch.as_tensor(mask, device=p.device).to(p.dtype)
            out[name] = (p, on)
        return out

    @torch.no_grad()
    def zero_pruned(self, model: nn.Module) -> None:
        """Set ``model``'s pruned weights to 0 (one fused multiply over the masked tensors)."""
        pairs = list(self._mask_tensors(model).values())
        if pairs:
            torch._foreach_mul_([p for p, _ in pairs], [on for _, on in pairs])

    def _add_squares(self, model: nn.Module) -> None:
        """Add ``grad ** 2`` of every trainable parameter to the sums (fused over the tensors:
        a per-tensor loop is launch-bound on a GPU); a step whose gradients are not all finite
        (one a loss scaler skips) adds nothing."""
        grads = {name: p.grad.detach() for name, p in model.named_parameters()
                 if p.requires_grad and p.grad is not None}
        if not grads:
            return
        values = [g.float() for g in grads.values()]
        if not bool(torch.stack(torch._foreach_norm(values)).isfinite().all()):
            return  # the scaler skips this step (it reads the same flag on the host anyway)
        for name, g in zip(grads, values):
            if name not in self._squared:
                self._squared[name] = torch.zeros_like(g)
        torch._foreach_addcmul_([self._squared[name] for name in grads], values, values)

    @torch.no_grad()
    def before_step(self, model: nn.Module) -> None:
        """Collect the squared gradients (plain training), then zero the pruned coordinates'
        gradients and per-example gradients (DP-SGD, before clipping)."""
        masks = self._mask_tensors(model)
        if self.collect and not _private(model):
            self._add_squares(model)
        with_grad = [(p.grad, on) for p, on in masks.values() if p.grad is not None]
        if with_grad:
            torch._foreach_mul_([g for g, _ in with_grad], [on for _, on in with_grad])
        for p, on in masks.values():
            samples = getattr(p, "grad_sample", None)
            for sample in (samples if isinstance(samples, list) else [samples]):
                if sample is not None:
                    sample.mul_(on)

    @torch.no_grad()
    def after_step(self, model: nn.Module) -> None:
        """Set the pruned weights back to 0; under DP-SGD, collect the privatised gradient."""
        if self.collect and _private(model):
            self._add_squares(model)
        self.zero_pruned(model)

    def squared_gradients(self) -> dict[str, np.ndarray]:
        """The summed squared gradients so far, ``{parameter name: float32 array}`` (full
        shapes; parameters that never had a gradient are left out)."""
        return {name: s.detach().cpu().numpy().astype(np.float32)
                for name, s in self._squared.items()}


def _private(model: nn.Module) -> bool:
    """Whether Opacus computed per-example gradients for this step (DP-SGD)."""
    return any(getattr(p, "grad_sample", None) is not None for p in model.parameters())
