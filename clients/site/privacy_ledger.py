"""The epsilon a federation has spent at this site, kept on the site's disk.

DP-SGD's privacy loss composes over every step a federation ever ran at the
site, across rounds and SuperNode restarts. The ledger keeps the mechanism's
history, not a running epsilon: one row ``(sigma, q, steps)`` per run of
steps with noise multiplier ``sigma`` and Poisson sampling rate ``q`` (the
history of Opacus's accountants), saved under ``state-dir``/<federation>/ by
:class:`~clients.site.state_store.SiteStateStore` (``.npy``, no pickle). The
cumulative epsilon is recomputed from the whole history by the accountant
(RDP: Mironov, "Renyi differential privacy", CSF 2017, composition of the
sampled Gaussian mechanism, Mironov, Talwar & Zhang 2019; PRV: Gopi, Lee &
Wutschitz, NeurIPS 2021), so it is exact, not a sum of per-round epsilons
(which would overstate it).

Before a round trains, :meth:`PrivacyLedger.check` computes the epsilon the
history plus the planned steps would reach and refuses the round
(:class:`~clients.site.policy.PolicyRefusal`, rule ``dp.max-epsilon``) when it
would exceed the site's budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from clients.site.policy import PolicyRefusal
from clients.site.state_store import SiteStateStore
from clients.root_logging import root_logging_kept
from clients.training.dp_accountants import ACCOUNTANTS

__all__ = ["PrivacyLedger", "LEDGER_NAME", "Step"]

#: File name (without ``.npy``) of the history under the federation's state folder.
LEDGER_NAME = "dp-history"

#: ``(noise multiplier, sample rate, steps)``, one row of an accountant's history.
Step = tuple[float, float, int]


class PrivacyLedger:
    """Privacy history of one federation at one site.

    Parameters
    ----------
    store : SiteStateStore
        The site's state folder.
    federation : str
        The federation (its id in the train instruction).
    accountant : str
        Opacus accountant that turns the history into epsilon, one of
        :data:`~clients.training.dp_accountants.ACCOUNTANTS`: the run's
        ``privacy.accountant``, the one its training used (no default, so that
        the budget is never counted with another accountant than the reported
        epsilon). The history is the same for every accountant.
    """

    def __init__(self, store: SiteStateStore, federation: str, accountant: str) -> None:
        self.store = store
        self.federation = federation
        self.accountant = accountant
        saved = store.load(federation, LEDGER_NAME)
        rows = [] if saved is None else saved.reshape(-1, 3).tolist()
        self.history: list[Step] = [(float(s), float(q), int(n)) for s, q, n in rows]

    def epsilon(self, delta: float, planned: Sequence[Step] = ()) -> float:
        """Cumulative epsilon at ``delta`` of the history, plus ``planned`` steps if given.

        0 for an empty history (nothing spent).
        """
        history = [*self.history, *planned]
        if not any(n for _, _, n in history):
            return 0.0
        with root_logging_kept():  # importing Opacus calls logging.basicConfig
            accountant = ACCOUNTANTS.get(self.accountant)()
        accountant.history = [(s, q, n) for s, q, n in history if n > 0]
        return float(accountant.get_epsilon(delta=delta))

    def check(self, planned: Step, delta: float, max_epsilon: float) -> float:
        """The epsilon after ``planned``; refuse if it would exceed ``max_epsilon``.

        Raises
        ------
        PolicyRefusal
            Rule ``dp.max-epsilon``, when the history plus ``planned`` would spend
            more than ``max_epsilon``.
        """
        after = self.epsilon(delta, [planned])
        if math.isfinite(max_epsilon) and after > max_epsilon:
            raise PolicyRefusal("dp.max-epsilon",
                                f"this round would bring the federation's epsilon to "
                                f"{after:.3g} (delta {delta:g}), over the site's budget "
                                f"{max_epsilon:g}; spent so far {self.epsilon(delta):.3g}")
        return after

    def record(self, steps: Sequence[Step]) -> None:
        """Append the steps a round ran (its accountant's history) and save atomically."""
        self.history.extend((float(s), float(q), int(n)) for s, q, n in steps if n > 0)
        self.store.save(self.federation, LEDGER_NAME,
                        np.asarray(self.history, dtype=np.float64).reshape(-1, 3))
