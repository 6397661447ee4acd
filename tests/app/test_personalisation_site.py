"""Issue 16 at the ClientApp: a small radiograph site under FedBN and Per-FedAvg-Reptile.

FedBN's layers go to the site's state dir (keyed by federation), never into a
reply, and come back after a restart; evaluate replies carry the personalised
metrics beside the global ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from app import client_app
from clients.registry import task_class
from clients.site.site_round import SiteTasks
from clients.site.state_store import SiteStateStore
from clients.training.personalisation.local_layers import LOCAL_LAYERS, local_state_names
from clients.training.site_task import TaskSettings
from strategies.rounds.instructions import pack_arrays
from strategies.wire import message_keys as keys
from strategies.wire.update_codec import unpack_update
from tests.clients.small_sites import small_cxr_site

pytestmark = pytest.mark.usefixtures("site_identity")

SIZES = {"task": "cxr-cls", "image-size": 32, "batch-size": 4}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic radiograph site: 12 training and 4 validation images of 32 px."""
    return small_cxr_site(tmp_path_factory.mktemp("personal") / "hospital", 16, seed=1)


def _context(site: Path, run_config: dict) -> Context:
    node_config = {"data-path": str(site), "site-name": "hospital-a",
                   "state-dir": str(site.parent / "state"), "cache-decoded": False}
    return Context(run_id=42, node_id=7, node_config=node_config, state=RecordDict(),
                   run_config={**SIZES, **run_config})


def _message(kind: str, state: dict, **config) -> Message:
    record = ConfigRecord({keys.SERVER_ROUND: 1, **config})
    arrays = pack_arrays(ArrayRecord(state))
    return Message(RecordDict({keys.ARRAYS: arrays, keys.CONFIG: record}), dst_node_id=7,
                   message_type={"train": MessageType.TRAIN,
                                 "evaluate": MessageType.EVALUATE}[kind])


def _ok(reply: Message) -> Message:
    assert not reply.has_error(), reply.error
    return reply


@pytest.fixture()
def global_state(monkeypatch) -> dict:
    monkeypatch.setattr(client_app, "_TASKS", SiteTasks())
    return task_class("cxr-cls").model_for(TaskSettings(image_size=32, batch_size=4)).state_dict()


def test_fedbn_keeps_the_norm_layers_at_the_site(site: Path, global_state: dict):
    run_config = {"local-steps": 2, "personalisation.method": "fedbn"}
    train = _message("train", global_state, **{keys.FEDERATION: "fed-1", keys.LOCAL_STEPS: 2})
    reply = _ok(client_app.train(train, _context(site, run_config)))
    names = list(global_state)
    reference = [v.numpy() for v in global_state.values()]
    delta = unpack_update({k: a.numpy() for k, a in reply.content[keys.DELTA].items()},
                          reference, "none")
    local = set(local_state_names(task_class("cxr-cls").model_for(TaskSettings())))
    assert local and local < set(names)
    assert all(not np.any(d) for n, d in zip(names, delta) if n in local)
    assert any(np.any(d) for n, d in zip(names, delta) if n not in local)
    saved = SiteStateStore(site.parent / "state").load("fed-1", LOCAL_LAYERS)
    sent_before = np.concatenate([global_state[n].double().numpy().ravel()
                                  for n in names if n in local])
    assert saved.shape == sent_before.shape and not np.allclose(saved, sent_before)

    client_app._TASKS.clear()  # noqa: SLF001 - a restarted SuperNode: nothing in memory
    restarted = _context(site, run_config)
    evaluate = _message("evaluate", global_state, **{keys.FEDERATION: "fed-1"})
    metrics = dict(_ok(client_app.evaluate(evaluate, restarted)).content[keys.METRICS])
    global_keys = [k for k in metrics if k.startswith("val-") and k != keys.VAL_STUDIES]
    assert keys.VAL_LOSS in global_keys
    assert {f"personalised-{k}" for k in global_keys} == {
        k for k in metrics if k.startswith("personalised-")}
    assert metrics["personalised-val-loss"] != metrics[keys.VAL_LOSS]


def test_reptile_trains_its_tasks_and_reports_adapted_metrics(site: Path, global_state: dict):
    run_config = {"optimizer": "sgd", "momentum": 0.0, "lr": 0.05, "local-steps": 4,
                  "personalisation.method": "per-fedavg-reptile", "personalisation.tau-out": 2,
                  "personalisation.tau-in": 2, "personalisation.finetune-steps": 2}
    context = _context(site, run_config)
    train = _message("train", global_state, **{keys.LOCAL_STEPS: 4})
    metrics = _ok(client_app.train(train, context)).content[keys.METRICS]
    assert metrics[keys.STEPS] == 4 and metrics[keys.NUM_EXAMPLES] == 12
    evaluated = dict(_ok(client_app.evaluate(_message("evaluate", global_state),
                                             context)).content[keys.METRICS])
    assert "personalised-val-loss" in evaluated
    assert evaluated["personalised-val-loss"] != evaluated[keys.VAL_LOSS]
    assert not (site.parent / "state" / "run-42").exists()  # nothing kept for Reptile


def test_per_fedavg_fo_trains_its_steps(site: Path, global_state: dict):
    run_config = {"optimizer": "sgd", "local-steps": 3, "personalisation.method": "per-fedavg-fo"}
    train = _message("train", global_state, **{keys.LOCAL_STEPS: 3})
    metrics = _ok(client_app.train(train, _context(site, run_config))).content[keys.METRICS]
    assert metrics[keys.STEPS] == 3 and metrics[keys.NUM_EXAMPLES] == 12
