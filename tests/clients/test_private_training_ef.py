"""DP runs before the codec: the update and the error-feedback residual hold only noised gradients.

With plain SGD (no momentum, lr eta) the update a site sends is
``delta = x_global - x_local = eta * sum_t g~_t``, the sum of the gradients
Opacus privatised (clipped per example, noised) at each step: post-processing
of the DP mechanism's outputs (Dwork & Roth 2014, Prop. 2.1). The EF-SGD
residual ``e = z - decode(C(z))``, ``z = e_prev + delta``, is then a function of
those noised gradients only.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from clients.cxr_cls.task import CXRClsTask
from clients.training.classification import LabelledTensors
from clients.training.trainer import select_device
from clients.training.private_training import DpSettings
from clients.training.site_task import TaskSettings
from strategies.compression import ErrorFeedback
from strategies.wire.update_codec import pack_update, unpack_update

LR, SPEC = 0.05, "topk:0.1"


class _TinyCxr(CXRClsTask):
    """The CXR task on 12 in-memory 16 px images (no site folder)."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.settings = TaskSettings(image_size=16, batch_size=4)
        self.train_set = LabelledTensors([rng.normal(size=(16, 16)) for _ in range(12)],
                                         [np.array([i % 2], np.float32) for i in range(12)])


def _train_recording_gradients() -> tuple[list[np.ndarray], list[list[torch.Tensor]]]:
    torch.set_num_threads(1)
    task = _TinyCxr()
    torch.manual_seed(0)
    model = task.build_model(private=True)
    before = [v.detach().clone() for v in model.state_dict().values()]
    steps: list[list[torch.Tensor]] = []
    hook = register_optimizer_step_post_hook(
        lambda opt, *_: steps.append([p.grad.detach().clone() for g in opt.param_groups
                                      for p in g["params"]]))
    try:
        task.train(model, steps=4, lr=LR, momentum=0.0, compute=select_device("cpu"), seed=3,
                   optimizer="sgd", privacy=DpSettings(noise_multiplier=1.0, max_grad_norm=1.0))
    finally:
        hook.remove()
    delta = [(b - a).numpy() for b, a in zip(before, model.state_dict().values())]
    return delta, steps


def test_update_is_the_sum_of_the_privatised_gradients():
    delta, steps = _train_recording_gradients()
    assert len(steps) == 4
    noised_sum = [LR * sum(step[i] for step in steps).numpy() for i in range(len(delta))]
    for d, s in zip(delta, noised_sum):
        np.testing.assert_allclose(d, s, rtol=1e-4, atol=1e-6)


def test_error_feedback_residual_is_a_function_of_the_noised_update():
    delta, _ = _train_recording_gradients()
    feedback = ErrorFeedback(SPEC)
    packed = pack_update(delta, SPEC, 7, feedback)
    decoded = unpack_update(packed, delta, SPEC, 7)
    expected = np.concatenate([(d - x).ravel() for d, x in zip(delta, decoded)])
    np.testing.assert_allclose(feedback.state(), expected, rtol=1e-6, atol=1e-7)
