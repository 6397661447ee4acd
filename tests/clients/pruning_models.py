"""The four tasks' models at tiny settings, and masks that prune chosen structured units."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from clients.registry import task_class
from clients.training.site_task import TaskSettings

#: Tiny settings per task (the small model variants where a task has one).
TINY = {"cxr-cls": TaskSettings(image_size=32, batch_size=2, model_size="small"),
        "ct3d-cls": TaskSettings(image_size=32, volume_depth=4, batch_size=2, model_size="small"),
        "pe-seg": TaskSettings(image_size=32, slab_slices=3, batch_size=2),
        "tabular-cls": TaskSettings(num_labels=1)}


def tiny_model(task: str) -> tuple[nn.Module, torch.Tensor]:
    """The task's model (eval mode, seeded) and a random input of its example's shape (a
    batch of one, as the task's ``example_input``)."""
    torch.manual_seed(0)
    cls = task_class(task)
    example = torch.as_tensor(cls.example_input(TINY[task]))
    return cls.model_for(TINY[task]).eval(), torch.randn(example.shape)


def unit_masks(structure: Mapping, model: nn.Module,
               pruned: Mapping[str, list[int]]) -> dict[str, np.ndarray]:
    """Masks with the units ``pruned[group name]`` of the structure's groups pruned (False)."""
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    masks: dict[str, np.ndarray] = {}
    for group in structure["groups"]:
        for piece in group["slices"]:
            mask = masks.setdefault(piece["array"], np.ones(shapes[piece["array"]], bool))
            for k in pruned.get(group["name"], []):
                index = [slice(None)] * mask.ndim
                index[piece["axis"]] = piece["indices"][k]
                mask[tuple(index)] = False
    return masks


def keep_fraction(structure: Mapping, fraction: float, seed: int = 0) -> dict[str, list[int]]:
    """Pruned units per group keeping ``fraction`` of each group's units (at least one)."""
    rng = np.random.default_rng(seed)
    pruned = {}
    for group in structure["groups"]:
        n = len(group["slices"][0]["indices"])
        pruned[group["name"]] = sorted(rng.permutation(n)[:n - max(1, round(n * fraction))])
    return pruned


def masked_copy(model: nn.Module, masks: Mapping[str, np.ndarray]) -> nn.Module:
    """A copy of ``model`` with its pruned coordinates set to 0."""
    dense = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in dense.named_parameters():
            if name in masks:
                p.mul_(torch.as_tensor(masks[name], dtype=p.dtype))
    return dense
