"""The console's pages: what each one shows, from a real audit log, ledger, policy and reports."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.site_runtime.audit_log import AuditLog, audit_dir
from app.site_runtime.console import _named_dataset, create_console
from app.site_runtime.console_access import ConsoleSettings, admin_token_path
from app.site_runtime.console_pages import activity_csv, activity_rows, data_reports, node_status
from app.site_runtime.console_privacy import PrivacyView, policy_delta
from app.site_runtime.policy_edit import apply_edit
from clients.pacs.sync import REPORT_NAME, STORE_DIR, SyncReport
from clients.site.policy import load_policy
from clients.site.privacy_ledger import PrivacyLedger, dataset_id
from strategies.wire.errors import ConfigError
from tests.app.console_site import log_in, site_folder

BASE = "http://127.0.0.1:8470"
APP_A, APP_B = "a" * 64, "b" * 64


def message(decision: str, run: int = 7, rule: str | None = None, app: str = APP_A,
            type_: str = "train", federation: str = "fed-1", epsilon: float = 0.0) -> dict:
    """A ``message`` record as the site runtime writes it (SHARED DESIGN 3)."""
    return {"kind": "message", "site": "hospital-a", "run": run, "federation": federation,
            "app": app, "type": type_, "asked": {"local-steps": 5, "batch-size": 8},
            "decision": decision, "rule": rule, "error_code": 3 if rule else None,
            "bytes_sent": 0 if rule else 4096, "epsilon": epsilon, "seconds": 0.25}


@pytest.fixture
def site(tmp_path: Path) -> dict:
    """A state dir with an audit log of four messages and a copy of the default policy."""
    state, policy = site_folder(tmp_path)
    log = AuditLog(state)
    log.append({"kind": "node-start", "site": "hospital-a", "policy": "f" * 16})
    log.append(message("answered", epsilon=0.5))
    log.append(message("refused", rule="min-batch-size", type_="evaluate"))
    log.append(message("refused", run=8, rule="apps", app=APP_B))
    log.append(message("failed", run=8, federation="=HYPERLINK(\"x\")"))
    return {"state": state, "policy": policy, "log": log}


def client_of(site: dict, **options) -> TestClient:
    """A client of the site's console, logged in with its admin token."""
    settings = ConsoleSettings("hospital-a", site["state"], site["policy"], **options)
    client = TestClient(create_console(settings), base_url=BASE, client=("127.0.0.1", 40000))
    return log_in(client, settings.admin_token_file, BASE)


def cell(html: str, element_id: str) -> str:
    """The text of the element with ``id`` (tags stripped)."""
    match = re.search(rf'id="{re.escape(element_id)}"[^>]*>(.*?)</', html, re.S)
    assert match, f"no element {element_id}"
    return re.sub(r"<[^>]+>", "", match.group(1)).strip()


def test_overview_counts_today_and_verified_chain(site):
    html = client_of(site).get("/").text
    assert cell(html, "count-answered") == "1"
    assert cell(html, "count-refused") == "2"
    assert cell(html, "count-failed") == "1"
    assert "failed" in cell(html, "last-message") and "train" in cell(html, "last-message")
    assert cell(html, "chain-status") == "audit log verified, 5 records"
    assert cell(html, "current-run") == "8"
    assert cell(html, "node-connected").startswith("not connected")
    assert cell(html, "policy-in-force") == load_policy(site["policy"]).fingerprint


def test_overview_names_an_edited_record_in_red(site):
    client = client_of(site)
    assert "verified" in cell(client.get("/").text, "chain-status")
    path = audit_dir(site["state"]) / "audit.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace('"min-batch-size"', '"max-local-steps"')
    path.write_text("\n".join(lines) + "\n")
    html = client.get("/").text
    assert re.search(r'id="chain-status" class="banner broken"', html)
    status = cell(html, "chain-status")
    assert "edited" in status and "2" in status
    assert 'id="chain-alert"' in client.get("/activity").text


def test_node_connected_only_with_a_fresh_status_and_a_live_pid(site):
    folder = audit_dir(site["state"])
    now = datetime.now(timezone.utc)
    status = {"site": "hospital-a", "pid": os.getpid(), "time": now.isoformat(),
              "started": now.isoformat(), "runtime_api": "ok", "run": 8}
    (folder / "node-status.json").write_text(json.dumps(status))
    assert node_status(site["state"], now)["connected"]
    assert cell(client_of(site).get("/").text, "node-connected") == "connected"
    later = node_status(site["state"], now + timedelta(seconds=31))
    assert not later["connected"] and "31 s" in later["reason"]
    (folder / "node-status.json").write_text(json.dumps({**status, "pid": 2**22 + 12345}))
    assert "not running" in node_status(site["state"], now)["reason"]


def test_activity_filters_by_run_type_and_decision(site):
    client = client_of(site)
    html = client.get("/activity", params={"decision": "refused"}).text
    rows = re.findall(r'<tr id="row-(\d+)"', html)
    assert rows == ["3", "2"]  # newest first
    assert cell(html, "activity-count") == "2 records"
    assert '<td class="col-rule">apps</td>' in html
    html = client.get("/activity", params={"decision": "refused", "run": "7"}).text
    assert re.findall(r'<tr id="row-(\d+)"', html) == ["2"]
    html = client.get("/activity", params={"type": "evaluate"}).text
    assert re.findall(r'<tr id="row-(\d+)"', html) == ["2"]
    html = client.get("/activity", params={"kind": "node-start"}).text
    assert re.findall(r'<tr id="row-(\d+)"', html) == ["0"]


def test_activity_csv_exports_the_filtered_rows(site):
    response = client_of(site).get("/activity.csv", params={"decision": "refused"})
    assert response.headers["content-disposition"].startswith("attachment")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [(r["seq"], r["rule"], r["app"]) for r in rows] == [("3", "apps", APP_B),
                                                               ("2", "min-batch-size", APP_A)]


def test_csv_cells_never_start_a_spreadsheet_formula(site):
    rows = activity_rows(list(site["log"].records()), decision="failed")
    exported = list(csv.DictReader(io.StringIO(activity_csv(rows))))
    assert exported[0]["federation"] == "'=HYPERLINK(\"x\")"


def test_coordinator_strings_are_escaped_in_pages(site):
    site["log"].append(message("refused", rule="<script>alert(1)</script>"))
    html = client_of(site).get("/activity").text
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_privacy_shows_exactly_the_ledgers_epsilon(site):
    ledger = PrivacyLedger(site["state"] / "privacy" / "0123456789abcdef", "rdp")
    ledger.record([(1.1, 0.01, 200)], "fed-1", "train")
    ledger.record([(1.1, 0.01, 300)], "fed-2", "train")
    ledger.extend(2.5, "ethics board approval 42")
    policy = load_policy(site["policy"])
    delta = policy_delta(policy)
    spent = PrivacyLedger(ledger.folder, "rdp").epsilon(delta)
    html = client_of(site).get("/privacy").text
    assert cell(html, "eps-0123456789abcdef") == f"{spent:.4g}"
    budget = policy.dp.max_epsilon + 2.5
    assert cell(html, "budget-0123456789abcdef") == f"{budget:.4g}"
    assert cell(html, "left-0123456789abcdef") == f"{budget - spent:.4g}"
    chart = re.search(r'id="chart-0123456789abcdef">(.*?)</figure>', html, re.S).group(1)
    points = re.search(r'class="epsilon" points="([^"]+)"', chart).group(1).split()
    assert len(points) == 2
    assert "ethics board approval 42" in cell(html, "admin-log")


def test_an_unreadable_ledger_is_shown_not_a_crash(site):
    folder = site["state"] / "privacy" / "fedcba9876543210"
    folder.mkdir(parents=True)
    (folder / "history.json").write_text("{not json")
    response = client_of(site).get("/privacy")
    assert response.status_code == 200
    assert "not JSON" in cell(response.text, "error-fedcba9876543210")


def test_policy_page_shows_every_section_and_the_fingerprint(site):
    html = client_of(site).get("/policy").text
    assert cell(html, "policy-fingerprint") == load_policy(site["policy"]).fingerprint
    for section in ("rules", "dp", "secure-aggregation", "vertical", "apps"):
        assert f'id="policy-{section}"' in html
    assert "<td>max-epsilon</td><td>10.0</td>" in html


def test_an_unreadable_policy_is_shown_not_a_500(site):
    client = client_of(site)
    site["policy"].write_text("min-batch-size = -3\n")
    for page in ("/policy", "/apps", "/privacy"):
        response = client.get(page)
        assert response.status_code == 200
        assert "min-batch-size" in cell(response.text, "policy-error")


def test_apps_page_lists_apps_seen_with_their_standing(site):
    apply_edit(site["policy"], site["state"], "approve", APP_A, "")  # approved and seen
    html = client_of(site).get("/apps").text
    seen = re.search(r'id="seen-table">(.*?)</table>', html, re.S).group(1)
    assert f'id="seen-{APP_B}"' in seen and f'id="seen-{APP_A}"' in seen
    assert "refused (rule apps)" in seen and "approved by digest (approved-sha256)" in seen
    assert f'id="seen-revoke-{APP_A}"' in html
    ids = re.findall(r'id="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    assert cell(html, "apps-any").startswith("any = false")


def test_data_page_lists_splits_and_skipped_items(site):
    folder = site["state"] / "data-report"
    folder.mkdir()
    (folder / "0123456789abcdef.json").write_text(json.dumps({
        "task": "cxr-cls", "dataset": "0123456789abcdef", "time": "2026-11-27T10:00:00Z",
        "splits": {"train": {"loaded": 289, "studies": 8},
                   "val": {"loaded": 30, "skipped": {"img-9": "not a PNG"}}},  # an old one
        "skipped": {"study-0042": "unreadable DICOM series"}}))
    (folder / "broken.json").write_text("[]")
    reports = data_reports(site["state"])
    assert reports[0]["skipped"] == [("val", "img-9", "not a PNG"),
                                     ("(all)", "study-0042", "unreadable DICOM series")]
    assert reports[1]["error"]
    html = client_of(site).get("/data").text
    splits = re.search(r'id="splits-0123456789abcdef">(.*?)</table>', html, re.S).group(1)
    assert re.search(r"<td>train</td><td[^>]*>8</td><td[^>]*>289</td>", splits)  # studies too
    assert re.search(r"<td>val</td><td[^>]*>—</td><td[^>]*>30</td>", splits)
    skipped = re.search(r'id="skipped-0123456789abcdef">(.*?)</table>', html, re.S).group(1)
    assert "study-0042" in skipped and "unreadable DICOM series" in skipped


def test_data_page_shows_each_pacs_cohort_its_size_last_sync_and_skipped_studies(site):
    """Issue 48 item 6: the cohort as the runtime's last sync left it."""
    folder = site["state"] / STORE_DIR / "pe-cohort"
    folder.mkdir(parents=True)
    report = SyncReport(studies_in_pacs=5, synced=3, fetched_studies=1, fetched_bytes=2_500_000,
                        removed=1, seconds=2.0, skipped={"1.2.3.4": "gaps in the slices",
                                                         "1.2.3.5": "no matching series"})
    (folder / REPORT_NAME).write_text(json.dumps({**asdict(report),
                                                  "mb_per_s": report.mb_per_s}))
    html = client_of(site).get("/data").text
    row = re.search(r'id="cohort-sync-pe-cohort">(.*?)</table>', html, re.S).group(1)
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)
    assert cells[1:] == ["5", "3", "1", "1", "2.5", "1.2"] and cells[0].endswith("UTC")
    skipped = re.search(r'id="cohort-skipped-pe-cohort">(.*?)</table>', html, re.S).group(1)
    assert "1.2.3.4" in skipped and "gaps in the slices" in skipped
    assert "no matching series" in skipped


def test_every_page_has_the_nav_and_no_script(site):
    client = client_of(site)
    for page in ("/", "/policy", "/apps", "/privacy", "/activity", "/data"):
        html = client.get(page).text
        assert 'id="nav"' in html and "<script" not in html
        ids = re.findall(r'id="([^"]+)"', html)
        assert len(ids) == len(set(ids)), page


def test_the_privacy_curve_ends_at_the_ledgers_epsilon_bit_for_bit(site):
    ledger = PrivacyLedger(site["state"] / "privacy" / "00000000000000aa", "rdp")
    for steps, sigma in ((50, 1.0), (0, 1.0), (70, 1.3), (50, 1.0)):
        ledger.record([(sigma, 0.02, steps)], "fed-1", "train")
    view = PrivacyView(site["state"])
    spent, curve = view.spent_and_curve(ledger, 1e-5)
    assert spent == ledger.epsilon(1e-5)
    assert curve[-1][1] == spent
    assert len(curve) == 3  # the 0-step entry is not written
    partial = PrivacyLedger(ledger.folder, "rdp")
    partial.entries = partial.entries[:2]
    assert curve[1][1] == partial.epsilon(1e-5)
    assert curve[0][1] < curve[1][1] < curve[2][1]


def test_revoke_through_the_pages_is_confirmed_applied_and_audited(site):
    client = client_of(site)
    apps = client.get("/apps").text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', apps).group(1)
    confirm = client.post("/apps/confirm", data={"csrf": csrf, "action": "revoke", "app": APP_A},
                          headers={"Origin": BASE})
    assert f"apps.revoked-sha256: add {APP_A}" in cell(confirm.text, "confirm-changes")
    assert APP_A not in load_policy(site["policy"]).apps.revoked_sha256  # nothing yet
    fingerprint = re.search(r'name="fingerprint" value="([0-9a-f]+)"', confirm.text).group(1)
    done = client.post("/apps/apply", data={"csrf": csrf, "action": "revoke", "app": APP_A,
                                            "fingerprint": fingerprint, "reason": "recall"},
                       headers={"Origin": BASE})
    assert done.url.path == "/apps" and cell(done.text, "flash").startswith("revoked aaaaaaaaaaaa")
    assert APP_A in load_policy(site["policy"]).apps.revoked_sha256
    revoked = [r for r in site["log"].records() if r["kind"] == "app-revoked"]
    token = admin_token_path(site["state"]).read_text().strip()
    token_id = hashlib.sha256(token.encode()).hexdigest()[:8]
    who = f"console admin (token {token_id}) from 127.0.0.1"
    assert [(r["app"], r["by"], r["reason"]) for r in revoked] == [(APP_A, who, "recall")]
    assert 'id="flash"' not in client.get("/apps", params={"done": "call 555-0100 now",
                                                           "mac": "0" * 64}).text
    apps = client.get("/apps").text  # the revoke is offered its undo, not a new approval
    assert f'id="undo-revoke-{APP_A}"' in apps and f'id="approve-{APP_A}"' not in apps
    assert _row_words(apps, f"change-{revoked[0]['seq']}") == [
        revoked[0]["time"], "revoked", APP_A[:12], *who.split(), "recall",
        "apps.revoked-sha256:", "add", APP_A]
    confirm = client.post("/apps/confirm", data={"csrf": csrf, "action": "undo-revoke",
                                                 "app": APP_A}, headers={"Origin": BASE})
    assert f"audit record {revoked[0]['seq']}" in cell(confirm.text, "confirm-undo")
    assert cell(confirm.text, "confirm-changes") == f"apps.revoked-sha256: remove {APP_A}"
    fingerprint = re.search(r'name="fingerprint" value="([0-9a-f]+)"', confirm.text).group(1)
    done = client.post("/apps/apply", data={"csrf": csrf, "action": "undo-revoke", "app": APP_A,
                                            "fingerprint": fingerprint, "reason": "wrong app"},
                       headers={"Origin": BASE})
    assert cell(done.text, "flash").startswith("revoke undone aaaaaaaaaaaa")
    apps_rules = load_policy(site["policy"]).apps
    assert APP_A not in apps_rules.revoked_sha256 and APP_A not in apps_rules.approved_sha256
    (undone,) = [r for r in site["log"].records() if r["kind"] == "app-revoke-undone"]
    assert (undone["undoes"], undone["by"]) == (revoked[0]["seq"], who)
    assert _row_words(done.text, f"change-{undone['seq']}")[1:3] == ["revoke", "undone"]


def _row_words(html: str, row_id: str) -> list[str]:
    """The words of table row ``row_id``, its tags stripped."""
    row = re.search(rf'<tr id="{row_id}">(.*?)</tr>', html, re.S).group(1)
    return re.sub(r"<[^>]+>", " ", row).split()


def test_a_line_that_is_not_json_is_reported_not_a_500(site):
    path = audit_dir(site["state"]) / "audit.jsonl"
    lines = path.read_text().splitlines()
    lines[3] = "{torn"
    path.write_text("\n".join(lines) + "\n")
    client = client_of(site)
    overview = client.get("/")
    assert overview.status_code == 200
    assert re.search(r'id="chain-status" class="banner broken"', overview.text)
    assert "unreadable" in cell(overview.text, "chain-status")
    assert client.get("/activity").status_code == 200


def test_segments_moved_to_the_archive_verify_with_the_archive_option(site, tmp_path):
    log = AuditLog(site["state"], max_bytes=600)
    for _ in range(6):
        log.append(message("answered"))
    folder = audit_dir(site["state"])
    rotated = sorted(folder.glob("audit-*.jsonl"))
    assert len(rotated) >= 2
    archive = tmp_path / "archive"
    archive.mkdir()
    shutil.move(rotated[0], archive / rotated[0].name)
    assert "removed" in cell(client_of(site).get("/").text, "chain-status")
    client = client_of(site, audit_archive=archive)
    assert cell(client.get("/").text, "chain-status") == "audit log verified, 11 records"


def test_a_site_without_the_sandbox_is_shown_in_red_on_every_page(site):
    """Issue #44: ``sandbox = "off"`` must be visible to the hospital, not just a log line."""
    for page in ("/", "/policy", "/activity", "/privacy"):
        assert 'id="sandbox-off"' not in client_of(site).get(page).text
    text = site["policy"].read_text()
    assert 'sandbox = "on"' in text
    site["policy"].write_text(text.replace('sandbox = "on"', 'sandbox = "off"'))
    for page in ("/", "/policy", "/activity", "/privacy"):
        html = client_of(site).get(page).text
        assert 'id="sandbox-off" class="banner broken"' in html, page


def test_datasets_are_shown_by_the_sites_name_with_the_id_beside_it(site):
    """Issue 47, item 8: the console named each dataset by a hash only."""
    folder = site["state"] / "data-report"
    folder.mkdir()
    (folder / "0123456789abcdef.json").write_text(json.dumps({
        "task": "cxr-cls", "dataset": "0123456789abcdef", "time": "2026-11-27T10:00:00Z",
        "splits": {"train": {"loaded": 12, "studies": 12}}, "skipped": {}}))
    client = client_of(site, datasets=(("0123456789abcdef", "chest-xray-2026"),))
    html = client.get("/data").text
    heading = re.search(r'id="data-0123456789abcdef">\s*<h2>(.*?)</h2>', html, re.S).group(1)
    assert "chest-xray-2026" in heading and "0123456789abcdef" in heading
    assert "chest-xray-2026" not in client_of(site).get("/data").text  # unnamed: the id only
    (site["state"] / "privacy" / "0123456789abcdef").mkdir(parents=True)
    row = re.search(r'id="ds-0123456789abcdef">(.*?)</tr>', client.get("/privacy").text,
                    re.S).group(1)
    assert "chest-xray-2026" in row and "0123456789abcdef" in row


def test_the_console_command_names_a_dataset_by_its_folder(tmp_path):
    assert _named_dataset(f"ward-7={tmp_path}") == (dataset_id(tmp_path), "ward-7")
    with pytest.raises(ConfigError, match="NAME=/abs/folder"):
        _named_dataset("ward-7=relative/folder")


def test_a_sites_dataset_name_comes_from_its_node_config_or_its_folder():
    from app.config.site_config import SiteConfig
    assert SiteConfig.from_node_config({"data-path": "/srv/ward-7"}, "").dataset_name == "ward-7"
    named = SiteConfig.from_node_config({"data-path": "/srv/x", "dataset-name": "CT 2026"}, "")
    assert named.dataset_name == "CT 2026"
