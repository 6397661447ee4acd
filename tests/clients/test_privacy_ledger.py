"""The per-federation epsilon ledger of a site (clients/site/privacy_ledger.py)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from opacus.accountants import PRVAccountant, RDPAccountant

from clients.site.policy import PolicyRefusal
from clients.site.privacy_ledger import LEDGER_NAME, PrivacyLedger
from clients.site.state_store import SiteStateStore
from clients.training.dp_accountants import ACCOUNTANTS

ROUND = (1.1, 0.05, 20)  # sigma, q, steps of one round
DELTA = 1e-5


def _epsilon(history) -> float:
    accountant = RDPAccountant()
    accountant.history = list(history)
    return accountant.get_epsilon(DELTA)


def test_epsilon_grows_with_rounds_and_survives_a_restart(tmp_path):
    store = SiteStateStore(tmp_path)
    ledger = PrivacyLedger(store, "fed-1", "rdp")
    assert ledger.epsilon(DELTA) == 0.0
    spent = []
    for _ in range(3):
        ledger.record([ROUND])
        spent.append(ledger.epsilon(DELTA))
    assert spent[0] < spent[1] < spent[2]
    again = PrivacyLedger(SiteStateStore(tmp_path), "fed-1", "rdp")  # a restarted SuperNode
    assert again.epsilon(DELTA) == spent[2]
    assert np.load(tmp_path / "fed-1" / f"{LEDGER_NAME}.npy", allow_pickle=False).shape == (3, 3)
    assert PrivacyLedger(store, "fed-2", "rdp").epsilon(DELTA) == 0.0  # per federation


def test_cumulative_epsilon_is_the_accountants_composition_not_a_sum(tmp_path):
    ledger = PrivacyLedger(SiteStateStore(tmp_path), "fed", "rdp")
    ledger.record([ROUND])
    ledger.record([(2.0, 0.1, 5)])
    exact = _epsilon([ROUND, (2.0, 0.1, 5)])
    assert ledger.epsilon(DELTA) == pytest.approx(exact)
    assert exact < _epsilon([ROUND]) + _epsilon([(2.0, 0.1, 5)])


def test_next_round_over_budget_is_refused_before_training(tmp_path):
    ledger = PrivacyLedger(SiteStateStore(tmp_path), "fed", "rdp")
    one, two = _epsilon([ROUND]), _epsilon([ROUND, ROUND])
    assert ledger.check(ROUND, DELTA, max_epsilon=one * 1.01) == pytest.approx(one)
    ledger.record([ROUND])
    with pytest.raises(PolicyRefusal, match="over the site's budget") as refused:
        ledger.check(ROUND, DELTA, max_epsilon=(one + two) / 2)
    assert refused.value.rule == "dp.max-epsilon"
    assert ledger.check(ROUND, DELTA, max_epsilon=math.inf) == pytest.approx(two)
    assert len(ledger.history) == 1  # a check records nothing


def test_prv_ledger_counts_with_opacus_prv_accountant_not_rdp(tmp_path):
    """The ledger uses the run's accountant (privacy.accountant), the one training used."""
    history = [ROUND, (2.0, 0.1, 5)]
    for accountant in ("rdp", "prv"):
        PrivacyLedger(SiteStateStore(tmp_path), accountant, accountant).record(history)
    prv = PrivacyLedger(SiteStateStore(tmp_path), "prv", "prv").epsilon(DELTA)
    reference = PRVAccountant()
    reference.history = list(history)
    assert prv == pytest.approx(reference.get_epsilon(DELTA))
    rdp = PrivacyLedger(SiteStateStore(tmp_path), "rdp", "rdp").epsilon(DELTA)
    assert rdp == pytest.approx(_epsilon(history)) and prv < 0.95 * rdp  # PRV is tighter


def test_accountants_are_listed_without_opacus_and_resolve_to_its_classes():
    script = ("import sys\n"
              "from clients.site.policy import load_policy\n"
              "from clients.training.dp_accountants import ACCOUNTANTS\n"
              "assert ACCOUNTANTS.names() == ['prv', 'rdp'] and 'gdp' not in ACCOUNTANTS\n"
              "assert 'opacus' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", script], check=True)
    assert ACCOUNTANTS.get("rdp") is RDPAccountant and ACCOUNTANTS.get("prv") is PRVAccountant
