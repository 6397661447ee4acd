"""FedBN at the end of a federation (issue 16, items 2 and 3), at a small radiograph site.

The test-split evaluation names the federation, so a FedBN site reports its
personalised test metric; the cross-site fine-tuning (a train message one round
after the last) sends 0 for the layers and leaves the saved layers as they are,
so the site's personalised model stays the one its test metric was reported for.
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
from clients.training.personalisation.local_layers import LOCAL_LAYERS
from clients.training.site_task import TaskSettings
from strategies.rounds.instructions import pack_arrays
from strategies.wire import message_keys as keys
from tests.clients.small_sites import small_cxr_site

pytestmark = pytest.mark.usefixtures("site_identity")

RUN = {"task": "cxr-cls", "image-size": 32, "batch-size": 4, "local-steps": 2,
       "num-server-rounds": 2, "personalisation.method": "fedbn"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic radiograph site: 9 train, 3 val and 4 test images of 32 px."""
    return small_cxr_site(tmp_path_factory.mktemp("final") / "hospital", 12, seed=2, num_test=4)


def _context(site: Path) -> Context:
    node_config = {"data-path": str(site), "site-name": "hospital-a",
                   "state-dir": str(site.parent / "state"), "cache-decoded": False}
    return Context(run_id=42, node_id=7, node_config=node_config, state=RecordDict(),
                   run_config=dict(RUN))


def _message(kind: str, state: dict, server_round: int, **config) -> Message:
    record = ConfigRecord({keys.SERVER_ROUND: server_round, keys.FEDERATION: "fed-1", **config})
    return Message(RecordDict({keys.ARRAYS: pack_arrays(ArrayRecord(state)), keys.CONFIG: record}),
                   dst_node_id=7, message_type=kind)


def _ok(reply: Message) -> Message:
    assert not reply.has_error(), reply.error
    return reply


def test_fedbn_test_metric_and_layers_untouched_by_the_final_finetuning(site: Path, monkeypatch):
    monkeypatch.setattr(client_app, "_TASKS", SiteTasks())
    state = task_class("cxr-cls").model_for(TaskSettings(image_size=32, batch_size=4)).state_dict()
    store = SiteStateStore(site.parent / "state")
    _ok(client_app.train(_message(MessageType.TRAIN, state, 2), _context(site)))
    kept = store.load("fed-1", LOCAL_LAYERS)

    test = _message(MessageType.EVALUATE, state, 3, **{keys.EVAL_SPLIT: "test"})
    metrics = dict(_ok(client_app.evaluate(test, _context(site))).content[keys.METRICS])
    assert metrics[keys.NUM_EXAMPLES] == 4
    assert {"test-loss", "personalised-test-loss"} <= set(metrics)
    assert metrics["personalised-test-loss"] != metrics["test-loss"]

    finetune = _message(MessageType.TRAIN, state, 3, **{keys.LOCAL_STEPS: 2})
    _ok(client_app.train(finetune, _context(site)))
    np.testing.assert_array_equal(store.load("fed-1", LOCAL_LAYERS), kept)
