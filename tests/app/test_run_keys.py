"""The one table of the run config's flat keys: pyproject.toml's keys and defaults, both views.

Every flat key of ``[tool.flwr.app.config]`` is a row of :data:`strategies.wire.run_keys.RUN_KEYS`
with pyproject's default (or belongs to a plug-in section); the server's
:class:`RunConfig` declares every row, the site's :class:`SiteRunSettings` the site's rows,
each field typed as its row.
"""

from __future__ import annotations

import tomllib
from dataclasses import Field, fields
from pathlib import Path

import pytest

from app.config.run_config import CARRIED_KEYS, RunConfig
from clients.site.instruction import SiteRunSettings
from clients.training.private_training import DpSettings
from clients.training.task_settings import SITE_CHOICES, TaskSettings
from strategies.plugins.registries import default_sections
from strategies.wire.errors import ConfigError
from strategies.wire.personalisation_options import SECTION as PERSONALISATION
from strategies.wire.run_keys import RUN_KEYS, Range, check, site_keys
from strategies.wire.vertical_options import SECTION as VERTICAL

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _flatten(table: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


PYPROJECT_KEYS = _flatten(tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"])
SECTIONS = {*default_sections(), PERSONALISATION, VERTICAL}


def _keyed(*kinds: type) -> dict[str, Field]:
    """Run-config key -> the field declaring it, over ``kinds``."""
    return {f.metadata["key"]: f for kind in kinds for f in fields(kind) if "key" in f.metadata}


def test_every_flat_pyproject_key_is_a_row_with_its_default() -> None:
    flat = {key: value for key, value in PYPROJECT_KEYS.items()
            if key.split(".")[0] not in SECTIONS}
    assert sorted(flat) == sorted(RUN_KEYS)
    for key, value in flat.items():
        assert (type(value), value) == (RUN_KEYS[key].kind, RUN_KEYS[key].default), key


def test_the_plugin_sections_are_no_rows() -> None:
    assert not [key for key in RUN_KEYS if key.split(".")[0] in SECTIONS]


def test_the_servers_view_declares_every_row_typed_as_the_row() -> None:
    declared = _keyed(RunConfig, TaskSettings)
    assert sorted([*declared, *CARRIED_KEYS]) == sorted(RUN_KEYS)
    for key, f in declared.items():
        assert f.type == RUN_KEYS[key].kind.__name__, key


def test_the_sites_view_declares_the_site_rows() -> None:
    declared = _keyed(SiteRunSettings, TaskSettings, DpSettings)
    assert sorted([*declared, *CARRIED_KEYS]) == sorted(site_keys())
    for key, f in declared.items():
        assert f.type == RUN_KEYS[key].kind.__name__, key


def test_the_sites_registries_are_rows_naming_a_registry_of_clients() -> None:
    for key in SITE_CHOICES:
        assert RUN_KEYS[key].registry.startswith("clients."), key
        assert RUN_KEYS[key].side != "server", key


@pytest.mark.parametrize(("rule", "value", "problem"), [
    (Range(0, open_low=True), 0, "must be > 0"),
    (Range(0, note="(0 = off)"), -1, "must be >= 0 (0 = off)"),
    (Range(0, 1, open_high=True), 1.0, "must be in [0, 1)"),
    (Range(0, 1, open_low=True, open_high=True), 0.0, "must be in (0, 1)"),
    (Range(1, off=True), 0.5, "must be 0 (off) or >= 1"),
    (Range(1, odd=True), 4, "must be odd and >= 1"),
    (Range(0, open_low=True, multiple=8), 60, "must be a multiple of 8"),
    (Range(1, off=True), 0, None),
    (Range(0, 1), 1.0, None),
])
def test_a_range_names_the_rule_broken(rule: Range, value: float, problem: str | None) -> None:
    assert rule.problem(value) == problem


def test_check_names_the_key_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"'model-size' must be one of \['small', 'full'\]"):
        check("model-size", "huge")
    with pytest.raises(ConfigError, match=r"'optimizer' must be one of \['sgd'\], got 'adam'"):
        check("optimizer", "adam", ("sgd",))
    check("optimizer", "anything")  # a registry's names are its owner's to hand over
