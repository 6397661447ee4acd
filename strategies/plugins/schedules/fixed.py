"""Fixed local work: every selected site runs ``tau0`` local steps each round."""

from __future__ import annotations

from strategies.plugins.registries import SCHEDULES
from strategies.plugins.run_settings import RunSettings
from strategies.rounds.reply_intake import TrainReply
from strategies.wire.plugin_options import NoOptions, Plugin


@SCHEDULES.register("fixed")
class FixedSchedule(Plugin):
    """Constant tau (the local-update SGD of McMahan et al. 2017); no options."""

    def __init__(self, tau0: int) -> None:
        if tau0 < 1:
            raise ValueError(f"tau0 must be >= 1, got {tau0}")
        self.tau = tau0

    @classmethod
    def from_options(cls, options: NoOptions, settings: RunSettings) -> FixedSchedule:
        """The schedule for a run: tau = ``local-steps``."""
        return cls(tau0=settings.local_steps)

    def observe(self, replies: list[TrainReply]) -> dict[str, float]:
        """Nothing adapts; returns the tau in force."""
        return {"schedule-tau": float(self.tau)}
