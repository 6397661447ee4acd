"""Anchors of the audit log's head off the machine (app/site_runtime/audit_anchor.py), written by
the site node (site_audit.py) and checked by `make audit-verify` (audit_chain.py): a chain
rewritten whole with its head.json, which the chain alone calls intact, is caught (#44)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from app.site_runtime import audit_anchor
from app.site_runtime.audit_anchor import (
    ANCHOR_IDENT, Anchor, AnchorError, FileAnchor, SyslogAnchor, read_anchors,
)
from app.site_runtime.audit_chain import main, verify_chain
from app.site_runtime.audit_log import AuditLog, audit_dir
from app.site_runtime.site_audit import SiteAudit
from clients.site.policy import AuditRules

ROOT = Path(__file__).resolve().parents[2]


def _message(number: int) -> dict:
    return {"kind": "message", "site": "hospital-a", "run": 7, "type": "train",
            "decision": "answered", "bytes_sent": 4096 + number, "epsilon": 0.02}


def _node(state: Path, anchor: str, messages: int, every: int = 5) -> SiteAudit:
    """A node's audit that started, audited ``messages`` messages and stopped."""
    audit = SiteAudit(state, "hospital-a")
    audit.node_started("f" * 16, AuditRules(anchor=anchor, anchor_every=every))
    for number in range(messages):
        audit.message(_message(number))
    audit.anchor_now()
    return audit


def _policy(tmp_path: Path, anchor: str) -> Path:
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[apps]\nany = true\n\n[audit]\nanchor = "{anchor}"\nanchor-every = 5\n')
    return policy


def _anchors(path: Path) -> list[Anchor]:
    return [Anchor.from_text(line) for line in path.read_text().splitlines()]


@pytest.fixture
def anchored(tmp_path: Path) -> tuple[Path, Path]:
    """A state dir whose node anchored to a file on "another mount", and that file."""
    state, anchor_file = tmp_path / "state", tmp_path / "mount" / "anchors.jsonl"
    anchor_file.parent.mkdir()
    _node(state, str(anchor_file), 18)
    return state, anchor_file


def test_the_node_anchors_at_start_every_n_records_and_at_stop(anchored):
    state, anchor_file = anchored
    # node-start 0, policy-change 1, messages 2..19: the start, every 5 records, the stop
    anchors = _anchors(anchor_file)
    assert [a.seq for a in anchors] == [1, 6, 11, 16, 19]
    records = list(AuditLog(state).records())
    assert all(a.hash == records[a.seq]["hash"] for a in anchors)
    assert {a.log for a in anchors} == {str(audit_dir(state).resolve())}
    assert {a.site for a in anchors} == {"hospital-a"}
    assert stat.S_IMODE(anchor_file.stat().st_mode) == 0o640


def test_a_node_anchors_the_same_head_once(anchored):
    state, anchor_file = anchored
    audit = SiteAudit(state, "hospital-a", AuditRules(anchor=str(anchor_file)))
    assert audit.anchor_now().seq == 19  # another node object: it has not anchored it
    assert audit.anchor_now() is None
    assert [a.seq for a in _anchors(anchor_file)][-2:] == [19, 19]


def _rewrite_whole(state: Path) -> None:
    """Delete seq 8, forge a budget-reset, recompute every hash and head.json."""
    bodies = [{k: v for k, v in r.items() if k not in ("seq", "prev", "hash")}
              for r in AuditLog(state).records() if r["seq"] != 8]
    bodies.insert(13, {"kind": "budget-reset", "dataset": "ds-1", "by": "admin",
                       "reason": "quarterly", "time": bodies[12]["time"]})
    for path in audit_dir(state).glob("*.json*"):
        path.unlink()
    log = AuditLog(state, sync=False)
    for body in bodies:
        log.append(body)


def test_a_chain_rewritten_whole_is_named_at_the_first_anchor_that_does_not_match(anchored):
    state, anchor_file = anchored
    _rewrite_whole(state)
    assert verify_chain(state).ok  # the chain alone cannot see it
    report = verify_chain(state, anchors=read_anchors(str(anchor_file), audit_dir(state)))
    assert (report.ok, report.problem, report.seq, report.line) == (False, "edited", 11, 12)
    assert report.records == 11
    assert f"anchor seq 11 ({_anchors(anchor_file)[2].time}) recorded in anchor file " \
           f"{anchor_file}: the log was rewritten" in report.message()


def test_make_audit_verify_checks_the_policys_anchors_by_default(anchored, tmp_path, capsys):
    state, anchor_file = anchored
    policy = _policy(tmp_path, str(anchor_file))
    assert main(["--state", str(state), "--policy", str(policy)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "; intact and matches anchor seq 19 of " in out
    assert f"(5 anchors checked, from anchor file {anchor_file})" in out
    _rewrite_whole(state)
    assert main(["--state", str(state), "--policy", str(policy)]) == 1
    assert "(seq 11): edited: its hash is not the one anchor seq 11" in capsys.readouterr().out
    assert main(["--state", str(state), "--anchor", "none"]) == 0
    assert "chain intact but NOT ANCHORED: --anchor names no anchor" in capsys.readouterr().out


def test_a_log_cut_below_its_last_anchor_is_truncated(anchored):
    state, anchor_file = anchored
    current = audit_dir(state) / "audit.jsonl"
    lines = current.read_bytes().splitlines(keepends=True)
    current.write_bytes(b"".join(lines[:18]))
    (audit_dir(state) / "head.json").write_text(json.dumps(
        {"seq": 17, "hash": json.loads(lines[17])["hash"]}))
    report = verify_chain(state, anchors=read_anchors(str(anchor_file), audit_dir(state)))
    assert (report.problem, report.seq) == ("truncated", 18)
    assert "anchor seq 19" in report.detail and "the log ends at seq 17" in report.detail


def test_not_anchored_is_said_apart_from_anchored(tmp_path, capsys):
    state, anchor_file = tmp_path / "state", tmp_path / "anchors.jsonl"
    _node(state, "", 3)
    assert main(["--state", str(state), "--policy", str(_policy(tmp_path, ""))]) == 0
    assert capsys.readouterr().out.endswith(
        f"; chain intact but NOT ANCHORED: the policy {tmp_path / 'policy.toml'} names no "
        "anchor\n")
    other = Anchor("/elsewhere/audit", "hospital-b", 0, "0" * 64, "2025-01-01T00:00:00Z")
    FileAnchor(anchor_file).write(other)
    assert main(["--state", str(state), "--anchor", str(anchor_file)]) == 0
    assert capsys.readouterr().out.endswith(
        f"NOT ANCHORED: anchor file {anchor_file} holds no anchor of this log yet (1 of "
        "other logs)\n")
    assert main(["--state", str(state)]) == 0
    assert "NOT ANCHORED: no --policy or --anchor named the anchors" in capsys.readouterr().out


def test_an_anchor_that_cannot_be_written_is_loud_and_the_reply_goes_on(tmp_path, caplog):
    state, missing = tmp_path / "state", tmp_path / "unmounted" / "anchors.jsonl"
    audit = SiteAudit(state, "hospital-a", AuditRules(anchor=str(missing), anchor_every=1))
    with caplog.at_level(logging.ERROR, "fedmed.site_runner"):
        written = audit.message(_message(0))
    assert written is not None and written["seq"] == 0
    assert f"AUDIT LOG NOT ANCHORED for site hospital-a at seq 0: audit anchor file {missing}" \
           in caplog.text
    with pytest.raises(AnchorError, match=str(missing)):
        FileAnchor(missing).write(Anchor("/a", "s", 0, "0" * 64, "t"))


@pytest.fixture
def syslog_socket(tmp_path: Path):
    """A Unix datagram socket standing in for /dev/log."""
    path = tmp_path / "log"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.settimeout(30)
    yield path, server
    server.close()


def test_a_syslog_anchor_is_one_message_from_the_fixed_identifier(syslog_socket):
    path, server = syslog_socket
    anchor = Anchor("/abs/state/audit", "hospital-a", 99, "a" * 64, "2025-01-31T09:00:00Z")
    SyslogAnchor(str(path)).write(anchor)
    sent = server.recv(65536).decode()
    assert sent == f"<86>{ANCHOR_IDENT}: " + anchor.line().decode()  # authpriv.info
    assert Anchor.from_text(sent) == anchor


def test_a_missing_system_log_is_an_anchor_error(tmp_path):
    with pytest.raises(AnchorError, match="the system log .* refused it"):
        SyslogAnchor(str(tmp_path / "no-log")).write(Anchor("/a", "s", 0, "0" * 64, "t"))


def _syslog_node(state: Path, syslog_socket, monkeypatch) -> list[str]:
    """A node anchoring to syslog every 2 records; the messages its system log received."""
    path, server = syslog_socket
    monkeypatch.setattr(audit_anchor, "SYSLOG_ADDRESS", str(path))
    _node(state, "syslog", 4, every=2)  # seqs 0, 1 (anchored), 2..5: anchors 1, 3, 5
    return [server.recv(65536).decode() for _ in range(3)]


def test_syslog_anchors_are_read_from_an_exported_journal(tmp_path, syslog_socket,
                                                          monkeypatch, capsys):
    state = tmp_path / "state"
    sent = _syslog_node(state, syslog_socket, monkeypatch)
    assert [Anchor.from_text(line).seq for line in sent] == [1, 3, 5]
    exported = tmp_path / "exported.txt"  # as rsyslog files them
    exported.write_text("".join(f"Jan 31 09:00:00 host {line.split('>', 1)[1]}\n"
                                for line in sent) + "Jan 31 09:00:01 host sshd: unrelated\n")
    policy = _policy(tmp_path, "syslog")
    assert main(["--state", str(state), "--policy", str(policy), "--journal",
                 str(exported)]) == 0
    out = capsys.readouterr().out
    assert f"intact and matches anchor seq 5 of {Anchor.from_text(sent[-1]).time} (3 " \
           f"anchors checked, from exported journal {exported})" in out


def test_syslog_anchors_are_read_from_journalctl_when_it_is_there(tmp_path, syslog_socket,
                                                                   monkeypatch, capsys):
    state = tmp_path / "state"
    sent = _syslog_node(state, syslog_socket, monkeypatch)
    printed = tmp_path / "journal.txt"  # journalctl -o cat prints the messages alone
    printed.write_text("".join(line.split(": ", 1)[1] + "\n" for line in sent))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    journalctl = bin_dir / "journalctl"
    journalctl.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "argv"}\ncat {printed}\n')
    journalctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert main(["--state", str(state), "--anchor", "syslog"]) == 0
    assert "(3 anchors checked, from journalctl -t fedmed-audit)" in capsys.readouterr().out
    assert (tmp_path / "argv").read_text().split() == ["-t", ANCHOR_IDENT, "-o", "cat",
                                                      "--no-pager"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["--state", str(state), "--anchor", "syslog"]) == 2
    assert "journalctl is not on this machine" in capsys.readouterr().err


def test_make_audit_verify_reads_the_policy_and_passes_absolute_paths():
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(["make", "-n", "--no-print-directory", "-o", "install", "audit-verify",
                           "STATE=st", "ARCHIVE=old", "ANCHOR=anchors.jsonl", "JOURNAL=j.txt"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    argv = done.stdout.replace("\\\n", " ").split()
    start = argv.index("app.site_runtime.audit_chain") + 1
    assert argv[start:] == ["--state", f"{ROOT}/st", "--policy",
                            f"{ROOT}/configs/site-policy.toml", "--anchor",
                            f"{ROOT}/anchors.jsonl", "--journal", f"{ROOT}/j.txt",
                            "--archive", f"{ROOT}/old"]
    done = subprocess.run(["make", "-n", "--no-print-directory", "-o", "install", "audit-verify",
                           "STATE=st", "POLICY=p.toml", "ANCHOR=syslog"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    argv = done.stdout.replace("\\\n", " ").split()
    assert argv[argv.index("--policy"):] == ["--policy", f"{ROOT}/p.toml", "--anchor", "syslog"]
