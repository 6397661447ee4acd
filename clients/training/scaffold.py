"""SCAFFOLD's correction of a site's local steps, and option II's new control variate.

Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning",
ICML 2020, Algorithm 1: each local step is ``y <- y - eta_l (g_i(y) - c_i + c)``, so
:class:`ScaffoldCorrection` (the training loop's :class:`~clients.training.trainer.StepHooks`)
adds ``c - c_i`` to every parameter's gradient before the optimiser step; after the ``K``
steps, option II (:func:`option_two`) gives ``c_i^+ = c_i - c + (x - y) / (K eta_l)``.

No Flower here; the control variates are ``{parameter name: float array of its shape}``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from clients.training.trainer import StepHooks

__all__ = ["ScaffoldCorrection", "StepHooks", "option_two"]


class ScaffoldCorrection:
    """Step hooks that add ``c - c_i`` to each named parameter's gradient (SCAFFOLD).

    Parameters
    ----------
    correction : Mapping[str, np.ndarray]
        ``{parameter name: c - c_i}``, each of the parameter's shape; parameters not
        named are not corrected.
    """

    def __init__(self, correction: Mapping[str, np.ndarray]) -> None:
        self.correction = {name: np.asarray(value, np.float32)
                           for name, value in correction.items()}
        self._tensors: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def before_step(self, model: nn.Module) -> None:
        """``grad <- grad + c - c_i`` on every named parameter that has a gradient."""
        for name, p in model.named_parameters():
            if p.grad is None or name not in self.correction:
                continue
            tensor = self._tensors.get(name)
            if tensor is None or tensor.device != p.device or tensor.dtype != p.grad.dtype:
                tensor = torch.as_tensor(self.correction[name]).to(p.grad.device, p.grad.dtype)
                self._tensors[name] = tensor
            p.grad.add_(tensor)

    def after_step(self, model: nn.Module) -> None:
        """Nothing after the step: the correction acts on the gradient only."""


def option_two(c_i: np.ndarray, c: np.ndarray, moved: np.ndarray, steps_norm: float,
               lr: float) -> np.ndarray:
    """Option II: ``c_i^+ = c_i - c + (x - y) / (K eta_l)``.

    Parameters
    ----------
    c_i, c : numpy.ndarray
        The site's and the server's control variates.
    moved : numpy.ndarray
        ``x - y``: the received model minus the trained one.
    steps_norm : float
        ``K`` for plain SGD; with heavy-ball momentum or a proximal term the solver's
        ``||a||_1`` (:meth:`strategies.wire.local_solver.LocalSolver.a_norm`), its effective steps.
    lr : float
        ``eta_l``, the local learning rate.
    """
    return (np.asarray(c_i, np.float64) - c + np.asarray(moved, np.float64)
            / (steps_norm * lr)).astype(np.float32)
