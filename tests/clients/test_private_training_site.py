"""DP-SGD through the ClientApp's train handler: epsilon in the reply, the budget stops a site.

Handler level, as tests/app/test_site_errors.py: a real Flower Message and
Context; the site's data is 12 in-memory 16 px images (no site folder to read).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from opacus.accountants import create_accountant
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from app import client_app
from clients.site.privacy_ledger import PrivacyLedger
from clients.site.site_round import SiteTasks
from clients.cxr_cls.task import CXRClsTask
from clients.training.classification import LabelledTensors
from clients.training.site_task import TaskSettings
from strategies.rounds.instructions import pack_arrays
from strategies.wire import message_keys as keys

SETTINGS = TaskSettings(image_size=16, batch_size=4)
RUN = {"task": "cxr-cls", "image-size": 16, "batch-size": 4, "local-steps": 3,
       "optimizer": "sgd", "momentum": 0.0, "privacy.noise-multiplier": 1.5}


class _TinyCxr(CXRClsTask):
    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.settings = SETTINGS
        self.train_set = LabelledTensors([rng.normal(size=(16, 16)) for _ in range(12)],
                                         [np.array([i % 2], np.float32) for i in range(12)])
        self.report = type("Report", (), {"skipped": {}})()


@pytest.fixture(autouse=True)
def site(monkeypatch):
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 42, 7
    monkeypatch.setattr(client_app, "_TASKS", SiteTasks(lambda *args, **kwargs: _TinyCxr()))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def _train(tmp_path, server_round: int, max_epsilon: str = "inf", **run) -> Message:
    policy = tmp_path / "policy.toml"
    policy.write_text(f"[dp]\nmax-epsilon = {max_epsilon}\naccountants = [\"rdp\", \"prv\"]\n")
    model = CXRClsTask.model_for_run(SETTINGS, private=True)  # the server's model
    instruction = ConfigRecord({keys.SERVER_ROUND: server_round, keys.FEDERATION: "fed-a"})
    msg = Message(RecordDict({keys.ARRAYS: pack_arrays(ArrayRecord(model.state_dict())),
                              keys.CONFIG: instruction}), dst_node_id=7,
                  message_type=MessageType.TRAIN)
    context = Context(run_id=42, node_id=7, state=RecordDict(), run_config={**RUN, **run},
                      node_config={"data-path": str(tmp_path), "site-name": "hospital-a",
                                   "state-dir": str(tmp_path / "state"),
                                   "policy-path": str(policy)})
    return client_app.train(msg, context)


def test_epsilon_is_reported_grows_and_the_budget_stops_the_site(tmp_path):
    first = _train(tmp_path, 1)
    assert not first.has_error()
    eps1 = first.content[keys.METRICS][keys.EPSILON]
    assert eps1 > 0 and first.content[keys.METRICS][keys.EPSILON_ROUND] == pytest.approx(eps1)
    second = _train(tmp_path, 2)  # a new process: the ledger is read from state-dir
    eps2 = second.content[keys.METRICS][keys.EPSILON]
    assert eps2 > eps1
    assert second.content[keys.METRICS][keys.EPSILON_ROUND] == pytest.approx(eps2 - eps1)
    refused = _train(tmp_path, 3, max_epsilon=str(eps2 * 1.01))
    assert refused.has_error()
    assert refused.error.reason == "site hospital-a: policy rule dp.max-epsilon (refused)"


def test_run_accountant_reaches_the_training_and_the_ledger(tmp_path, monkeypatch):
    """privacy.accountant = "prv": DP-SGD and the site's epsilon both count with PRV."""
    seen = []
    train = _TinyCxr.train
    monkeypatch.setattr(_TinyCxr, "train", lambda self, *a, **kw: seen.append(
        kw["privacy"].accountant) or train(self, *a, **kw))
    reply = _train(tmp_path, 1, **{"privacy.accountant": "prv"})
    assert not reply.has_error() and seen == ["prv"]
    history = [entry.step() for entry in
               PrivacyLedger.of_site(tmp_path / "state", tmp_path, "prv").entries]
    epsilon = {}
    for name in ("prv", "rdp"):
        accountant = create_accountant(name)
        accountant.history = [(s, q, int(n)) for s, q, n in history]
        epsilon[name] = accountant.get_epsilon(1e-5)
    assert reply.content[keys.METRICS][keys.EPSILON] == pytest.approx(epsilon["prv"])
    assert epsilon["prv"] < 0.95 * epsilon["rdp"]
