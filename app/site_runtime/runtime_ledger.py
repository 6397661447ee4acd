"""The runtime charges the privacy ledger before the worker runs, for what the message asks.

The site's privacy ledger (:class:`clients.site.privacy_ledger.PrivacyLedger`, one per
dataset, all federations together) lives in ``<state-dir>/privacy/``, which the
sandboxed worker never sees (:mod:`app.site_runtime.worker_view`). For every DP-SGD
computation a message asks for (:class:`PlannedSpend`: a train round, the cross-site
fine-tune, an evaluate message's personalisation adaptation) the runtime

1. before the worker sees the message, reserves ``steps`` steps of the Gaussian
   mechanism with the asked noise multiplier ``sigma`` and the Poisson rate
   ``q = 1 / (n // B)`` from the runtime's own count ``n`` of the training examples
   (:mod:`app.site_runtime.dataset_census`) and the batch size ``B``, counted with the
   run's accountant; it refuses (rule ``dp.max-epsilon``) what would overspend the
   budget (:func:`reserve`);
2. after the reply passed the egress filter, settles the reservation with the steps
   *asked* (the app's own count is never believed: a bundle that trains fewer steps, or
   skips the noise, still pays what it asked for) and the larger of the two rates (the
   app's ``num-examples``, when smaller than the runtime's count, raises ``q``: the
   ledger errs on the patients' side), and writes the reply's ``epsilon``,
   ``epsilon-round`` and ``epsilon-left`` (:meth:`Reservation.settle`);
3. releases it when nothing of the computation left the site (an error reply, a
   refused reply, a crashed worker: :meth:`Reservation.cancel`).

What approval of the code must still guarantee: that the noise is really added and the
gradients really clipped (a bundle that skips them is charged the epsilon it asked for,
but its update is not private). ``docs/DEPLOYMENT-REFERENCE.md`` says so rule by rule.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from clients.site.policy import SitePolicy
from clients.site.privacy_ledger import PrivacyLedger
from clients.training.private_training import DpSettings, poisson_sample_rate
from strategies.wire import message_keys as keys

__all__ = ["PlannedSpend", "Reservation", "reserve"]

log = logging.getLogger("fedmed.site_runner")


@dataclass(frozen=True)
class PlannedSpend:
    """One DP-SGD computation a message asks for, in the ledger's terms."""

    #: ``train``, ``cross-site`` or ``evaluate-adapt`` (the ledger entry's kind).
    kind: str
    steps: int
    privacy: DpSettings
    batch_size: int


@dataclass
class Reservation:
    """A reserved spend, waiting for the reply (settle) or its failure (cancel)."""

    ledger: PrivacyLedger
    spend: PlannedSpend
    federation: str
    examples: int
    #: The dataset's budget (policy plus the admin's allowance) and epsilon before.
    budget: float
    spent: float
    reservation: str
    #: The epsilon the settled spend added (None until settled).
    charged: float | None = None

    def settle(self, reported_examples: int | None) -> dict[str, float]:
        """Record the asked steps; the reply's epsilon metrics (``epsilon-left`` only
        under a finite budget)."""
        examples = self.examples
        if reported_examples is not None and 0 < reported_examples < examples:
            examples = reported_examples
        spend = self.spend
        step = (spend.privacy.noise_multiplier, poisson_sample_rate(examples, spend.batch_size),
                spend.steps)
        self.ledger.settle(self.reservation, [step], self.federation, spend.kind)
        epsilon = self.ledger.epsilon(spend.privacy.delta)
        self.charged = max(epsilon - self.spent, 0.0)
        metrics = {keys.EPSILON: epsilon, keys.EPSILON_ROUND: self.charged}
        if math.isfinite(self.budget):
            metrics[keys.EPSILON_LEFT] = max(self.budget - epsilon, 0.0)
        return metrics

    def cancel(self) -> None:
        """Release the reservation: nothing of the computation left the site."""
        self.ledger.settle(self.reservation, (), self.federation, self.spend.kind)
        self.charged = 0.0


def reserve(state_dir: Path, data_path: Path, policy: SitePolicy, spend: PlannedSpend,
            examples: int, federation: str) -> Reservation:
    """Check ``spend`` on ``examples`` training examples against the budget and reserve it.

    Raises
    ------
    PolicyRefusal
        Rule ``dp.max-epsilon``, when it would overspend the dataset's budget.
    LedgerError
        A ledger file is malformed.
    ValueError
        ``examples`` or the batch size is below 1 (nothing to train on).
    """
    privacy = spend.privacy
    ledger = PrivacyLedger.of_site(state_dir, data_path, privacy.accountant)
    planned = (privacy.noise_multiplier, poisson_sample_rate(examples, spend.batch_size),
               spend.steps)
    spent = ledger.epsilon(privacy.delta)
    token = ledger.reserve(planned, privacy.delta, policy.dp.max_epsilon, federation,
                           spend.kind)
    return Reservation(ledger, spend, federation, examples,
                       ledger.budget(policy.dp.max_epsilon), spent, token)
