"""The hospital's console in a real browser (headless Chromium): the issue's four checks.

A refusal by the site runner appears on Activity with its rule (and in the CSV export);
epsilon on Privacy is the ledger's; a revoke from the Apps page makes the runner refuse
that bundle's next message; an edited audit line is reported by ``make audit-verify``
and on the Overview. The last test visits every page (and, with
``FEDMED_CONSOLE_SCREENSHOTS=<folder>``, as ``make console-screenshots`` sets it,
saves each one's screenshot for the README).

One console and one Chromium serve the whole module (``tests/app/console_fixtures.py``);
``make test`` schedules by file (``--dist loadfile``), so they stay on one xdist worker.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess

import pytest

from app.site_runtime.app_approval import AppNotApproved, approve, check_app
from app.site_runtime.audit_log import CURRENT_NAME, AuditLog, audit_dir
from clients.site.policy import load_policy
from clients.site.privacy_ledger import PrivacyLedger, dataset_id
from strategies.wire import message_keys as keys
from tests.app.console_fixtures import (DELTA, ROOT, bundle, screenshot,  # noqa: F401
                                        browser, console, console_site, page)
from tests.app.site_messages import instruction


def _filtered_activity(page, **chosen: str) -> None:
    """Open Activity and filter it through its form (selects for decision/kind, else text)."""
    page.goto("/activity")
    for name, value in chosen.items():
        field = page.locator(f"#filter-{name}")
        if name in ("decision", "kind"):
            field.select_option(value)
        else:
            field.fill(value)
    page.click("#filter-button")
    page.wait_for_load_state()


def _column(page, name: str) -> list[str]:
    return [text.strip() for text in page.locator(f"#activity-table .col-{name}").all_inner_texts()]


def test_a_refused_request_appears_on_activity_with_its_rule(console, page):
    written = console.ask(instruction("train", **{keys.FEDERATION: "fed-unapproved",
                                                  keys.LOCAL_STEPS: 50}),
                          bundle("an app this hospital never approved"))
    assert (written["decision"], written["rule"]) == ("refused", "apps")
    _filtered_activity(page, decision="refused")
    assert "decision=refused" in page.url
    row = page.locator(f"#row-{written['seq']}")
    assert row.locator(".col-rule").inner_text().strip() == "apps"
    assert row.locator(".col-federation").inner_text().strip() == "fed-unapproved"
    assert row.locator(".col-app").inner_text().strip() == written["app"][:12]
    refused = [r["seq"] for r in AuditLog(console.state).records()
               if r.get("decision") == "refused"]
    assert sorted(int(seq) for seq in _column(page, "seq")) == refused
    assert set(_column(page, "decision")) == {"refused"}
    assert "min-batch-size" in _column(page, "rule")  # the seeded query's refusal
    with page.expect_download() as download:
        page.click("#csv-link")
    assert download.value.suggested_filename.endswith(".csv")
    rows = list(csv.DictReader(io.StringIO(open(download.value.path(),
                                                encoding="utf-8").read())))
    assert {row["decision"] for row in rows} == {"refused"}
    ours = [row for row in rows if row["seq"] == str(written["seq"])]
    assert len(ours) == 1 and ours[0]["rule"] == "apps" and ours[0]["app"] == written["app"]


def test_epsilon_on_privacy_matches_the_ledger(console, page):
    page.goto("/privacy")
    spent = {}
    for name, data in console.datasets.items():
        ledger = PrivacyLedger.of_site(console.state, data, "rdp")
        spent[name] = ledger.epsilon(DELTA)
        cell = page.inner_text(f"#eps-{dataset_id(data)}").strip()
        assert cell == f"{spent[name]:.4g}" and float(cell) == pytest.approx(spent[name], 1e-3)
        assert page.locator(f"#chart-{dataset_id(data)} svg polyline").count() == 1
    assert spent["chest-xray"] > spent["ct-volumes"] > 0  # six runs against two
    data = console.datasets["ct-volumes"]
    PrivacyLedger.of_site(console.state, data, "rdp").record([(1.1, 0.02, 60)], "fed-9", "train")
    page.reload()
    after = PrivacyLedger.of_site(console.state, data, "rdp").epsilon(DELTA)
    assert after > spent["ct-volumes"]
    assert page.inner_text(f"#eps-{dataset_id(data)}").strip() == f"{after:.4g}"


def test_a_revoke_from_the_apps_page_refuses_the_next_run_of_that_app(console, page):
    fab = bundle("release 2 of the federation's app")
    assert approve(console.policy, fab.hash_str)  # as `make approve-app` does
    assert check_app(load_policy(console.policy).apps, fab.hash_str, fab.content, "") == "sha256"
    page.goto("/apps")
    page.click(f"#revoke-button-{fab.hash_str}")
    assert page.inner_text("#confirm-app").strip() == fab.hash_str
    assert "revoked-sha256" in page.inner_text("#confirm-changes")
    page.fill("#reason", "release 2 withdrawn by the coordinator")
    page.click("#confirm-button")
    page.wait_for_url(re.compile(r"/apps(\?.*)?$"))
    assert page.locator(f"#revoked-{fab.hash_str}").count() == 1
    assert page.inner_text("#flash")
    with pytest.raises(AppNotApproved, match="revoked"):
        check_app(load_policy(console.policy).apps, fab.hash_str, fab.content, "")
    written = console.ask(instruction("train", **{keys.FEDERATION: "fed-release-2"}), fab)
    assert (written["decision"], written["rule"], written["app"]) == ("refused", "apps",
                                                                       fab.hash_str)
    revoked = [r for r in AuditLog(console.state).records() if r["kind"] == "app-revoked"]
    (who,) = {r["by"] for r in revoked}
    assert who.startswith("console admin (token ") and who.endswith(" from 127.0.0.1")
    assert [(r["app"], r["reason"]) for r in revoked] == [
        (fab.hash_str, "release 2 withdrawn by the coordinator")]
    changes = [r for r in AuditLog(console.state).records() if r["kind"] == "policy-change"]
    assert (changes[-1]["fingerprint"], changes[-1]["by"]) == (
        load_policy(console.policy).fingerprint, who)  # the edit's new rules, audited
    assert who in page.inner_text(f"#change-{revoked[0]['seq']}")
    page.click(f"#undo-revoke-button-{fab.hash_str}")  # the undo, not a new approval
    assert "revoked-sha256: remove" in page.inner_text("#confirm-changes")
    page.click("#confirm-button")
    page.wait_for_url(re.compile(r"/apps(\?.*)?$"))
    assert page.locator(f"#revoked-{fab.hash_str}").count() == 0
    assert check_app(load_policy(console.policy).apps, fab.hash_str, fab.content, "") == "sha256"
    _filtered_activity(page, kind="app-revoked")
    assert page.locator(f"#row-{revoked[0]['seq']}").count() == 1
    assert _column(page, "kind") == ["app-revoked"]


def test_an_edited_audit_line_is_reported_by_make_and_on_the_overview(console, page):
    segment = audit_dir(console.state) / CURRENT_NAME
    original = segment.read_bytes()
    lines = original.decode("utf-8").splitlines(keepends=True)
    line, record = next((n, json.loads(text)) for n, text in enumerate(lines)
                        if json.loads(text).get("bytes_sent"))
    assert 0 < line < len(lines) - 1  # a middle record, an answer that sent bytes
    record["bytes_sent"] = 0  # someone hides what left the site
    lines[line] = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
    segment.write_text("".join(lines), encoding="utf-8")
    try:
        # -o install: the venv as it is (make test installed it; no reinstall inside a test)
        done = subprocess.run(["make", "-s", "--no-print-directory", "-o", "install",
                               "audit-verify", f"STATE={console.state}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, check=False)
        said = done.stdout + done.stderr
        # the verifier exits 1 (a broken chain; 2 is a usage error), make then exits 2
        assert done.returncode == 2 and "Error 1" in done.stderr, said
        assert "edited" in said and re.search(rf"\bseq {record['seq']}\b", said), said
        page.goto("/")
        status = page.locator("#chain-status")
        assert "broken" in status.get_attribute("class")
        assert re.search(rf"\bseq {record['seq']}\b", status.inner_text())
    finally:
        segment.write_bytes(original)
    page.reload()
    assert "ok" in page.locator("#chain-status").get_attribute("class").split()


def test_every_page_renders_for_the_readme(console, page):
    console.reached()
    pages = {"overview": "/", "policy": "/policy", "apps": "/apps", "privacy": "/privacy",
             "activity": "/activity", "data": "/data"}
    for name, path in pages.items():
        response = page.goto(path)
        assert response.status == 200, name
        assert page.locator("nav #nav-overview").count() == 1 and not page.locator(
            "#chain-alert").count(), name
        screenshot(page, name)
        if name == "overview":
            assert page.inner_text("#node-connected").strip() == "connected"
            assert "ok" in page.locator("#chain-status").get_attribute("class").split()
        if name == "policy":
            fingerprint = load_policy(console.policy).fingerprint
            assert fingerprint in page.inner_text("#policy-fingerprint")
        if name == "data":
            report = dataset_id(console.datasets["chest-xray"])
            assert "study-0042" in page.inner_text(f"#skipped-{report}")
            assert "96" in page.inner_text(f"#splits-{report}")
    page.goto("/apps")
    page.fill("#approve-digest", bundle("release 3 of the federation's app").hash_str)
    page.click("#approve-button")
    assert page.locator("#confirm-form").count() == 1
    screenshot(page, "apps-confirm")
    page.click("#cancel-link")
    page.wait_for_url(re.compile(r"/apps$"))
