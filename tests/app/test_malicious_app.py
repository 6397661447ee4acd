"""The malicious-app suite (issue #44): an approved bundle tries to own the site and cannot.

The bundle is the product's own with a malicious module (:mod:`tests.app.malicious_suite`),
approved by its sha256; every attempt runs through the real site runner, in the
sandbox, on a small synthetic site. Before the runtime owned the policy, the ledger, the
audit log and the sandbox, each of these succeeded: the worker was a plain subprocess
with the runner's uid, environment, network and files, and the bundle's own (edited)
policy check let the fine-tuned model out.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.app.malicious_suite import ATTEMPTS, run_suite


def _bubblewrap() -> None:
    if shutil.which("bwrap"):
        return
    why = "Debian's bubblewrap is not installed (apt-get install bubblewrap; .ci/run does it)"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {why}: the sandbox must be tested", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """Every attempt, once, against one site."""
    _bubblewrap()
    return {row.attempt: row for row in run_suite(tmp_path_factory.mktemp("malicious"))}


@pytest.mark.parametrize("attempt", ATTEMPTS, ids=[a.name for a in ATTEMPTS])
def test_every_attempt_is_blocked_or_refused_naming_the_rule(rows, attempt):
    row = rows[attempt.name]
    if attempt.expect == "answered":  # blocked inside the sandbox: the reply itself is fine
        assert row.decision == "answered", row
        assert row.found is not None and (row.found.startswith("failed") or row.found == ""), row
    else:
        assert (row.decision, row.rule) == ("refused", attempt.expect), row
    assert row.ledger_intact and row.chain_intact, row


def test_the_worker_saw_no_network_file_or_secret_of_the_host(rows):
    assert rows["socket"].found.startswith("failed")  # and the host's listener got nothing
    for name in ("read-dataset", "read-policy", "write-ledger", "write-audit", "write-code"):
        assert rows[name].found == "failed: errno 2", rows[name]  # not even there
    assert rows["read-env"].found == "failed: not set"
    assert rows["fork-bomb"].found.startswith("failed after")
    assert rows["memory"].found == "failed: MemoryError"


def test_a_bundle_that_skips_the_noise_still_pays_what_it_asked_for(rows):
    """Found: the runner logged 'epsilon 0.0' after the ledger was wiped; now the runtime
    charges the asked steps before the worker runs, whatever the bundle does."""
    row = rows["skip-noise"]
    assert row.decision == "answered" and row.charged > 0 and row.ledger_intact
    assert all(rows[name].charged == 0 for name in rows if name != "skip-noise")



def test_without_bubblewrap_the_runner_fails_closed(tmp_path, monkeypatch):
    """No sandbox, no worker: the message fails with the reason's type, nothing of the
    bundle runs (unless the policy says sandbox = "off")."""
    from app.site_runtime import sandbox  # noqa: PLC0415
    from tests.app.malicious_suite import ATTEMPTS as ALL, Suite  # noqa: PLC0415
    from app.site_runtime.sandbox import SandboxLimits  # noqa: PLC0415

    suite = Suite(tmp_path, SandboxLimits())
    try:
        monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
        row = suite.attempt(ALL[0])
        assert (row.decision, row.found) == ("failed", None)
        assert suite.runner.pool.started == 0
    finally:
        suite.close()
