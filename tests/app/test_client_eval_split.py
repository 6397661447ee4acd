"""The ClientApp's evaluation on a split, and test-only sites (issue 15).

Found: a site evaluated only its ``val`` split whatever the instruction said, and a
site folder holding only test data could not be loaded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from app import client_app
from clients.cxr_cls import manifest as cxr_manifest
from clients.manifests.csv_rows import EVAL_SPLITS
from clients.site.site_round import SiteTasks
from clients.training.trainer import select_device
from clients.training.site_task import EvalResult
from strategies.rounds.instructions import pack_arrays
from strategies.wire import message_keys as keys
from tests.app.site_messages import instruction
from tests.clients.small_sites import small_cxr_site

pytestmark = pytest.mark.usefixtures("site_identity")


def _context(site: Path, policy: Path | None = None, run_config: dict | None = None) -> Context:
    node_config = {"data-path": str(site), "site-name": "hospital-a",
                   "state-dir": str(site.parent / "state")}
    if policy is not None:
        node_config["policy-path"] = str(policy)
    return Context(run_id=42, node_id=7, node_config=node_config, state=RecordDict(),
                   run_config=run_config or {})


class _SplitTask:
    """A site task with ``counts[split]`` studies per evaluation split (10 examples each)."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def build_model(self, private: bool = False):
        return SimpleNamespace(load_state_dict=lambda state: None)

    def evaluate(self, model, compute, split="val"):
        n = self.counts[split]
        if not n:
            return EvalResult(num_examples=0, loss=float("nan"))
        return EvalResult(num_examples=10 * n, loss=0.5 if split == "test" else 0.25,
                          metrics={"dice": 0.75}, num_studies=n)


@pytest.fixture()
def fake_site(monkeypatch) -> list[str]:
    """Replace the site's data by :class:`_SplitTask`; returns the record of loads."""
    loads: list[str] = []

    def load(task_class, data_path, *args, **kwargs):
        loads.append(str(data_path))
        return _SplitTask({"val": 3, "test": 2})

    monkeypatch.setattr(client_app, "_TASKS", SiteTasks(load, select_device("cpu")))
    return loads


def _metrics(reply: Message) -> dict:
    assert not reply.has_error(), reply.error
    return dict(reply.content[keys.METRICS])


def test_the_test_split_is_evaluated_when_asked(tmp_path: Path, fake_site) -> None:
    test = _metrics(client_app.evaluate(instruction("evaluate", **{keys.EVAL_SPLIT: "test"}),
                                        _context(tmp_path)))
    assert test == {keys.NUM_EXAMPLES: 20, keys.TEST_STUDIES: 2, keys.TEST_LOSS: 0.5,
                    "test-dice": 0.75}
    val = _metrics(client_app.evaluate(instruction("evaluate"), _context(tmp_path)))
    assert val == {keys.NUM_EXAMPLES: 30, keys.VAL_STUDIES: 3, keys.VAL_LOSS: 0.25,
                   "val-dice": 0.75}


def test_min_val_items_covers_the_test_split(tmp_path: Path, fake_site) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("min-val-items = 3\n")
    reply = client_app.evaluate(instruction("evaluate", **{keys.EVAL_SPLIT: "test"}),
                                _context(tmp_path, policy))
    assert _metrics(reply) == {keys.NUM_EXAMPLES: 20, keys.TEST_STUDIES: 2}


def test_an_unknown_split_is_refused_before_any_data_is_read(tmp_path: Path, fake_site) -> None:
    reply = client_app.evaluate(instruction("evaluate", **{keys.EVAL_SPLIT: "train"}),
                                _context(tmp_path))
    assert reply.has_error() and reply.error.code == 4002 and "ConfigError" in reply.error.reason
    assert fake_site == []
    assert keys.EVAL_SPLITS == EVAL_SPLITS  # the message contract and the sites' splits agree


@pytest.fixture(scope="module")
def test_only_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic radiograph site whose 8 images are all in split ``test``."""
    site = small_cxr_site(tmp_path_factory.mktemp("test-only") / "hospital", 8, seed=1)
    rows = cxr_manifest.read_manifest(site)
    cxr_manifest.write_manifest(site, [dataclasses.replace(r, split="test") for r in rows])
    return site


def test_a_test_only_site_evaluates_and_refuses_train_and_query(test_only_site: Path,
                                                                monkeypatch) -> None:
    monkeypatch.setattr(client_app, "_TASKS", SiteTasks())
    run_config = {"task": "cxr-cls", "image-size": 32, "batch-size": 4}
    context = _context(test_only_site, run_config=run_config)
    for kind in ("train", "query"):
        reply = getattr(client_app, kind)(instruction(kind), context)
        assert reply.has_error() and reply.error.code == 4001
        assert reply.error.reason == "site hospital-a: SiteDataError (details in the site's log)"
    task = client_app._TASKS.loaded()[0]  # noqa: SLF001 - the loaded site task
    arrays = pack_arrays(ArrayRecord(task.build_model().state_dict()))
    message = Message(RecordDict({keys.ARRAYS: arrays, keys.CONFIG: ConfigRecord(
        {keys.SERVER_ROUND: 1, keys.EVAL_SPLIT: "test"})}), dst_node_id=7,
        message_type=MessageType.EVALUATE)
    test = _metrics(client_app.evaluate(message, context))
    assert test[keys.NUM_EXAMPLES] == test[keys.TEST_STUDIES] == 8 and keys.TEST_LOSS in test
    message = Message(RecordDict({keys.ARRAYS: arrays, keys.CONFIG: ConfigRecord(
        {keys.SERVER_ROUND: 1})}), dst_node_id=7, message_type=MessageType.EVALUATE)
    assert _metrics(client_app.evaluate(message, context)) == {keys.NUM_EXAMPLES: 0,
                                                               keys.VAL_STUDIES: 0}
