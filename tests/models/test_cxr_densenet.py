"""The chest X-ray DenseNet: output shapes, gradients, the small variant, pretrained channel folding."""

from __future__ import annotations

import monai.networks.nets.densenet as monai_densenet
import pytest
import torch
from monai.networks.nets import DenseNet121

from models.cxr_densenet import SMALL_CONFIG, make_cxr_densenet


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny tensors on a shared 2-core machine: one thread avoids oversubscription (10x faster)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("num_labels", [1, 3])
def test_small_variant_gives_one_logit_per_label(num_labels):
    model = make_cxr_densenet(num_labels=num_labels, small=True)
    out = model(torch.rand(2, 1, 64, 64))
    assert out.shape == (2, num_labels)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("num_labels", [1, 3])
def test_densenet121_gives_one_logit_per_label(num_labels):
    model = make_cxr_densenet(num_labels=num_labels)
    assert isinstance(model, DenseNet121)
    model.eval()
    with torch.no_grad():
        out = model(torch.rand(1, 1, 32, 32))  # the smallest input DenseNet-121 accepts (stride 32)
    assert out.shape == (1, num_labels)


def test_small_variant_is_a_much_smaller_densenet():
    small = make_cxr_densenet(small=True)
    full = make_cxr_densenet()
    n_small = sum(p.numel() for p in small.parameters())
    n_full = sum(p.numel() for p in full.parameters())
    assert n_small < 200_000 < 6_000_000 < n_full
    dense_blocks = [name for name, _ in small.features.named_children() if name.startswith("denseblock")]
    assert len(dense_blocks) == len(SMALL_CONFIG["block_config"])
    assert small.features.conv0.out_channels == SMALL_CONFIG["init_features"]


def test_every_parameter_gets_a_gradient_from_bce():
    torch.manual_seed(0)
    model = make_cxr_densenet(num_labels=3, small=True)
    logits = model(torch.rand(4, 1, 48, 48))
    targets = torch.tensor([[0, 1, 1], [1, 0, 0], [0, 0, 1], [1, 1, 0]], dtype=torch.float32)
    torch.nn.BCEWithLogitsLoss()(logits, targets).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert missing == []


def test_in_channels_are_honoured():
    model = make_cxr_densenet(num_labels=2, in_channels=3, small=True)
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 2)


@pytest.mark.parametrize(
    "kwargs", [{"num_labels": 0}, {"in_channels": 0}, {"pretrained": True, "small": True}]
)
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        make_cxr_densenet(**kwargs)


def test_pretrained_grey_network_sees_what_the_rgb_network_sees(monkeypatch):
    """ImageNet weights (faked: no network in tests) load, and conv0 is folded to one channel.

    A grey image through the 1-channel network must give the same features as
    the same image replicated on 3 channels through the RGB network.
    """
    torch.manual_seed(0)
    fake_imagenet = DenseNet121(spatial_dims=2, in_channels=3, out_channels=1000).state_dict()
    fake_imagenet = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
                     for k, v in fake_imagenet.items()}
    monkeypatch.setattr(monai_densenet, "load_state_dict_from_url", lambda *args, **kwargs: dict(fake_imagenet))

    grey = make_cxr_densenet(num_labels=1, in_channels=1, pretrained=True).eval()
    rgb = make_cxr_densenet(num_labels=1, in_channels=3, pretrained=True).eval()
    conv0 = grey.state_dict()["features.conv0.weight"]
    assert conv0.shape[1] == 1
    torch.testing.assert_close(conv0, fake_imagenet["features.conv0.weight"].sum(dim=1, keepdim=True))
    torch.testing.assert_close(
        grey.state_dict()["features.norm5.running_var"], fake_imagenet["features.norm5.running_var"]
    )
    x = torch.rand(1, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(grey.features(x), rgb.features(x.repeat(1, 3, 1, 1)), rtol=1e-4, atol=1e-4)
