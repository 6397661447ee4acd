"""The warm site worker: one process answers message after message; a crash is survived.

A tiny app bundle (its ClientApp replies with its process id, or kills its own
process on a ``crash`` message) is built with Flower's own FAB builder and
installed into a private ``FLWR_HOME``; :class:`WorkerPool` runs jobs on it
exactly as the site runner does.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.cli.build import build_fab_from_disk
from flwr.cli.install import install_from_fab
from flwr.supercore.task_identity import TaskIdentity

from app.site_runtime.worker_pool import WorkerPool
from tests.app.tiny_app import write_tiny_app

CLIENT = '''
import os
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()
calls = []


@app.train()
def train(msg, context):
    if msg.content["config"]["action"] == "crash":
        os._exit(3)
    calls.append(1)
    return Message(RecordDict({"out": ConfigRecord({"pid": os.getpid(),
                                                    "calls": len(calls)})}), reply_to=msg)
'''



@pytest.fixture
def installed_app(tmp_path, monkeypatch) -> str:
    """Build and install the tiny bundle into a private FLWR_HOME; its sha256."""
    project = write_tiny_app(tmp_path / "tinyapp", CLIENT)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    fab = build_fab_from_disk(project)
    install_from_fab(fab, skip_prompt=True)
    return hashlib.sha256(fab).hexdigest()


def _job(fab_hash: str, action: str) -> dict:
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 7, 1, 2
    message = Message(RecordDict({"config": ConfigRecord({"action": action})}),
                      dst_node_id=2, message_type="train")
    message.metadata.__dict__["_message_id"] = f"m-{action}"
    context = Context(run_id=1, node_id=2, node_config={}, state=RecordDict(),
                      run_config={"task": "tiny"})
    return {"task_id": 7, "run_id": 1, "node_id": 2, "fab_id": "fedmed/tinyapp",
            "fab_version": "1.0.0", "fab_hash": fab_hash, "message": message,
            "context": context}


def test_one_warm_worker_answers_every_message_and_a_crash_is_survived(installed_app):
    pool = WorkerPool(max_workers=1)
    key = (installed_app, "tiny")
    try:
        first = pool.run(key, _job(installed_app, "train"))
        second = pool.run(key, _job(installed_app, "train"))
        assert first[0] == second[0] == "done"
        a, b = first[1].content["out"], second[1].content["out"]
        assert a["pid"] == b["pid"] and (a["calls"], b["calls"]) == (1, 2)  # same process
        assert pool.started == 1

        crashed = pool.run(key, _job(installed_app, "crash"))
        assert crashed == ("crashed", 3)

        after = pool.run(key, _job(installed_app, "train"))
        assert after[0] == "done" and pool.started == 2
        assert after[1].content["out"]["pid"] != a["pid"]  # a fresh worker
        assert after[1].content["out"]["calls"] == 1
    finally:
        pool.close()


def test_an_app_that_cannot_be_loaded_fails_with_its_type_only(installed_app):
    pool = WorkerPool(max_workers=1)
    try:
        job = _job("0" * 64, "train")  # not installed
        outcome = pool.run(("0" * 64, "tiny"), job)
        assert outcome[0] == "failed" and outcome[2] is True
        assert "/" not in outcome[1]
    finally:
        pool.close()


def test_the_pool_keeps_at_most_max_workers(installed_app, tmp_path):
    pool = WorkerPool(max_workers=1)
    try:
        pool.run((installed_app, "tiny"), _job(installed_app, "train"))
        pool.run((installed_app, "other-task"), _job(installed_app, "train"))
        assert pool.started == 2 and len(pool._workers) == 1  # the first one was stopped
    finally:
        pool.close()
    with pytest.raises(ValueError):
        WorkerPool(max_workers=0)


def test_an_edited_site_index_sends_the_next_message_to_a_fresh_worker(installed_app,
                                                                      tmp_path):
    """Issue 47, walkthrough 5: data edited while a SuperNode ran was ignored until a
    restart (the warm worker kept what it had loaded)."""
    import os

    from app.site_runtime.runtime_round import worker_key
    site = tmp_path / "site"
    site.mkdir()
    manifest = site / "manifest.csv"
    manifest.write_text("study_id,split,image,mask\n")
    before = worker_key(installed_app, "pe-seg", site, "on")
    assert worker_key(installed_app, "pe-seg", site, "on") == before  # unchanged: same worker
    manifest.write_text("study_id,split,image,mask\ns1,train,a,b\n")
    os.utime(manifest, ns=(manifest.stat().st_atime_ns, manifest.stat().st_mtime_ns + 10**9))
    after = worker_key(installed_app, "pe-seg", site, "on")
    assert after != before and after[:4] == before[:4]
    pool = WorkerPool(max_workers=2)
    try:
        pool.run(before, _job(installed_app, "train"))
        assert pool.retire(lambda k: k[:4] == after[:4] and k != after) == 1
        assert not pool._workers
    finally:
        pool.close()
