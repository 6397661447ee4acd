"""Out of memory at a site (issue 49): a batch that does not fit is trained in micro-batches
with gradient accumulation (clients/training/micro_batches.py), the same update within fp
tolerance, logged once, and the round does not fail.

The memory cap is artificial on CPU: a hook on the model raises torch.OutOfMemoryError, as
the CUDA allocator would, when a forward (or backward) pass holds more than ``cap``
examples. The GPU test forces a real CUDA OOM.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from clients.registry import task_class
from clients.training.micro_batches import BatchTooLargeError
from clients.training.opacus_loader import opacus
from clients.training.site_task import TaskSettings, make_optimizer
from clients.training.trainer import select_device, train_steps
from models.small_cnn import SmallCNN

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = select_device("cpu")
FALLBACK_LINE = "does not fit in memory"


class MemoryCap:
    """Raise torch.OutOfMemoryError in ``model``'s forward (or its last layer's backward) when
    the pass holds more than ``cap`` examples; counts the raises."""

    def __init__(self, model: nn.Module, cap: int, where: str = "forward") -> None:
        self.cap, self.raised = cap, 0
        if where == "forward":
            model.register_forward_pre_hook(lambda _m, args: self._check(args[0]))
        else:
            last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
            last.register_full_backward_pre_hook(lambda _m, grads: self._check(grads[0]))

    def _check(self, tensor: torch.Tensor) -> None:
        if tensor.shape[0] > self.cap:
            self.raised += 1
            raise torch.OutOfMemoryError(f"test cap: {tensor.shape[0]} > {self.cap} examples")


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return SmallCNN((8, 16), norm=None, hidden=32, num_outputs=2,  # no BatchNorm, no dropout
                    image_size=16)


def _images(n: int = 26) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 1, 16, 16, generator=g),
                         (torch.rand(n, 2, generator=g) > 0.5).float())


def _train(cap: int | None, optimizer: str = "sgd", where: str = "forward",
           proximal_mu: float = 0.0, steps: int = 5):
    """(model, result, cap) after ``steps`` steps of batches 10, 10, 6, 10, 10."""
    model = _cnn()
    memory = MemoryCap(model, cap, where) if cap is not None else None
    opt = make_optimizer(optimizer, model.parameters(), 0.05, 0.9)
    result = train_steps(model, DataLoader(_images(), batch_size=10), nn.BCEWithLogitsLoss(),
                         opt, steps=steps, compute=CPU, proximal_mu=proximal_mu)
    return model, result, memory


def _assert_same_model(a: nn.Module, b: nn.Module, atol: float = 1e-6) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert p.shape == q.shape, name
        torch.testing.assert_close(p, q, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("optimizer,where,proximal_mu", [
    ("sgd", "forward", 0.5), ("adam", "backward", 0.0)])
def test_capped_training_is_the_same_update_as_uncapped(optimizer, where, proximal_mu):
    """Cap 3 of batches of 10: split into 2 (5 each, too many), then 4 (3, 3, 2, 2); the last
    batch of 6 into 2 of 3. Mean-reduced BCE, no BatchNorm: the same weights after 5 steps
    (SGD to 1e-6; Adam divides by sqrt(v), so a gradient coordinate that is 0 in one run and
    a rounding residue in the other moves by up to ~lr: 1e-4 for Adam, still 500x below lr).
    The FedProx term is added once per step, not per micro-batch."""
    plain, expected, _ = _train(None, optimizer, proximal_mu=proximal_mu)
    capped, result, memory = _train(3, optimizer, where, proximal_mu)
    assert memory.raised >= 2  # the full batch and the halves did run out
    assert (result.steps_done, result.num_examples) == (expected.steps_done, 46)
    assert result.num_examples == expected.num_examples
    assert result.mean_loss == pytest.approx(expected.mean_loss, rel=1e-5)
    assert result.initial_loss == pytest.approx(expected.initial_loss, rel=1e-5)
    _assert_same_model(capped, plain, 1e-6 if optimizer == "sgd" else 1e-4)


def test_the_micro_batch_size_is_kept_and_logged_once(caplog):
    caplog.set_level(logging.INFO)
    _, result, memory = _train(3, steps=5)
    lines = [r for r in caplog.records if FALLBACK_LINE in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.WARNING
    assert "batch of 10 examples" in lines[0].getMessage()
    assert "micro-batches of 3 examples" in lines[0].getMessage()
    assert memory.raised == 2  # 10 and 5 at the first step; never the full batch again
    assert result.steps_done == 5


def test_no_fallback_and_no_log_line_without_an_oom(caplog):
    caplog.set_level(logging.INFO)
    _, _, memory = _train(10)  # every batch fits
    assert memory.raised == 0
    assert not [r for r in caplog.records if FALLBACK_LINE in r.getMessage()]


def test_not_even_one_example_fits_raises_the_site_error():
    with pytest.raises(BatchTooLargeError) as raised:
        _train(0)
    message = str(raised.value)
    assert "\n" not in message
    assert "batch size 10" in message and "micro-batches of 1" in message


def test_a_site_round_survives_the_cap_with_the_same_result(synthetic_site):
    """The tabular task's own training (SiteTask.train): its MLP without dropout (p = 0: the
    masks would be drawn per micro-batch), BCE mean loss."""
    task = task_class("tabular-cls")(synthetic_site("tabular-cls", seed=3),
                                     TaskSettings(num_labels=1, batch_size=8))

    def run(cap: int | None):
        model = task.build_model()
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0
        if cap is not None:
            MemoryCap(model, cap)
        result = task.train(model, steps=4, lr=0.05, momentum=0.9, compute=CPU, seed=0,
                            optimizer="adam")
        return model, result

    torch.manual_seed(0)
    plain, expected = run(None)
    torch.manual_seed(0)
    capped, result = run(3)
    assert (result.steps_done, result.num_examples) == (expected.steps_done,
                                                        expected.num_examples)
    assert result.mean_loss == pytest.approx(expected.mean_loss, rel=1e-5)
    _assert_same_model(capped, plain)


def _dp_train(cap: int | None):
    """DP-SGD with clipping (C = 1: about half of the per-example norms, 0.85-1.4, clipped,
    so the test sees a wrongly scaled per-example gradient) and no noise, over
    a fixed (non-Poisson) loader, so the runs can be compared."""
    model = _cnn()
    memory = MemoryCap(model, cap) if cap is not None else None
    engine = opacus().PrivacyEngine(accountant="rdp")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    _, dp_opt, loader = engine.make_private(
        module=model, optimizer=opt, data_loader=DataLoader(_images(), batch_size=10),
        noise_multiplier=0.0, max_grad_norm=1.0, poisson_sampling=False, wrap_model=False)
    result = train_steps(model, loader, nn.BCEWithLogitsLoss(), dp_opt, steps=3, compute=CPU)
    return model, result, engine.accountant.history, memory


def test_dp_sgd_micro_batches_clip_per_example_and_step_once():
    """Opacus clips each example, so the micro-batch losses are not weighted; the noise
    (here 0), the division by the expected batch size and the accountant's step come once."""
    plain, expected, history, _ = _dp_train(None)
    capped, result, capped_history, memory = _dp_train(3)
    assert memory.raised >= 2
    assert (result.steps_done, result.num_examples) == (expected.steps_done,
                                                        expected.num_examples)
    assert capped_history == history  # 3 accounted steps, not one per micro-batch
    _assert_same_model(capped, plain)


@pytest.mark.gpu
def test_a_real_cuda_oom_falls_back_to_micro_batches(caplog):
    """A batch whose activations exceed the GPU (2048 x 2048 images, two 64-channel
    convolutions and their ReLUs in bf16: about 2 GB per example, 256 examples: ~500 GB)
    trains in micro-batches."""
    caplog.set_level(logging.INFO)
    compute = select_device("cuda")
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 1)).to(compute.device)
    batch = 256
    x = torch.randn(batch, 1, 2048, 2048)
    y = (torch.rand(batch, 1) > 0.5).float()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    result = train_steps(model, [(x, y)], nn.BCEWithLogitsLoss(), opt, steps=2,
                         compute=compute)
    lines = [r for r in caplog.records if FALLBACK_LINE in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert (result.steps_done, result.num_examples) == (2, 2 * batch)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    torch.cuda.empty_cache()
