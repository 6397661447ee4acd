"""The task registry: one line per task, cheap to ask, errors naming the key."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import textwrap

import pytest

from clients.registry import TASKS, shared_set, task_class
from strategies.wire.errors import ConfigError


def test_the_datagen_command_line_answers_without_numpy_or_torch():
    script = textwrap.dedent("""
        import sys
        from clients.datagen.__main__ import main
        assert main(["default-set", "pe-seg"]) == 0
        heavy = sorted(m for m in ("numpy", "torch", "monai", "flwr") if m in sys.modules)
        assert not heavy, heavy
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "ctpa"


def test_every_task_names_modules_that_exist_and_its_default_set_first():
    assert TASKS.names() == ["ct3d-cls", "cxr-cls", "pe-seg", "tabular-cls"]
    for name, entry in TASKS.entries().items():
        for module in (entry.task.partition(":")[0], entry.synthetic, entry.shared):
            assert importlib.util.find_spec(module) is not None, (name, module)
        assert entry.default_set(name) == entry.shared_sets[0]


def test_an_unknown_task_or_set_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError, match=r"run config key 'task' must be one of "
                                          r"\['ct3d-cls', 'cxr-cls', 'pe-seg', 'tabular-cls'\] "
                                          r"\(a task\), "
                                          r"got 'brain'"):
        task_class("brain")
    with pytest.raises(ConfigError, match="unknown set 'lidc' for task 'pe-seg'; expected one "
                                          "of ctpa, msd-lung"):
        shared_set("pe-seg", "lidc")


def test_a_task_without_a_shared_set_is_refused_naming_it_not_an_index_error():
    entry = dataclasses.replace(TASKS.get("cxr-cls"), shared_sets=())
    with pytest.raises(ConfigError, match=r"task 'toy' has no shared real set"):
        entry.default_set("toy")
