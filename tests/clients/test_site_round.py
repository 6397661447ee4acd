"""The site's round without Flower: instruction in, policy checked, work done, numpy out."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.site.instruction import Instruction
from clients.site.policy import PolicyRefusal, SitePolicy
from clients.site.site_round import SiteTasks, answer
from clients.training.trainer import select_device
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from strategies.wire.model_layout import pack_model, unpack_model
from strategies.wire.update_codec import unpack_update
from strategies.wire.model_layout import PAYLOAD_KEY
from tests.clients.site_round_fixtures import TinyCxr, packed_global, run_settings, site

CPU = select_device("cpu")


@pytest.fixture()
def loads() -> list[Path]:
    """The data folders the site's tasks were loaded from."""
    return []


@pytest.fixture()
def tasks(loads) -> SiteTasks:
    def load(task_class, data_path, *args, **kwargs):
        loads.append(data_path)
        return TinyCxr()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield SiteTasks(load, CPU)
    torch.set_num_threads(threads)


def _instruction(kind: str, **config) -> Instruction:
    return Instruction.parse(kind, {keys.SERVER_ROUND: 1, **config}, run_settings(), "run-1")


def test_train_replies_the_update_x_global_minus_x_local(tmp_path, tasks):
    arrays = packed_global()
    train = _instruction("train", **{keys.LOCAL_STEPS: 20})
    reply = answer(train, arrays, site(tmp_path), run_settings(), tasks)
    assert reply.site == {keys.SITE_NAME: "hospital-a",
                          keys.SITE_POLICY: SitePolicy.permissive().fingerprint}
    assert reply.metrics[keys.STEPS] == 20 and reply.metrics[keys.NUM_EXAMPLES] == 12
    assert PAYLOAD_KEY in reply.update
    global_arrays = unpack_model(arrays)
    delta = unpack_update(reply.update, list(global_arrays.values()), "none")
    local = {name: g - d for (name, g), d in zip(global_arrays.items(), delta)}
    query = _instruction("query")
    before = answer(query, arrays, site(tmp_path), run_settings(), tasks).metrics
    after = answer(query, pack_model(local), site(tmp_path), run_settings(), tasks).metrics
    assert after[keys.QUERY_LOSS] < before[keys.QUERY_LOSS]  # the local model fits the site
    assert before[keys.NUM_EXAMPLES] == 12


def test_the_site_caps_the_steps_and_the_task_loads_once(tmp_path, tasks, loads):
    capped = site(tmp_path, local_steps_cap=2)
    for _ in range(2):
        reply = answer(_instruction("train"), packed_global(), capped, run_settings(), tasks)
        assert reply.metrics[keys.STEPS] == 2
    assert loads == [capped.data_path]


def test_evaluate_releases_metrics_only_from_enough_studies(tmp_path, tasks):
    evaluate = _instruction("evaluate")
    metrics = answer(evaluate, packed_global(), site(tmp_path), run_settings(), tasks).metrics
    assert metrics[keys.NUM_EXAMPLES] == 4 and keys.VAL_LOSS in metrics
    assert all(isinstance(v, (int, float)) for v in metrics.values())
    strict = site(tmp_path, dataclasses.replace(SitePolicy.permissive(), min_val_items=5))
    counts = answer(evaluate, packed_global(), strict, run_settings(), tasks).metrics
    assert counts == {keys.NUM_EXAMPLES: 4, keys.VAL_STUDIES: metrics[keys.VAL_STUDIES]}


@pytest.mark.parametrize("kind, policy, rule", [
    ("query", {"answer_queries": False}, "answer-queries"),
    ("evaluate", {"allowed_tasks": ("pe-seg",)}, "allowed-tasks"),
    ("train", {"max_local_steps": 2}, "max-local-steps"),
])
def test_every_kind_is_checked_before_any_data_is_read(tmp_path, tasks, loads, kind, policy,
                                                       rule):
    strict = site(tmp_path, dataclasses.replace(SitePolicy.permissive(), **policy))
    with pytest.raises(PolicyRefusal) as refusal:
        answer(_instruction(kind), packed_global(), strict, run_settings(), tasks)
    assert refusal.value.rule == rule and loads == []


def test_a_malformed_instruction_is_refused_naming_its_key():
    with pytest.raises(ConfigError, match="'eval-split' = 'train'"):
        _instruction("evaluate", **{keys.EVAL_SPLIT: "train"})
    with pytest.raises(ConfigError, match="'server-round' is missing"):
        Instruction.parse("train", {}, run_settings(), "run-1")
    parsed = Instruction.parse("evaluate", {}, run_settings(local_steps=7), "run-9")
    assert (parsed.server_round, parsed.local_steps, parsed.federation) == (0, 7, "run-9")


def test_the_site_side_imports_no_flower():
    code = "\n".join([
        "import sys",
        "import clients.site.site_round",
        "from clients.training.personalisation.site_personalisation import SITE_PERSONALISATION",
        "SITE_PERSONALISATION.entries()  # every method's module",
        "sys.exit(int(any(m == 'flwr' or m.startswith('flwr.') for m in sys.modules)))"])
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2],
                          check=False).returncode == 0
