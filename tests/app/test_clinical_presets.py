"""The clinical presets (issue 49) load as run configs and build the network their header states."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from app.config.run_config import RunConfig
from clients.registry import task_class

ROOT = Path(__file__).resolve().parents[2]
#: Preset -> (task, image size, volume depth or None, parameters of its network).
CLINICAL = {
    "pe-seg-clinical.toml": ("pe-seg", 512, None, 25_978_844),
    "cxr-cls-clinical.toml": ("cxr-cls", 224, None, 6_948_609),
    "cxr-cls-clinical-512.toml": ("cxr-cls", 512, None, 6_948_609),
    "ct3d-cls-clinical.toml": ("ct3d-cls", 128, 64, 896_225),
}


def _load(name: str) -> tuple[RunConfig, str]:
    text = (ROOT / "configs" / name).read_text()
    return RunConfig.from_mapping(tomllib.loads(text)), text


@pytest.mark.parametrize("name", sorted(CLINICAL))
def test_clinical_preset_builds_its_stated_network(name: str) -> None:
    task, size, depth, params = CLINICAL[name]
    config, text = _load(name)
    settings = config.task_settings()
    assert (config.task, settings.image_size) == (task, size)
    if depth is not None:
        assert settings.volume_depth >= depth
    model = task_class(task).model_for(settings)
    assert sum(p.numel() for p in model.parameters()) == params
    stated = re.search(r"([\d,]+) parameters, measured", text)
    assert stated is not None and int(stated.group(1).replace(",", "")) == params
    assert "seconds per step" in text and "bench/gpu.py" in text


def test_cxr_presets_train_densenet121() -> None:
    for name in ("cxr-cls-clinical.toml", "cxr-cls-clinical-512.toml"):
        assert _load(name)[0].task_settings().model_size == "full"
