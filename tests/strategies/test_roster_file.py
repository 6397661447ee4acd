"""The roster file (``federation.roster``): checked in app/config, handed to the strategy."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config.roster import RosterError, load_roster
from app.config.run_config import RunConfig, RunConfigError
from strategies.wire.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "roster.example.toml"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "roster.toml"
    path.write_text(text)
    return path


def test_the_example_roster_parses():
    assert load_roster(EXAMPLE) == {"hospital-a": 1200, "hospital-b": 800}


@pytest.mark.parametrize(("text", "key"), [
    ("", "'sites' is missing or empty"),
    ("[sites]\n", "'sites' is missing or empty"),
    ("sites = 3\n", "'sites' is missing or empty"),
    ("owner = 'x'\n[sites.a]\nmax-examples = 1\n", "unknown top-level keys ['owner']"),
    ("[sites.a]\n", "key 'sites.a.max-examples' is missing"),
    ("[sites.a]\nmax-examples = 0\n", "key 'sites.a.max-examples' must be an integer >= 1"),
    ("[sites.a]\nmax-examples = 1.5\n", "key 'sites.a.max-examples' must be an integer >= 1"),
    ("[sites.a]\nmax-examples = true\n", "key 'sites.a.max-examples' must be an integer >= 1"),
    ("[sites.a]\nmax-example = 3\n", "unknown keys ['max-example'] in [sites.a]"),
    ("[sites]\na = 3\n", "'sites.a' must be a table"),
    ("[sites.a\n", "not valid TOML"),
])
def test_a_malformed_roster_names_the_file_and_the_key(tmp_path, text, key):
    path = _write(tmp_path, text)
    with pytest.raises(RosterError) as info:
        load_roster(path)
    assert str(path) in str(info.value)
    assert key in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_a_missing_roster_names_the_file_and_the_run_config_key(tmp_path):
    with pytest.raises(RosterError, match=r"roster .*nowhere\.toml \(run config "
                                          r"'federation.roster'\) cannot be read"):
        load_roster(tmp_path / "nowhere.toml")


def test_the_run_config_key_defaults_to_no_roster_and_must_be_absolute():
    assert RunConfig().federation_roster == ""
    assert RunConfig.from_mapping({"federation.roster": "/srv/roster.toml"}
                                  ).as_params()["federation.roster"] == "/srv/roster.toml"
    with pytest.raises(RunConfigError, match="run-config 'federation.roster' must be an "
                                             "absolute path"):
        RunConfig.from_mapping({"federation.roster": "roster.toml"})


def test_the_server_builds_its_strategy_with_the_roster_or_fails_at_start(tmp_path):
    from app.server_app import build_strategy  # noqa: PLC0415 - imports torch

    assert build_strategy(RunConfig()).sites.roster is None
    good = _write(tmp_path, "[sites.hospital-00]\nmax-examples = 40\n")
    strategy = build_strategy(RunConfig.from_mapping({"federation.roster": str(good)}))
    assert strategy.sites.roster == {"hospital-00": 40}
    with pytest.raises(RosterError, match="nowhere.toml"):
        build_strategy(RunConfig.from_mapping({"federation.roster":
                                               str(tmp_path / "nowhere.toml")}))
