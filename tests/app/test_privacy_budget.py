"""The hospital admin's privacy-budget command (app/site_runtime/privacy_budget.py): only it
resets or extends a dataset's ledger, archiving and logging what it did."""

from __future__ import annotations

import json

import pytest

from app.site_runtime.audit_log import AuditLog
from app.site_runtime.privacy_budget import main
from clients.site.privacy_ledger import PrivacyLedger, dataset_id

ROUND = (1.1, 0.05, 20)


@pytest.fixture()
def spent(tmp_path):
    """A site whose dataset two federations trained on; its policy's budget is 3."""
    (tmp_path / "site").mkdir()
    ledger = PrivacyLedger.of_site(tmp_path / "state", tmp_path / "site", "rdp")
    ledger.record([ROUND], "fed-1", "train")
    ledger.record([ROUND], "fed-2", "cross-site")
    (tmp_path / "policy.toml").write_text("[dp]\nmax-epsilon = 3.0\ndelta = 1e-5\n")
    return ledger


def _run(tmp_path, *extra: str) -> int:
    return main(["--state", str(tmp_path / "state"), "--data", str(tmp_path / "site"),
                 "--policy", str(tmp_path / "policy.toml"), *extra])


def test_show_gives_the_spent_epsilon_the_budget_and_what_is_left(tmp_path, spent, capsys):
    assert _run(tmp_path) == 0
    out = capsys.readouterr().out
    epsilon = spent.epsilon(1e-5)
    assert f"2 entries, epsilon spent {epsilon:.4g}" in out
    assert "fed-1: train, 20 DP-SGD steps" in out and "fed-2: cross-site" in out
    assert f"budget 3 (policy dp.max-epsilon 3 + allowance 0), left {3 - epsilon:.4g}" in out
    assert main(["--state", str(tmp_path / "state")]) == 0  # every dataset of the site
    assert dataset_id(tmp_path / "site") in capsys.readouterr().out


def test_extend_and_reset_are_kept_archived_and_logged(tmp_path, spent, capsys):
    assert _run(tmp_path, "--extend", "2.5", "--reason", "ethics board 2026-11") == 0
    assert "budget 5.5 (policy dp.max-epsilon 3 + allowance 2.5)" in capsys.readouterr().out
    assert _run(tmp_path, "--reset", "new extraction of the data") == 0
    assert "0 entries, epsilon spent 0" in capsys.readouterr().out
    archived = list((spent.folder / "archive").glob("history-*.json"))
    assert [len(json.loads(a.read_text())["entries"]) for a in archived] == [2]
    log = (tmp_path / "state" / "privacy" / "budget-admin.log").read_text().splitlines()
    assert len(log) == 2
    assert "extended by epsilon 2.5" in log[0] and "ethics board 2026-11" in log[0]
    assert "ledger reset (2 entries" in log[1] and "new extraction" in log[1]
    audited = [(r["kind"], r["dataset"], r["epsilon"], r["reason"], r["by"])
               for r in AuditLog(tmp_path / "state").records()]
    assert audited == [("budget-extended", spent.folder.name, 2.5, "ethics board 2026-11", "cli"),
                       ("budget-reset", spent.folder.name, None, "new extraction of the data",
                        "cli")]


def test_errors_name_the_path_and_exit_2(tmp_path, capsys):
    assert main(["--state", str(tmp_path / "nowhere")]) == 2
    assert f"state dir {tmp_path / 'nowhere'}: no such folder" in capsys.readouterr().err
    (tmp_path / "state").mkdir()
    assert main(["--state", str(tmp_path / "state"), "--reset", "why"]) == 2
    assert "need --data" in capsys.readouterr().err
