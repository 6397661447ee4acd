"""The 2.5D U-Net: shapes, prior initialisation, gradients."""

from __future__ import annotations

import pytest
import torch

from models.unet25d import make_unet25d


def test_slab_in_centre_mask_out():
    model = make_unet25d(slab_slices=9)
    out = model(torch.randn(2, 9, 64, 64))
    assert out.shape == (2, 1, 64, 64)


def test_output_starts_at_the_foreground_prior():
    torch.manual_seed(0)
    model = make_unet25d(foreground_prior=0.01)
    with torch.no_grad():
        prob = torch.sigmoid(model(torch.rand(4, 9, 32, 32))).mean().item()
    assert 0.001 < prob < 0.05


def test_every_parameter_gets_a_gradient():
    model = make_unet25d(slab_slices=3, channels=(8, 16))
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert missing == []


@pytest.mark.parametrize("kwargs", [{"slab_slices": 8}, {"slab_slices": 0},
                                    {"channels": (16,)}, {"foreground_prior": 1.0}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        make_unet25d(**kwargs)


@pytest.mark.gpu
def test_runs_on_cuda_with_autocast():
    model = make_unet25d().cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(torch.randn(2, 9, 64, 64, device="cuda"))
    assert out.shape == (2, 1, 64, 64) and torch.isfinite(out.float()).all()
