"""Structured pruning for real: the model without its pruned channels, and back.

A structured mask (``clients.training.pruning.model_structure`` in ``structured`` mode)
prunes whole output channels. Zeroing them leaves the network as large and as slow as
before; :func:`shrink` removes them with torch-pruning (``Group.prune``: every coupled
layer, input channels of the next ones included), so a site trains, and ``make predict``
runs, a smaller network. :meth:`Shrunk.dense_state` maps the small network's weights
back to the full shapes the federation exchanges, zeros at the removed coordinates.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from clients.training.pruning_graph import PruningSurgeryError, dependency_graph

__all__ = ["Shrunk", "pruned_units", "shrink"]


@dataclass(frozen=True)
class Shrunk:
    """A model with its pruned channels removed, and how its weights map back."""

    #: The smaller network (a copy; the dense model is unchanged).
    model: nn.Module
    #: ``{state-dict name: {axis: kept indices of the full shape}}`` of every entry that
    #: shrank (parameters and the buffers beside them).
    kept_indices: dict[str, dict[int, list[int]]]
    #: ``{state-dict name: full shape}`` of the dense model.
    full_shapes: dict[str, tuple[int, ...]]

    def dense_state(self, small_state: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """``small_state`` (the small model's state dict) in full shapes, 0 where removed.

        Raises
        ------
        PruningSurgeryError
            If an entry is missing or its shape is not the shrunk one.
        """
        dense = {}
        for name, shape in self.full_shapes.items():
            if name not in small_state:
                raise PruningSurgeryError(f"shrunk model state has no entry {name!r}")
            small = small_state[name].detach().cpu().numpy()
            kept = self.kept_indices.get(name, {})
            index = tuple(np.asarray(kept[a]) if a in kept else np.arange(n)
                          for a, n in enumerate(shape))
            expected = tuple(len(i) for i in index)
            if small.shape != expected:
                raise PruningSurgeryError(f"shrunk entry {name!r} has shape {small.shape}, "
                                          f"expected {expected}")
            full = np.zeros(shape, dtype=small.dtype)
            full[np.ix_(*index)] = small
            dense[name] = full
        return dense

    def small_state(self, dense: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`dense_state`: the full-shape ``dense`` state at the kept indices,
        a state dict for :attr:`model` (so a cached shrunk network takes a new round's weights).

        Raises
        ------
        PruningSurgeryError
            If an entry is missing or not of its full shape.
        """
        small = {}
        for name, shape in self.full_shapes.items():
            if name not in dense or tuple(dense[name].shape) != shape:
                raise PruningSurgeryError(f"dense state entry {name!r} is missing or not of "
                                          f"shape {shape}")
            value = torch.as_tensor(dense[name])
            for axis, kept in sorted(self.kept_indices.get(name, {}).items()):
                value = value.index_select(axis, torch.as_tensor(kept, dtype=torch.long))
            small[name] = value
        return small


def pruned_units(group: Mapping, masks: Mapping[str, np.ndarray]) -> list[int]:
    """The units of a structured group whose coordinates in its first slice are all pruned."""
    first = group["slices"][0]
    mask = masks.get(first["array"])
    if mask is None:
        return []
    kept = np.moveaxis(np.asarray(mask, dtype=bool), first["axis"], 0)
    return [k for k, i in enumerate(first["indices"]) if not kept[i].any()]


def _kept_indices(structure: Mapping, masks: Mapping[str, np.ndarray],
                  model: nn.Module) -> dict[str, dict[int, list[int]]]:
    """Kept indices per (parameter, axis) from the structure, and for the buffers of the
    modules whose 1-D parameters shrink (BatchNorm's running statistics)."""
    removed: dict[str, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    for group in structure["groups"]:
        units = pruned_units(group, masks)
        for piece in group["slices"]:
            removed[piece["array"]][piece["axis"]].update(piece["indices"][k] for k in units)
    state = model.state_dict()
    kept = {name: {axis: [i for i in range(state[name].shape[axis]) if i not in gone]
                   for axis, gone in axes.items() if gone}
            for name, axes in removed.items()}
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        vectors = [kept[prefix + n][0] for n, p in module.named_parameters(recurse=False)
                   if p.dim() == 1 and kept.get(prefix + n, {}).get(0) is not None]
        for buffer_name, buffer in module.named_buffers(recurse=False):
            if vectors and buffer.dim() == 1:
                kept[prefix + buffer_name] = {0: vectors[0]}
    return {name: axes for name, axes in kept.items() if axes}


def shrink(model: nn.Module, structure: Mapping, masks: Mapping[str, np.ndarray],
           example_input: torch.Tensor) -> Shrunk:
    """A copy of ``model`` without the channels of the units ``masks`` prunes (structured).

    A unit is pruned iff all its coordinates in its group's first slice are False
    (:func:`pruned_units`); torch-pruning removes it from every layer of its group.

    Raises
    ------
    PruningSurgeryError
        If ``structure`` is not structured, names a layer ``model`` lacks, or the result
        does not have the shapes the structure implies.
    """
    if structure.get("mode") != "structured":
        raise PruningSurgeryError(f"shrink needs a structured structure, got mode "
                                  f"{structure.get('mode')!r}")
    full_shapes = {name: tuple(v.shape) for name, v in model.state_dict().items()}
    kept = _kept_indices(structure, masks, model)
    small = copy.deepcopy(model)
    graph = dependency_graph(small, example_input)
    modules = dict(small.named_modules())
    for group in structure["groups"]:
        units = pruned_units(group, masks)
        if not units:
            continue
        root = modules.get(group["name"])
        if root is None:
            raise PruningSurgeryError(f"pruning structure names layer {group['name']!r}, not "
                                      f"in {type(model).__name__}")
        pruner = graph.get_pruner_of_module(root)
        graph.get_pruning_group(root, pruner.prune_out_channels, units).prune()
    shrunk = Shrunk(small, kept, full_shapes)
    for name, value in small.state_dict().items():
        expected = tuple(len(kept.get(name, {}).get(a, range(n)))
                         for a, n in enumerate(full_shapes[name]))
        if tuple(value.shape) != expected:
            raise PruningSurgeryError(f"layer entry {name!r} shrank to {tuple(value.shape)}, "
                                      f"the structure implies {expected}")
    return shrunk
