"""The stored ``bench/results/server_optimizers.json``: its settings still run, and the study
rebuilds it from its own runs (what ``--resume`` keeps).

``--resume`` replays each (set, method)'s stored trials and seeds with the method's keys; a
key the product retired would fail the replay. The ``fednova`` arm's
``fednova.server-momentum`` became ``server-opt.momentum`` with ``strategy.server-opt =
"avgm"`` (#45), renamed in the stored records.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

bench = importlib.import_module("server_optimizers")

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
        keys = {**bench.SGD, **bench.METHODS[name].keys, **json.loads(setting)}
        assert set(json.loads(setting)) - {"lr"} <= set(bench.METHODS[name].grid), name
        full_run_config(keys)


def test_the_stored_json_is_what_its_runs_summarise_to():
    payload = json.loads(RESULTS.read_text())
    rows = bench.rows_of(payload)
    assert len(rows) == sum(len(t["trials"]) for t in payload["tuning"]) + sum(
        r["seed"] != 0 for r in payload["per_seed"])  # each run once
    args = argparse.Namespace(tail=payload["protocol"]["tail"],
                              fraction=payload["protocol"]["fraction"])
    rebuilt = bench._summary(dict(payload), rows, args)
    assert list(rebuilt) == list(payload)
    for key in ("tuning", "per_seed", "runs", "goals"):
        assert rebuilt[key] == payload[key], key
    changed = [dict(r, test=[*r["test"][:-1], 0.0]) if r["method"] == "pooled" and "test" in r
               else r for r in rows]  # pooled's final metric 0: the goals change
    assert bench._summary(dict(payload), changed, args)["goals"] != payload["goals"]
