"""The small CNN of the PneumoniaMNIST benchmarks: sizes, buffers, seeded initialisation."""

from __future__ import annotations

import pytest
import torch

from models.small_cnn import SmallCNN


@pytest.mark.parametrize("norm, buffers", [("bn", 3 * 3), ("gn", 0)])
def test_three_block_cnn_has_56k_weights_and_norm_buffers(norm, buffers):
    model = SmallCNN((32, 64, 64), norm=norm)
    assert sum(p.numel() for p in model.parameters()) == 56_481
    assert len(list(model.buffers())) == buffers  # BN: running mean, var, counter per block
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 1)


def test_two_block_cnn_with_hidden_layer_has_26k_weights_and_biases():
    model = SmallCNN((8, 16), norm=None, hidden=32, num_outputs=2)
    assert sum(p.numel() for p in model.parameters()) == 26_434
    assert model.features[0].bias is not None and not list(model.buffers())
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 2)


def test_same_seed_same_weights():
    torch.manual_seed(4)
    a = SmallCNN((8, 16), norm=None, hidden=32, num_outputs=2).state_dict()
    torch.manual_seed(4)
    b = SmallCNN((8, 16), norm=None, hidden=32, num_outputs=2).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="norm"):
        SmallCNN(norm="layer")
    with pytest.raises(ValueError, match="px"):
        SmallCNN((8, 8, 8, 8, 8), image_size=28)
