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

from dataclasses import dataclass

import numpy as np

from strategies.local_steps import LossSmoother, adacomm_tau
from strategies.plugins.registries import SCHEDULES
from strategies.plugins.run_settings import RunSettings
from strategies.rounds.reply_intake import TrainReply
from strategies.wire import message_keys as keys
from strategies.wire.plugin_options import Plugin, PluginOptions, option


@dataclass(frozen=True)
class AdaCommOptions(PluginOptions):
    """Run-config section ``adacomm`` (tau_0 itself is ``local-steps``).

    Attributes
    ----------
    tau_min : int
        ``adacomm.tau-min``: lower clamp of tau, >= 1.
    tau_max : int
        ``adacomm.tau-max``: upper clamp of tau; 0 = no cap, else >= tau-min.
    loss_smoothing : float
        ``adacomm.loss-smoothing``: EMA factor of the global loss in [0, 1).
    """

    section = "adacomm"
    tau_min: int = option(1, at_least=1)
    tau_max: int = option(0, at_least=0)
    loss_smoothing: float = option(0.5, at_least=0.0, below=1.0)

    def check(self) -> None:
        """tau-max is 0 (no cap) or at least tau-min."""
        if self.tau_max and self.tau_max < self.tau_min:
            self.fail("tau_max", f"must be 0 (no cap) or >= {self.key('tau_min')} "
                                 f"= {self.tau_min}")


@SCHEDULES.register("adacomm")
class AdaCommSchedule(Plugin):
    """Adaptive tau from the global model's smoothed training loss."""

    Options = AdaCommOptions

    def __init__(self, tau0: int, tau_min: int = 1, tau_max: int | None = None,
                 smoothing: float = 0.5) -> None:
        if tau0 < 1:
            raise ValueError(f"tau0 must be >= 1, got {tau0}")
        options = AdaCommOptions(tau_min=tau_min, tau_max=tau_max or 0,
                                 loss_smoothing=smoothing)
        self.tau0, self.tau_min, self.tau_max = tau0, options.tau_min, options.tau_max or None
        self.tau = tau0
        self._smoother = LossSmoother(beta=options.loss_smoothing)
        self._initial: float | None = None

    @classmethod
    def from_options(cls, options: AdaCommOptions, settings: RunSettings) -> AdaCommSchedule:
        """The schedule for a run: tau_0 = ``local-steps``."""
        return cls(tau0=settings.local_steps, tau_min=options.tau_min,
                   tau_max=options.tau_max or None, smoothing=options.loss_smoothing)

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
