"""The stored settings of ``bench/results/server_optimizers.json`` still run (``--extend``).

``--extend`` replays each (set, method)'s tuned setting with the method's keys
(:func:`server_optimizers._earlier`); a key the product retired would fail the replay. The
``fednova`` arm's ``fednova.server-momentum`` became ``server-opt.momentum`` with
``strategy.server-opt = "avgm"`` (#45), renamed in the stored records.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

methods = importlib.import_module("server_optimizer_methods")

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "server_optimizers.json"


def _settings(payload: dict) -> set[tuple[str, str]]:
    """Every (method, setting as JSON) the file holds: the tuned choices, trials and seeds."""
    found = {(t["method"], json.dumps(t["chosen"], sort_keys=True)) for t in payload["tuning"]}
    found |= {(t["method"], json.dumps(trial["setting"], sort_keys=True))
              for t in payload["tuning"] for trial in t["trials"]}
    return found | {(r["method"], json.dumps(r["setting"], sort_keys=True))
                    for r in payload["per_seed"]}


def test_every_stored_setting_is_a_run_config_of_its_method():
    from app.engine import full_run_config  # noqa: PLC0415 - the engine loads Flower

    stored = _settings(json.loads(RESULTS.read_text()))
    assert any(name == "fednova" for name, _ in stored)
    for name, setting in sorted(stored):
        keys = {"optimizer": "sgd", "momentum": 0.0, **methods.METHODS[name].keys,
                **json.loads(setting)}
        assert set(json.loads(setting)) - {"lr"} <= set(methods.METHODS[name].grid), name
        full_run_config(keys)
