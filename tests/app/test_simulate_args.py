"""The launcher's run-config string: absolute paths, preset file, then overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.tooling.run_config_string import build_run_config


def _parse(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(" "))


def test_paths_are_absolute_and_quoted(tmp_path: Path):
    config = _parse(build_run_config([], Path("rel/data"), "sqlite:///x.db", tmp_path))
    assert config["data-root"] == f'"{(Path.cwd() / "rel/data").resolve()}"'
    assert config["tracking-uri"] == '"sqlite:///x.db"'


def test_overrides_win_over_the_preset(tmp_path: Path):
    preset = tmp_path / "p.toml"
    preset.write_text('num-server-rounds = 2\noptimizer = "sgd"\nlr = 0.5\n')
    config = _parse(build_run_config(["lr=0.1", "optimizer=adam"], tmp_path, "", tmp_path,
                                     preset))
    assert config["num-server-rounds"] == "2"
    assert config["lr"] == "0.1"
    assert config["optimizer"] == '"adam"'


def test_override_needs_key_and_value(tmp_path: Path):
    with pytest.raises(SystemExit, match="key=value"):
        build_run_config(["lr"], tmp_path, "", tmp_path)
