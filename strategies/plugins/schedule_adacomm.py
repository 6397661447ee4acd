"""AdaComm: fewer local steps as the training loss falls.

Wang & Joshi, "Adaptive Communication Strategies to Achieve the Best
Error-Runtime Trade-off in Local-Update SGD", SysML 2019, eq. (17):
``tau_l = ceil(sqrt(F_l / F_0) * tau_0)``, clamped to ``[tau_min, tau_max]``
(:func:`strategies.local_steps.adacomm_tau`).

``F_l`` is the training loss of the *current global model*: the example-weighted
mean of the sites' ``initial-loss`` (the loss of the received model on their
first batch, before any local step), smoothed by an exponential moving average
(:class:`strategies.local_steps.LossSmoother`) so one noisy round does not make
tau jump. ``F_0`` is the smoothed value of the first round.

Intervals are *rounds*, not wall-clock seconds: the paper re-evaluates tau every
``T_0`` seconds of wall-clock time; in a federation a round is the natural unit
(one communication per round), so tau is re-evaluated after every round, which
corresponds to ``T_0`` = one round's duration.
"""

from __future__ import annotations

import numpy as np

from strategies import message_keys as keys
from strategies.local_steps import LossSmoother, adacomm_tau
from strategies.registry import SCHEDULES
from strategies.replies import TrainReply


@SCHEDULES.register("adacomm")
class AdaCommSchedule:
    """Adaptive tau from the global model's smoothed training loss."""

    def __init__(self, tau0: int, tau_min: int = 1, tau_max: int | None = None,
                 smoothing: float = 0.5) -> None:
        if tau0 < 1:
            raise ValueError(f"tau0 must be >= 1, got {tau0}")
        self.tau0, self.tau_min, self.tau_max = tau0, tau_min, tau_max or None
        self.tau = tau0
        self._smoother = LossSmoother(beta=smoothing)
        self._initial: float | None = None

    def observe(self, replies: list[TrainReply]) -> dict[str, float]:
        """Update tau from this round's replies; returns what to track."""
        if not replies:
            return {"schedule-tau": float(self.tau)}
        n = np.array([r.num_examples for r in replies], dtype=np.float64)
        loss = float(np.dot(n / n.sum(), [r.metrics[keys.INITIAL_LOSS] for r in replies]))
        smoothed = self._smoother.update(loss)
        if self._initial is None:
            self._initial = smoothed
        self.tau = adacomm_tau(smoothed, self._initial, self.tau0, self.tau_min, self.tau_max)
        return {"schedule-tau": float(self.tau), "global-loss": loss,
                "global-loss-smoothed": smoothed}
