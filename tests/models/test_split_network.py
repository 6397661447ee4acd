"""The split network is the network: same forward, and the split exchange gives its gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from models.cxr_densenet import make_cxr_densenet
from models.split_network import network_blocks, split_network


def _densenet() -> nn.Module:
    torch.manual_seed(0)
    return make_cxr_densenet(small=True)


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return (torch.rand(6, 1, 32, 32, generator=generator),
            torch.tensor([[1.0], [0.0], [1.0], [0.0], [0.0], [1.0]]))


def test_a_densenet_is_its_features_then_its_class_layers():
    model = _densenet()
    blocks = network_blocks(model)
    assert len(blocks) == len(model.features) + len(model.class_layers) == 14
    assert blocks[0] is model.features.conv0 and blocks[-1] is model.class_layers.out


@pytest.mark.parametrize("head_layers", [0, 1, 3])
def test_the_parts_in_order_are_the_network(head_layers):
    model = _densenet().eval()
    split = split_network(model, cut=4, head_layers=head_layers)
    x, _ = _images()
    with torch.no_grad():
        assert torch.equal(split.forward(x), model(x))
    assert split.u_shaped is (head_layers > 0)
    assert len(split.bottom) == 4 and len(split.head) == head_layers
    # the parts share the network's weights: nothing is copied
    assert split.bottom[0].weight is model.features.conv0.weight


def _unsplit_gradients(model: nn.Module, x: torch.Tensor,
                       y: torch.Tensor) -> dict[str, torch.Tensor]:
    reference = copy.deepcopy(model)
    nn.BCEWithLogitsLoss()(reference(x), y).backward()
    return {name: p.grad.clone() for name, p in reference.named_parameters()}


@pytest.mark.parametrize("cut", [2, 5])
def test_vanilla_exchange_gives_the_networks_gradients(cut):
    """Site: a1 = bottom(x); coordinator: loss(middle(a1)), returns dL/da1; site: a1.backward.
    Cut 2 puts DenseNet's in-place ReLU first at the coordinator."""
    model = _densenet().train()
    x, y = _images()
    expected = _unsplit_gradients(model, x, y)
    split = split_network(model, cut=cut)
    a1 = split.bottom(x)
    received = a1.detach().requires_grad_()              # the coordinator's copy
    nn.BCEWithLogitsLoss()(split.middle(received), y).backward()
    a1.backward(received.grad)                           # the returned cut gradient
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-7, msg=name)


def test_u_shaped_exchange_gives_the_networks_gradients():
    """Site a1; coordinator a2 = middle(a1); site loss(head(a2)), returns dL/da2; coordinator
    back-propagates the middle, returns dL/da1; site back-propagates the bottom."""
    model = _densenet().train()
    x, y = _images()
    expected = _unsplit_gradients(model, x, y)
    split = split_network(model, cut=4, head_layers=4)     # the head starts with an in-place ReLU
    a1 = split.bottom(x)
    at_coordinator = a1.detach().requires_grad_()
    a2 = split.middle(at_coordinator)
    at_site = a2.detach().requires_grad_()
    nn.BCEWithLogitsLoss()(split.head(at_site), y).backward()
    a2.backward(at_site.grad)
    a1.backward(at_coordinator.grad)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-7, msg=name)


def test_a_sequential_is_split_with_nested_blocks_flattened():
    model = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)),
                          nn.Linear(2, 1))
    split = split_network(model, cut=2, head_layers=1)
    assert len(network_blocks(model)) == 4
    assert [type(b) for b in split.bottom] == [nn.Linear, nn.ReLU]
    assert [type(b) for b in split.middle] == [nn.Linear]
    assert list(split.site_part().keys()) == ["bottom", "head"]


@pytest.mark.parametrize("cut, head_layers, key", [
    (0, 0, "vertical.cut"), (14, 0, "vertical.cut"), (13, 1, "vertical.cut"),
    (2, 13, "vertical.head-layers"), (2, -1, "vertical.head-layers")])
def test_a_cut_out_of_range_names_the_key(cut, head_layers, key):
    with pytest.raises(ValueError, match=key):
        split_network(_densenet(), cut=cut, head_layers=head_layers)


def test_a_network_of_unknown_blocks_is_refused():
    with pytest.raises(ValueError, match="cannot be split"):
        network_blocks(nn.Linear(2, 1))
