"""The one epsilon ledger per site and dataset (clients/site/privacy_ledger.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from opacus.accountants import PRVAccountant, RDPAccountant

from clients.site.policy import PolicyRefusal
from clients.site.privacy_ledger import LedgerError, PrivacyLedger, dataset_id
from clients.training.dp_accountants import ACCOUNTANTS

ROUND = (1.1, 0.05, 20)  # sigma, q, steps of one round
DELTA = 1e-5


def _epsilon(history) -> float:
    accountant = RDPAccountant()
    accountant.history = list(history)
    return accountant.get_epsilon(DELTA)


def test_epsilon_grows_with_rounds_and_survives_a_restart(tmp_path):
    ledger = PrivacyLedger.of_site(tmp_path / "state", tmp_path / "site", "rdp")
    assert ledger.epsilon(DELTA) == 0.0
    spent = []
    for _ in range(3):
        ledger.record([ROUND], "fed-1", "train")
        spent.append(ledger.epsilon(DELTA))
    assert spent[0] < spent[1] < spent[2]
    again = PrivacyLedger.of_site(tmp_path / "state", tmp_path / "site", "rdp")  # a restart
    assert again.epsilon(DELTA) == spent[2]
    saved = json.loads((tmp_path / "state" / "privacy" / dataset_id(tmp_path / "site")
                        / "history.json").read_text())
    assert len(saved["entries"]) == 3 and saved["entries"][0]["steps"] == 20
    other = PrivacyLedger.of_site(tmp_path / "state", tmp_path / "site", "rdp")
    other.record([ROUND], "fed-2", "train")  # another federation, the same patients
    assert other.epsilon(DELTA) > spent[2]
    assert PrivacyLedger.of_site(tmp_path / "state", tmp_path / "other-site",
                                 "rdp").epsilon(DELTA) == 0.0  # per dataset


def test_cumulative_epsilon_is_the_accountants_composition_not_a_sum(tmp_path):
    ledger = PrivacyLedger(tmp_path, "rdp")
    ledger.record([ROUND], "fed", "train")
    ledger.record([(2.0, 0.1, 5)], "fed", "evaluate-adapt")
    exact = _epsilon([ROUND, (2.0, 0.1, 5)])
    assert ledger.epsilon(DELTA) == pytest.approx(exact)
    assert exact < _epsilon([ROUND]) + _epsilon([(2.0, 0.1, 5)])


def test_next_round_over_budget_is_refused_before_training(tmp_path):
    ledger = PrivacyLedger(tmp_path, "rdp")
    one, two = _epsilon([ROUND]), _epsilon([ROUND, ROUND])
    assert ledger.check(ROUND, DELTA, max_epsilon=one * 1.01) == pytest.approx(one)
    ledger.record([ROUND], "fed", "train")
    with pytest.raises(PolicyRefusal, match="over the site's budget") as refused:
        ledger.check(ROUND, DELTA, max_epsilon=(one + two) / 2)
    assert refused.value.rule == "dp.max-epsilon"
    assert ledger.check(ROUND, DELTA, max_epsilon=math.inf) == pytest.approx(two)
    assert len(ledger.entries) == 1  # a check records nothing


def test_a_reservation_counts_until_settled_so_two_computations_cannot_overspend_together(
        tmp_path):
    one, two = _epsilon([ROUND]), _epsilon([ROUND, ROUND])
    budget = (one + two) / 2  # room for one round, not two
    first = PrivacyLedger(tmp_path, "rdp")
    second = PrivacyLedger(tmp_path, "rdp")  # another process, read before the first trains
    reservation = first.reserve(ROUND, DELTA, budget, "fed-1", "train")
    with pytest.raises(PolicyRefusal, match="dp.max-epsilon"):
        second.reserve(ROUND, DELTA, budget, "fed-2", "train")
    first.settle(reservation, [(1.1, 0.05, 12)], "fed-1", "train")  # it ran fewer steps
    again = PrivacyLedger(tmp_path, "rdp")
    assert [(e.steps, e.reservation) for e in again.entries] == [(12, "")]
    failed = again.reserve((1.1, 0.05, 5), DELTA, budget, "fed-2", "train")
    again.settle(failed, (), "fed-2", "train")  # failed before anything left the site
    assert [e.steps for e in PrivacyLedger(tmp_path, "rdp").entries] == [12]


def test_an_admin_extends_the_budget_or_resets_the_ledger_and_both_are_logged(tmp_path):
    ledger = PrivacyLedger(tmp_path / "privacy" / "abc", "rdp")
    ledger.record([ROUND], "fed", "train")
    one, two = _epsilon([ROUND]), _epsilon([ROUND, ROUND])
    with pytest.raises(PolicyRefusal):
        ledger.check(ROUND, DELTA, max_epsilon=one)
    ledger.extend(two - one + 0.01, "ethics board approval 2026-11")
    assert ledger.budget(one) == pytest.approx(two + 0.01)
    assert ledger.check(ROUND, DELTA, max_epsilon=one) == pytest.approx(two)
    ledger.reset("new data extraction")
    assert ledger.epsilon(DELTA) == 0.0 and not ledger.history_path.exists()
    archived = list((ledger.folder / "archive").glob("history-*.json"))
    assert len(archived) == 1 and len(json.loads(archived[0].read_text())["entries"]) == 1
    log = (tmp_path / "privacy" / "budget-admin.log").read_text().splitlines()
    assert len(log) == 2 and "ethics board" in log[0] and "new data extraction" in log[1]
    with pytest.raises(LedgerError, match="needs a reason"):
        ledger.reset(" ")
    with pytest.raises(LedgerError, match="positive epsilon"):
        ledger.extend(-1.0, "no")


def test_a_malformed_history_is_refused_naming_its_file(tmp_path):
    (tmp_path / "history.json").write_text("{\"entries\": [{\"steps\": 1}]}")
    with pytest.raises(LedgerError, match="history.json"):
        PrivacyLedger(tmp_path, "rdp")


def test_prv_ledger_counts_with_opacus_prv_accountant_not_rdp(tmp_path):
    """The ledger uses the run's accountant (privacy.accountant), the one training used."""
    history = [ROUND, (2.0, 0.1, 5)]
    PrivacyLedger(tmp_path, "rdp").record(history, "fed", "train")
    prv = PrivacyLedger(tmp_path, "prv").epsilon(DELTA)
    reference = PRVAccountant()
    reference.history = list(history)
    assert prv == pytest.approx(reference.get_epsilon(DELTA))
    rdp = PrivacyLedger(tmp_path, "rdp").epsilon(DELTA)
    assert rdp == pytest.approx(_epsilon(history)) and prv < 0.95 * rdp  # PRV is tighter


def test_accountants_are_listed_without_opacus_and_resolve_to_its_classes():
    script = ("import sys\n"
              "from clients.site.policy import load_policy\n"
              "from clients.training.dp_accountants import ACCOUNTANTS\n"
              "assert ACCOUNTANTS.names() == ['prv', 'rdp'] and 'gdp' not in ACCOUNTANTS\n"
              "assert 'opacus' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", script], check=True)
    assert ACCOUNTANTS.get("rdp") is RDPAccountant and ACCOUNTANTS.get("prv") is PRVAccountant
