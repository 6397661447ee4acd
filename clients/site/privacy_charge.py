"""One computation's charge to the site's privacy ledger: checked before, recorded after.

Every DP-SGD computation on a site's training data (a train round, the cross-site
exchange's fine-tune, an evaluate message's personalisation adaptation) opens a
:class:`PrivacyCharge` before it trains: the ledger of the site's dataset
(:class:`~clients.site.privacy_ledger.PrivacyLedger`, all federations together)
refuses the computation (rule ``dp.max-epsilon``) when its planned steps would
overspend the budget, else reserves them (they count as spent while it trains, so
that computations starting together cannot overspend it together). After training,
:meth:`PrivacyCharge.record` replaces the reservation with the steps the accountant
counted and returns the reply's ``epsilon`` (the dataset's
total), ``epsilon-round`` (this computation's increase) and ``epsilon-left`` (what is
left of a finite budget).

In a deployment the hospital's site runtime (:mod:`app.site_runtime.runtime_ledger`)
charges the ledger itself before the app sees the message, and the app's process sees
no ledger (:attr:`~clients.site.site.Site.runtime_ledger`): :meth:`PrivacyCharge.before`
then returns a :class:`ChargedByRuntime`, which records nothing and adds no metrics
(the runtime adds the reply's epsilon from its own ledger).

In the site's train round DP-SGD is the :class:`PrivateTraining` feature
(:class:`~clients.site.site_feature.SiteFeature`) of a run with ``privacy.*`` enabled: an
Opacus-compatible network, DP-SGD steps, the charge opened before them (the cross-site
exchange's fine-tune after the last round is charged like any round), released when they
fail, recorded after.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clients.site.privacy_ledger import PrivacyLedger, Step
from clients.site.site import Site
from clients.site.site_feature import LocalTraining, SiteFeature
from clients.site.site_reply import Metrics
from clients.training.private_training import DpSettings, poisson_sample_rate
from strategies.wire import message_keys as keys

if TYPE_CHECKING:
    from clients.site.instruction import Instruction, SiteRunSettings

__all__ = ["ChargedByRuntime", "PrivacyCharge", "PrivateTraining"]


class ChargedByRuntime:
    """A computation the site runtime already charged (its ledger is not this process's)."""

    def record(self, steps: Sequence[Step]) -> Metrics:  # noqa: ARG002 - the runtime counts
        """No metrics: the runtime adds ``epsilon``, ``epsilon-round`` and ``epsilon-left``."""
        return {}

    def cancel(self) -> None:
        """Nothing to release here (the runtime settles its own reservation)."""


@dataclass(frozen=True)
class PrivacyCharge:
    """A checked DP computation, waiting for its steps to be recorded."""

    ledger: PrivacyLedger
    delta: float
    #: The dataset's budget: the policy's ``dp.max-epsilon`` plus the admin's allowance.
    budget: float
    #: The dataset's epsilon before the computation.
    spent: float
    #: The ledger's reservation of the planned steps.
    reservation: str
    federation: str
    #: ``train``, ``cross-site`` or ``evaluate-adapt`` (the ledger entry's kind).
    kind: str

    @classmethod
    def before(cls, site: Site, privacy: DpSettings, examples: int, batch_size: int,
               steps: int, federation: str, kind: str) -> PrivacyCharge | ChargedByRuntime:
        """Check ``steps`` DP-SGD steps on ``examples`` training examples against the budget.

        At a site whose runtime owns the ledger (:attr:`Site.runtime_ledger`): a
        :class:`ChargedByRuntime`, nothing read or written.

        Raises
        ------
        PolicyRefusal
            Rule ``dp.max-epsilon``, when they would overspend the site's budget.
        LedgerError
            When the ledger's files are malformed.
        """
        if site.runtime_ledger:
            return ChargedByRuntime()
        ledger = PrivacyLedger.of_site(site.state_dir, site.data_path, privacy.accountant)
        planned: Step = (privacy.noise_multiplier, poisson_sample_rate(examples, batch_size),
                         steps)
        spent = ledger.epsilon(privacy.delta)
        reservation = ledger.reserve(planned, privacy.delta, site.policy.dp.max_epsilon,
                                     federation, kind)
        return cls(ledger, privacy.delta, ledger.budget(site.policy.dp.max_epsilon), spent,
                   reservation, federation, kind)

    def record(self, steps: Sequence[Step]) -> Metrics:
        """Record the steps the computation ran; the reply's epsilon metrics.

        ``epsilon-left`` only under a finite budget.
        """
        self.ledger.settle(self.reservation, steps, self.federation, self.kind)
        epsilon = self.ledger.epsilon(self.delta)
        metrics: Metrics = {keys.EPSILON: epsilon, keys.EPSILON_ROUND: epsilon - self.spent}
        if math.isfinite(self.budget):  # no budget: left out (a reply's metrics are finite)
            metrics[keys.EPSILON_LEFT] = max(self.budget - epsilon, 0.0)
        return metrics

    def cancel(self) -> None:
        """Release the reservation of a computation that failed (nothing of it left the site)."""
        self.ledger.settle(self.reservation, (), self.federation, self.kind)


class PrivateTraining(SiteFeature):
    """DP-SGD for one train message, charged to the site's ledger.

    Parameters
    ----------
    privacy : DpSettings
        The run's ``privacy.*`` (enabled).
    federation : str
        The federation the ledger entry names.
    """

    def __init__(self, privacy: DpSettings, federation: str) -> None:
        self.privacy, self.federation = privacy, federation
        self.charged: Metrics = {}

    @classmethod
    def of(cls, instruction: Instruction, site: Site,
           run: SiteRunSettings) -> PrivateTraining | None:
        """The feature of a train message in a run with DP-SGD."""
        if instruction.kind != "train" or not run.privacy.enabled:
            return None
        return cls(run.privacy, instruction.federation)

    def model_args(self) -> dict[str, Any]:
        """A DP-SGD-compatible network."""
        return {"private": True}

    @contextmanager
    def training(self, local: LocalTraining) -> Iterator[None]:
        """DP-SGD steps, checked against the budget before (:meth:`PrivacyCharge.before`),
        released when they fail, recorded after.

        Raises
        ------
        PolicyRefusal
            ``dp.max-epsilon``: the round would overspend the DP budget of the site's data.
        """
        local.train_args["privacy"] = self.privacy
        charge = PrivacyCharge.before(local.site, self.privacy,
                                      len(local.task.require_training()),
                                      local.task.settings.batch_size, local.steps,
                                      self.federation, "cross-site" if local.final else "train")
        try:
            yield
        except BaseException:  # nothing of it leaves the site: release the reservation
            charge.cancel()
            raise
        assert local.result is not None  # the steps ran
        self.charged = charge.record(local.result.privacy_steps)

    def metrics(self) -> Metrics:
        """``epsilon``, ``epsilon-round`` and ``epsilon-left`` (none when the runtime charged)."""
        return self.charged
