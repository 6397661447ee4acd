"""Issue #28's attacks of a curious coordinator, re-run through the ClientApp's handlers at a
hospital running the shipped policy (configs/site-policy.toml) with one edit.

Found 1: a new federation id reset the epsilon budget; found 2: two loss queries
differenced to one patient's loss; found 3: an evaluate message fine-tuned on the training
split that the train message could not touch. Each is now refused or withheld.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from app import client_app
from clients.cxr_cls.task import CXRClsTask
from clients.site.site_round import SiteTasks
from clients.training.trainer import select_device
from strategies.rounds.instructions import pack_arrays
from strategies.wire import message_keys as keys
from tests.app.site_messages import TYPES
from tests.clients.site_round_fixtures import SIZES, TinyCxr

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "site-policy.toml"
RUN = {"task": "cxr-cls", "image-size": 16, "batch-size": 4, "local-steps": 3,
       "optimizer": "sgd", "momentum": 0.0, "num-server-rounds": 20}
pytestmark = pytest.mark.usefixtures("site_identity", "one_torch_thread")


@pytest.fixture(autouse=True)
def tiny_site(monkeypatch):
    monkeypatch.setattr(client_app, "_TASKS", SiteTasks(lambda *a, **k: TinyCxr(),
                                                        select_device("cpu")))


def _hospital(tmp_path: Path, line: str = "", edit: str = "") -> dict[str, str]:
    """The shipped policy with its ``line`` replaced by ``edit``; the site's node config."""
    text = SHIPPED.read_text()
    assert line in text.splitlines()
    text = text.replace(f"\n{line}\n", f"\n{edit}\n", 1)
    (tmp_path / "policy.toml").write_text(text)
    (tmp_path / "site").mkdir(exist_ok=True)
    return {"data-path": str(tmp_path / "site"), "site-name": "hospital-a",
            "state-dir": str(tmp_path / "state"), "policy-path": str(tmp_path / "policy.toml")}


def _send(kind: str, node: dict, run: dict, model: dict, **config) -> Message:
    record = ConfigRecord({keys.SERVER_ROUND: 1, **config})
    msg = Message(RecordDict({keys.ARRAYS: pack_arrays(ArrayRecord(model)),
                              keys.CONFIG: record}), dst_node_id=7, message_type=TYPES[kind])
    context = Context(run_id=42, node_id=7, state=RecordDict(), run_config={**RUN, **run},
                      node_config=node)
    return getattr(client_app, kind)(msg, context)


def _metrics(reply: Message) -> dict:
    assert not reply.has_error(), reply.error.reason
    return dict(reply.content[keys.METRICS])


def test_a_new_federation_id_buys_no_new_epsilon(tmp_path):
    node = _hospital(tmp_path, "max-epsilon = 10.0", "max-epsilon = 8.0")  # issue #28's budget
    private = {"privacy.noise-multiplier": 1.0}  # epsilon 5.2, 6.84, then 8.11: refused
    model = CXRClsTask.model_for_run(SIZES, private=True).state_dict()
    spent = []
    for server_round in range(1, 20):
        reply = _send("train", node, private, model, **{keys.SERVER_ROUND: server_round,
                                                       keys.FEDERATION: "fed-1"})
        if reply.has_error():
            break
        spent.append(_metrics(reply)[keys.EPSILON])
    assert len(spent) == 2 and spent[-1] <= 8.0
    assert reply.error.reason == "site hospital-a: policy rule dp.max-epsilon (refused)"
    for federation in ("fed-2", "fed-3"):  # today each started again from 0
        reply = _send("train", node, private, model, **{keys.FEDERATION: federation})
        assert reply.error.reason == "site hospital-a: policy rule dp.max-epsilon (refused)"


def test_two_loss_queries_no_longer_difference_to_one_patient(tmp_path):
    node = _hospital(tmp_path)  # min-batch-size 4, max-queries 100
    torch.manual_seed(0)
    model = CXRClsTask.model_for_run(SIZES).state_dict()
    task = TinyCxr()
    net = task.build_model()
    net.load_state_dict(model)
    with torch.no_grad():
        singles = [float(task.loss_fn()(net.eval()(x[None]), y[None]))
                   for x, y in (task.train_set[i] for i in range(len(task.train_set)))]

    def loss(subset: int) -> float:
        reply = _send("query", node, {}, model, **{keys.LOSS_SUBSET: subset})
        return _metrics(reply)[keys.QUERY_LOSS]

    differenced = [5 * loss(5) - 4 * loss(4) for _ in range(3)]
    assert not all(np.isclose(singles, d, atol=1e-5).any() for d in differenced)
    dp_site = _hospital(tmp_path, "required = false", "required = true")
    reply = _send("query", dp_site, {}, model, **{keys.LOSS_SUBSET: 4})
    assert reply.error.reason == "site hospital-a: policy rule dp.required (refused)"


def test_a_new_federation_id_buys_no_new_loss_queries(tmp_path):
    """Issue #46 found 5: the query cap was counted per federation, so fed-2 started afresh."""
    node = _hospital(tmp_path, "max-queries = 100", "max-queries = 2")
    model = CXRClsTask.model_for_run(SIZES).state_dict()
    for _ in range(2):
        _metrics(_send("query", node, {}, model, **{keys.FEDERATION: "fed-1",
                                                    keys.LOSS_SUBSET: 4}))
    for federation in ("fed-1", "fed-2", "fed-3"):
        reply = _send("query", node, {}, model, **{keys.FEDERATION: federation,
                                                   keys.LOSS_SUBSET: 4})
        assert reply.error.reason == "site hospital-a: policy rule max-queries (refused)"


def test_an_evaluate_message_does_not_train_what_the_train_message_may_not(tmp_path):
    node = _hospital(tmp_path)  # evaluate-trains = false, min-batch-size 4
    attack = {"batch-size": 1, "personalisation.method": "finetune",
              "personalisation.finetune-steps": 20}
    model = CXRClsTask.model_for_run(SIZES).state_dict()
    refused = _send("train", node, attack, model)
    assert refused.error.reason == "site hospital-a: policy rule min-batch-size (refused)"
    reply = _send("evaluate", node, attack, model)
    metrics = _metrics(reply)
    assert keys.VAL_LOSS in metrics
    assert not any(name.startswith("personalised-") for name in metrics)
    assert reply.content[keys.SITE][keys.WITHHELD] == "evaluate-trains"
