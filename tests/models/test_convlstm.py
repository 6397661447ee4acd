"""The ConvLSTM volume classifier: gate equations, hard sigmoid, scan directions, shapes, gradients."""

from __future__ import annotations

import pytest
import torch

from models.convlstm import (
    ASCENDING,
    DESCENDING,
    ConvLSTM,
    ConvLSTMCell,
    ConvLSTMClassifier3D,
    hard_sigmoid,
)


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


def test_hard_sigmoid_is_the_keras_clip():
    x = torch.tensor([-10.0, -2.5, -1.0, 0.0, 1.0, 2.0, 2.5, 10.0])
    expected = torch.tensor([0.0, 0.0, 0.3, 0.5, 0.7, 0.9, 1.0, 1.0])
    assert torch.allclose(hard_sigmoid(x), expected, atol=1e-6)
    # not PyTorch's hardsigmoid (slope 1/6)
    assert not torch.allclose(hard_sigmoid(x), torch.nn.functional.hardsigmoid(x))


def test_cell_step_follows_the_gate_equations():
    cell = ConvLSTMCell(2, 3, kernel_size=3)
    with torch.no_grad():
        for p in cell.parameters():
            p.normal_(0.0, 0.5)
    x, h, c = torch.randn(2, 2, 5, 5), torch.randn(2, 3, 5, 5), torch.randn(2, 3, 5, 5)
    h_new, c_new = cell(x, (h, c))

    gates = cell.input_conv(x) + cell.hidden_conv(h)
    i, f, g, o = gates.chunk(4, dim=1)
    hs = lambda t: torch.clamp(0.2 * t + 0.5, 0.0, 1.0)  # noqa: E731
    c_ref = hs(f) * c + hs(i) * torch.tanh(g)
    h_ref = hs(o) * torch.tanh(c_ref)
    assert torch.allclose(c_new, c_ref, atol=1e-6) and torch.allclose(h_new, h_ref, atol=1e-6)
    # The first step (no state) is the same as a step from zero state.
    h0, c0 = cell(x)
    hz, cz = cell(x, cell.initial_state(x))
    assert torch.allclose(h0, hz, atol=1e-6) and torch.allclose(c0, cz, atol=1e-6)


def test_forget_gate_bias_starts_at_one():
    cell = ConvLSTMCell(1, 4)
    bias = cell.input_conv.bias.detach()
    assert torch.equal(bias[4:8], torch.ones(4))
    assert torch.equal(torch.cat([bias[:4], bias[8:]]), torch.zeros(12))
    assert cell.hidden_conv.bias is None
    model = ConvLSTMClassifier3D(widths=(2, 3), forget_bias=2.0)
    for unit, width in zip(model.units, (2, 3)):
        assert torch.equal(unit.lstm.cell.input_conv.bias.detach()[width : 2 * width], torch.full((width,), 2.0))
    # hard sigmoid of the initial forget pre-activation: 0.7 (b = 1) and 0.9 (b = 2)
    assert hard_sigmoid(torch.tensor([1.0, 2.0])).tolist() == pytest.approx([0.7, 0.9])


@pytest.mark.parametrize("direction", [ASCENDING, DESCENDING])
def test_scan_order_is_causal_in_its_direction(direction):
    layer = ConvLSTM(1, 2, direction=direction).eval()
    x = torch.randn(1, 6, 1, 4, 4)
    # Change the slice the scan reads last: every earlier output must stay the same.
    last = 5 if direction == ASCENDING else 0
    y = x.clone()
    y[:, last] += 1.0
    with torch.no_grad():
        out_x, out_y = layer(x), layer(y)
    unchanged = [t for t in range(6) if t != last]
    assert out_x.shape == (1, 6, 2, 4, 4)
    assert torch.equal(out_x[:, unchanged], out_y[:, unchanged])
    assert not torch.allclose(out_x[:, last], out_y[:, last])
    # Change the slice the scan reads first: every output changes.
    first = 0 if direction == ASCENDING else 5
    z = x.clone()
    z[:, first] += 1.0
    with torch.no_grad():
        out_z = layer(z)
    assert all(not torch.allclose(out_x[:, t], out_z[:, t]) for t in range(6))


def test_descending_is_ascending_on_reversed_slices():
    up = ConvLSTM(2, 3, direction=ASCENDING)
    down = ConvLSTM(2, 3, direction=DESCENDING)
    down.load_state_dict(up.state_dict())
    x = torch.randn(2, 5, 2, 6, 6)
    with torch.no_grad():
        assert torch.allclose(down(x), up(x.flip(1)).flip(1), atol=1e-6)
    up_last = ConvLSTM(2, 3, direction=ASCENDING, return_sequences=False)
    down_last = ConvLSTM(2, 3, direction=DESCENDING, return_sequences=False)
    up_last.load_state_dict(up.state_dict())
    down_last.load_state_dict(up.state_dict())
    with torch.no_grad():
        assert torch.equal(up_last(x), up(x)[:, -1])  # state after slice T-1
        assert torch.equal(down_last(x), down(x)[:, 0])  # state after slice 0


def test_classifier_shapes_and_probabilities():
    model = ConvLSTMClassifier3D(widths=(4, 4, 8, 8))
    assert model.directions == (ASCENDING, DESCENDING, ASCENDING, DESCENDING)
    x = torch.randn(3, 1, 5, 32, 32)
    logits = model(x)
    assert logits.shape == (3, 1)
    assert model.training
    probs = model.predict_proba(x)
    assert model.training  # mode restored
    model.eval()
    with torch.no_grad():
        assert torch.allclose(probs, torch.sigmoid(model(x)), atol=1e-6)
    assert probs.shape == (3, 1) and bool(((probs > 0) & (probs < 1)).all())
    loss = torch.nn.BCEWithLogitsLoss()(logits, torch.tensor([[0.0], [1.0], [1.0]]))
    assert torch.isfinite(loss)


def test_default_architecture():
    model = ConvLSTMClassifier3D()
    assert model.widths == (32, 32, 64, 64)
    assert [u.lstm.direction for u in model.units] == [ASCENDING, DESCENDING, ASCENDING, DESCENDING]
    assert [u.lstm.return_sequences for u in model.units] == [True, True, True, False]
    assert [u.lstm.cell.hidden_channels for u in model.units] == [32, 32, 64, 64]
    assert model.fc.in_features == 64 and model.fc.out_features == 1
    assert model.min_in_plane_size == 16


def test_scan_direction_of_the_classifier():
    torch.manual_seed(1)
    up = ConvLSTMClassifier3D(widths=(4,), directions=(ASCENDING,)).eval()
    down = ConvLSTMClassifier3D(widths=(4,), directions=(DESCENDING,)).eval()
    down.load_state_dict(up.state_dict())
    # Slices that brighten with z: the stack is not symmetric under reversal.
    x = torch.linspace(0.0, 3.0, 7)[None, None, :, None, None] * torch.rand(2, 1, 7, 8, 8)
    full = ConvLSTMClassifier3D(widths=(4, 4))  # train mode: batch statistics, no untrained running stats
    with torch.no_grad():
        # Same weights, opposite scans: reading the stack backwards is reading the reversed stack.
        assert torch.allclose(down(x), up(x.flip(2)), atol=1e-6)
        # The order matters: reversing the slices changes the output.
        assert (up(x) - up(x.flip(2))).abs().min() > 1e-4
        assert (full(x) - full(x.flip(2))).abs().min() > 1e-4


def test_gradients_reach_every_parameter():
    model = ConvLSTMClassifier3D(widths=(4, 4, 6, 6))
    x = torch.randn(2, 1, 4, 16, 16)
    torch.nn.BCEWithLogitsLoss()(model(x), torch.tensor([[0.0], [1.0]])).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert missing == []


@pytest.mark.parametrize(
    "kwargs",
    [{"widths": ()}, {"widths": (4, 0)}, {"in_channels": 0},
     {"widths": (4, 4), "directions": (ASCENDING,)}, {"widths": (4,), "directions": ("sideways",)}],
)
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        ConvLSTMClassifier3D(**kwargs)


def test_bad_inputs():
    model = ConvLSTMClassifier3D(widths=(2, 2, 2, 2))
    with pytest.raises(ValueError, match=">= 16"):
        model(torch.randn(1, 1, 3, 8, 8))
    with pytest.raises(ValueError, match=r"\(B, C, D, H, W\)"):
        model(torch.randn(1, 3, 16, 16))
    with pytest.raises(ValueError, match="channel"):
        model(torch.randn(1, 2, 3, 16, 16))
    with pytest.raises(ValueError):
        ConvLSTMCell(1, 2, kernel_size=2)
