"""pe-seg's ``model-size``: ``small`` keeps the default U-Net, ``full`` is the clinical width."""

from __future__ import annotations

import torch

from clients.pe_seg.task import PESegTask
from clients.training.task_settings import TaskSettings


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_small_is_the_default_u_net_and_full_has_tens_of_millions_of_parameters():
    small = PESegTask.model_for(TaskSettings(image_size=64, slab_slices=9))
    full = PESegTask.model_for(TaskSettings(image_size=512, slab_slices=9, model_size="full"))
    assert _parameters(small) == 207_508
    assert _parameters(full) == 25_978_844
    with torch.no_grad():
        out = full.eval()(torch.zeros(1, 9, 32, 32))
    assert out.shape == (1, 1, 32, 32)
