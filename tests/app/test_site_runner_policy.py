"""One policy file governs both the apps and the data: the site runner refuses to start
without it, and a node config that names another policy file is refused."""

from __future__ import annotations

import importlib
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from flwr.app import Context, RecordDict
from flwr.common.constant import SubStatus
from flwr.supercore.task_identity import TaskIdentity

from app.site_runtime import site_node
from app.site_runtime.app_approval import fab_sha256
from app.site_runtime.site_runner import SiteRunner
from app.site_runtime.supernode import SITE_INDEX_FILES, SuperNodeProcess, site_folder_problem
from app.tooling.errors import FlowerProcessError
from app.tooling.layout import DeployLayout
from strategies.wire import message_keys as keys
from tests.app.site_messages import instruction

ROOT = Path(__file__).resolve().parents[2]
PERMISSIVE = ROOT / "configs" / "site-policy-permissive.toml"
FAB = b"PK\x03\x04 a stand-in bundle"


class _Started(Exception):
    """Raised instead of starting Flower's SuperNode."""


@pytest.fixture
def no_supernode(monkeypatch):
    """site_node.main up to the point where it would start the SuperNode."""
    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")  # the module

    def started() -> None:
        raise _Started

    monkeypatch.setattr(cli, "flower_supernode", started)
    monkeypatch.setattr(site_node, "cap_supernode_waits", lambda *a, **k: None)
    monkeypatch.setattr(site_node, "widen_transfers", lambda *a, **k: None)
    monkeypatch.setattr(site_node, "SiteRunner", lambda *a, **k: SimpleNamespace(
        serve=lambda stop: None, close=lambda: None))


def _policy_copy(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text(PERMISSIVE.read_text())
    return path


def test_the_site_node_refuses_to_start_without_policy_in_one_line(no_supernode, capsys):
    with pytest.raises(SystemExit) as info:
        site_node.main(["--", "--port", "9", "--node-config", 'data-path="/site"'])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--policy" in err


def test_the_site_node_refuses_a_node_config_naming_another_or_no_policy(no_supernode, tmp_path):
    ours, theirs = _policy_copy(tmp_path, "a.toml"), _policy_copy(tmp_path, "b.toml")
    for node_config, named in ((f'data-path="/site" policy-path="{theirs}"', str(theirs)),
                               ('data-path="/site"', "no policy-path")):
        with pytest.raises(FlowerProcessError) as info:
            site_node.main(["--policy", str(ours), "--", "--port", "9",
                            "--node-config", node_config])
        assert str(ours) in str(info.value) and named in str(info.value)
    with pytest.raises(_Started):  # the same file, spelled differently: it starts
        site_node.main(["--policy", str(ours), "--", "--port", "9", "--node-config",
                        f'data-path="/site" policy-path="{tmp_path / "x" / ".." / "a.toml"}"'])


def test_the_runner_needs_a_policy_and_refuses_a_message_whose_node_names_another(
        tmp_path, caplog, monkeypatch):
    for name, value in (("_task_id", 3), ("_run_id", 1), ("_node_id", 7)):
        monkeypatch.setattr(TaskIdentity, name, value)  # as pull_task_input sets them
    with pytest.raises(FlowerProcessError, match="policy"):
        SiteRunner("127.0.0.1:9", None)
    ours, theirs = _policy_copy(tmp_path, "a.toml"), _policy_copy(tmp_path, "b.toml")
    runner = SiteRunner("127.0.0.1:9", ours)
    fab = SimpleNamespace(hash_str=fab_sha256(FAB), content=FAB)
    message = instruction("train")
    for node_config in ({"site-name": "h", "policy-path": str(theirs)}, {"site-name": "h"}):
        context = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                          run_config={})
        with caplog.at_level(logging.WARNING, logger="fedmed.site_runner"):
            answer = runner._answer(message, context, SimpleNamespace(), fab)
            reply, status = answer.reply, answer.status
        assert status == SubStatus.FAILED and reply.error.code == keys.APP_REFUSAL_CODE
        assert f"{keys.POLICY_RULE_PREFIX}policy-path (refused)" in reply.error.reason
        assert "/" not in reply.error.reason.split(":", 1)[1]  # paths stay at the site
        assert str(ours) in caplog.text
    assert runner.pool.started == 0  # nothing of the app ran


def test_a_warm_supernode_needs_a_policy(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "manifest.csv").write_text("study_id,split,image,mask\n")
    with pytest.raises(FlowerProcessError, match="policy"):
        SuperNodeProcess.start(DeployLayout(tmp_path / "deploy"), "hospital-a", "127.0.0.1:1",
                               site)


@pytest.mark.parametrize("broken, rule, said", [
    ("min-val-items = -1", "min-val-items", "its 'min-val-items' is invalid"),
    ("min-val-itmes = 5", "apps", "unknown key 'min-val-itmes'")])
def test_a_broken_policy_file_is_refused_naming_the_key_not_the_path(
        tmp_path, monkeypatch, broken, rule, said):
    """Issue 47, walkthrough 7: it said 'policy rule apps (refused): the site policy cannot
    be read' when the typo was in min-val-items."""
    for name, value in (("_task_id", 3), ("_run_id", 1), ("_node_id", 7)):
        monkeypatch.setattr(TaskIdentity, name, value)
    ours = _policy_copy(tmp_path, "a.toml")
    runner = SiteRunner("127.0.0.1:9", ours)
    text = ours.read_text()  # the hospital's edit, with its mistake
    assert text.count("\nmin-val-items = ") == 1
    ours.write_text(re.sub(r"\nmin-val-items = [^\n]*", "\n" + broken, text))
    fab = SimpleNamespace(hash_str=fab_sha256(FAB), content=FAB)
    context = Context(run_id=1, node_id=7, node_config={"site-name": "h",
                      "policy-path": str(ours)}, state=RecordDict(), run_config={})
    answer = runner._answer(instruction("train"), context, SimpleNamespace(), fab)
    reason = answer.reply.error.reason
    assert f"{keys.POLICY_RULE_PREFIX}{rule} (refused)" in reason and said in reason
    assert "/" not in reason.split(":", 1)[1]


@pytest.mark.parametrize("index", sorted(SITE_INDEX_FILES))
def test_every_tasks_site_folder_can_be_deployed(tmp_path, index):
    """Issue 47, walkthrough 1: only pe-seg folders (manifest.csv) could be deployed; the
    cxr-cls, ct3d-cls, tabular and vertical ones were refused as "not a site data folder"."""
    (tmp_path / index).write_text("")
    assert site_folder_problem(tmp_path) is None


def test_a_missing_folder_and_one_without_an_index_are_told_apart(tmp_path):
    assert "does not exist" in site_folder_problem(tmp_path / "nope")
    problem = site_folder_problem(tmp_path)
    assert "holds no site index file" in problem and "images.csv" in problem
