r"""Per-FedAvg-Reptile at a site: tasks of SGD steps, each closed by a Reptile meta step.

Xia & Cui, "Personalized federated learning algorithm based on Reptile",
Computer Systems & Applications 2022, Algorithm 2 (site part); Nichol, Achiam,
Schulman, "On first-order meta-learning algorithms", arXiv:1803.02999, 2018,
Algorithm 1. From the received model, for each of :math:`\tau_{out}` tasks:
:math:`\tau_{in}` SGD steps from :math:`w` give :math:`\tilde w`, then

.. math:: w \leftarrow w - \alpha (w - \tilde w).

A task is :math:`\tau_{in}` batches drawn by the site's sampler with the task's
own seed (the paper splits the local data into :math:`\tau_{out}` chunks; a fresh
seeded draw per task is the same in expectation and keeps the task's sampling,
e.g. its positive fraction). The sign conventions and what this means for
FedNova's a-norm are in :mod:`strategies.plugins.personalisation.rules`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from clients.training.trainer import TrainResult

__all__ = ["InnerTraining", "merged_results", "reptile_meta_step", "reptile_train"]

#: ``inner(task, steps)``: train the model in place for ``steps`` SGD steps on task ``task``.
InnerTraining = Callable[[int, int], TrainResult]


@torch.no_grad()
def reptile_meta_step(model: nn.Module, start: dict[str, torch.Tensor], alpha: float) -> None:
    r"""In place: every floating-point entry :math:`w` of ``model``'s state becomes
    :math:`s - \alpha (s - w)`, with :math:`s` its value in ``start`` (the task's start).

    Integer buffers (BatchNorm's ``num_batches_tracked``) keep the task's value.
    """
    for name, value in model.state_dict().items():
        if value.is_floating_point():
            anchor = start[name].to(value.device)
            value.copy_(anchor - alpha * (anchor - value))


def merged_results(results: list[TrainResult]) -> TrainResult:
    """One :class:`TrainResult` of consecutive trainings: counts and seconds summed, the
    mean loss weighted by steps, the first training's initial loss."""
    steps = sum(r.steps_done for r in results)
    return TrainResult(
        num_examples=sum(r.num_examples for r in results),
        steps_done=steps,
        mean_loss=sum(r.mean_loss * r.steps_done for r in results) / max(steps, 1),
        initial_loss=results[0].initial_loss,
        seconds=sum(r.seconds for r in results),
        privacy_steps=tuple(step for r in results for step in r.privacy_steps),
    )


def reptile_train(model: nn.Module, inner: InnerTraining, tau_out: int, tau_in: int,
                  alpha: float, deadline: float | None = None,
                  max_steps: int | None = None) -> TrainResult:
    r"""Run :math:`\tau_{out}` tasks of :math:`\tau_{in}` steps on ``model``, in place.

    Parameters
    ----------
    model : nn.Module
        The received global model; it ends as the site's Reptile result.
    inner : InnerTraining
        Trains ``model`` for a task (fresh SGD optimiser each call).
    tau_out, tau_in : int
        Tasks, and steps per task (>= 1).
    alpha : float
        Meta step size in (0, 1].
    deadline : float, optional
        ``time.monotonic()`` after which no new task starts; a task stopped early by
        its own deadline still takes its meta step, and ends the loop.
    max_steps : int, optional
        At most this many SGD steps in all (a site's ``local-steps-cap``, or an
        instruction asking fewer steps than ``tau_out * tau_in``): the last task is
        shortened, the later ones dropped.

    Returns
    -------
    TrainResult
        Of all the tasks (:func:`merged_results`); ``steps_done`` counts SGD steps.
    """
    if tau_out < 1 or tau_in < 1:
        raise ValueError(f"tau_out and tau_in must be >= 1, got {tau_out}, {tau_in}")
    budget = tau_out * tau_in if max_steps is None else min(max_steps, tau_out * tau_in)
    results: list[TrainResult] = []
    for task in range(tau_out):
        steps = min(tau_in, budget - sum(r.steps_done for r in results))
        if steps < 1 or (results and deadline is not None and time.monotonic() >= deadline):
            break
        start = {name: value.detach().clone() for name, value in model.state_dict().items()}
        results.append(inner(task, steps))
        reptile_meta_step(model, start, alpha)
        if results[-1].steps_done < steps:
            break
    return merged_results(results)
