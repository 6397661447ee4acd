"""The sites' learning rate over the server rounds (run-config ``lr-schedule``, ``lr-floor``).

A site computes its round's rate itself from the round number of the instruction and the
run's ``num-server-rounds``; nothing is sent for it. Torch-free, like
:mod:`clients.training.task_settings`, so that the run config is checked without torch.

``constant``
    ``lr`` in every round (the product's behaviour before the schedule existed).
``cosine``
    Cosine annealing without restarts (Loshchilov & Hutter, "SGDR: stochastic gradient
    descent with warm restarts", ICLR 2017, eq. 5) over the rounds: in round ``r`` of ``R``,
    ``eta_r = eta_min + (lr - eta_min) (1 + cos(pi (r - 1) / R)) / 2`` with
    ``eta_min = lr-floor x lr``: ``lr`` in round 1, the mean of ``lr`` and ``eta_min`` in
    round ``R / 2 + 1``, and above ``eta_min`` in round ``R`` (its last step is not wasted
    at rate 0). A train request after the last round (the cross-site fine-tune) uses round
    ``R``'s rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from strategies.wire.registry import Registry

__all__ = ["CONSTANT", "LR_SCHEDULES", "round_lr"]

#: The schedule that keeps ``lr`` in every round (the run config's default).
CONSTANT = "constant"

#: Run-config ``lr-schedule`` -> ``rate(lr, server_round, num_rounds, floor)``.
LR_SCHEDULES: Registry[Callable[[float, int, int, float], float]] = Registry(
    "learning-rate schedule", "lr-schedule")


@LR_SCHEDULES.register(CONSTANT)
def _constant(lr: float, server_round: int, num_rounds: int, floor: float) -> float:
    return lr


@LR_SCHEDULES.register("cosine")
def _cosine(lr: float, server_round: int, num_rounds: int, floor: float) -> float:
    progress = (min(max(server_round, 1), num_rounds) - 1) / num_rounds
    low = floor * lr
    return low + (lr - low) * (1.0 + math.cos(math.pi * progress)) / 2.0


def round_lr(lr: float, schedule: str, server_round: int, num_rounds: int,
             floor: float = 0.0) -> float:
    """The sites' learning rate in round ``server_round`` (1-based) of ``num_rounds``.

    Parameters
    ----------
    lr : float
        Run-config ``lr``: the rate of round 1.
    schedule : str
        Run-config ``lr-schedule``, a name in :data:`LR_SCHEDULES`.
    server_round, num_rounds : int
        The instruction's round and run-config ``num-server-rounds``.
    floor : float
        Run-config ``lr-floor``: the cosine's ``eta_min`` as a fraction of ``lr``, in [0, 1].

    Raises
    ------
    ConfigError
        For a schedule not in :data:`LR_SCHEDULES`, naming the key (the run config
        refuses it first).
    """
    return LR_SCHEDULES.get(schedule)(lr, server_round, num_rounds, floor)
