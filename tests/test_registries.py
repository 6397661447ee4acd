"""The name tables are Registries (#45): each lists its names, and an unknown name is refused
naming the key that chose it, through the project's exception root."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

from clients.registry import TASKS
from clients.training.augmentation_levels import AUGMENTATIONS
from clients.training.lr_schedule import LR_SCHEDULES
from clients.training.task_settings import OPTIMIZERS
from strategies.downlink import DOWNLINK_CODECS, DownlinkCodecError
from strategies.plugins.pruning.prunefl import REPORT_CODECS
from strategies.robust import ROBUST_RULES
from strategies.wire.codecs.errors import CodecError
from strategies.wire.codecs.registry import CODECS
from strategies.wire.errors import ConfigError, FedMedError
from strategies.wire.plugin_options import PluginError
from strategies.wire.registry import Registry
from strategies.wire.secure_aggregation.errors import SecAggConfigError
from strategies.wire.secure_aggregation.vector import SUMMABLE_CODECS

#: (registry, its names, the key an unknown name is refused with, the error branch).
TABLES = [
    (OPTIMIZERS, ["adam", "sgd"], "optimizer", ConfigError),
    (LR_SCHEDULES, ["constant", "cosine"], "lr-schedule", ConfigError),
    (AUGMENTATIONS, ["light", "none", "strong"], "augmentation", ConfigError),
    (DOWNLINK_CODECS, ["fp16", "none", "topk"], "strategy.downlink-codec", DownlinkCodecError),
    (REPORT_CODECS, ["fp16", "none", "topk"], "pruning.report-codec", PluginError),
    (ROBUST_RULES, ["median", "trimmed-mean"], "best-round.aggregate", ConfigError),
    (SUMMABLE_CODECS, ["fp16", "none", "randk"], "strategy.codec", SecAggConfigError),
]


@pytest.mark.parametrize(("registry", "names", "key", "error"), TABLES,
                         ids=[key for _, _, key, _ in TABLES])
def test_each_table_is_a_registry_refusing_an_unknown_name_naming_its_key(
        registry: Registry, names: list[str], key: str, error: type[FedMedError]) -> None:
    assert isinstance(registry, Registry)
    assert registry.names() == names
    with pytest.raises(error, match=rf"run config key '{key}' must be one of .*got 'bogus'"):
        registry.get("bogus")


def test_each_task_s_shared_sets_are_a_registry_of_the_sets_its_task_entry_lists() -> None:
    for task, entry in TASKS.entries().items():
        sets = importlib.import_module(entry.shared).SETS
        assert isinstance(sets, Registry)
        assert sets.names() == sorted(entry.shared_sets), task
        assert all(sets.get(name).task == task for name in sets), task
        with pytest.raises(ConfigError, match=r"run config key 'set' must be one of .*"
                                              rf"\(a shared set of task '{task}'\), got 'bogus'"):
            sets.get("bogus")


@pytest.mark.parametrize("subset", [DOWNLINK_CODECS, REPORT_CODECS, SUMMABLE_CODECS],
                         ids=["downlink", "report", "summable"])
def test_a_codec_subset_names_the_codecs_of_the_codec_registry(subset: Registry) -> None:
    for name in subset:
        assert subset.get(name) is CODECS.get(name)
    assert issubclass(CodecError, ConfigError)


def test_the_optimizers_are_listed_without_torch_and_built_by_name() -> None:
    script = textwrap.dedent("""
        import sys
        from clients.training.task_settings import OPTIMIZERS
        assert "sgd" in OPTIMIZERS and OPTIMIZERS.names() == ["adam", "sgd"]
        assert "torch" not in sys.modules
    """)
    subprocess.run([sys.executable, "-c", script], check=True)
    import torch  # noqa: PLC0415 - the factories are torch's optimisers

    param = torch.zeros(1, requires_grad=True)
    assert isinstance(OPTIMIZERS.get("sgd")([param], 0.1, 0.9), torch.optim.SGD)
    adam = OPTIMIZERS.get("adam")([param], 0.1, 0.8)
    assert isinstance(adam, torch.optim.Adam) and adam.defaults["betas"] == (0.8, 0.999)


def test_augmentation_none_applies_no_transform_and_the_others_do() -> None:
    assert [name for name, level in AUGMENTATIONS.entries().items() if not level.applies] == [
        "none"]
