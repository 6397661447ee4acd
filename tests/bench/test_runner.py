"""``bench/runner.py`` without the engine: the order of the runs, the baseline rule, resume.

A toy study whose runs are recorded instead of run (:func:`runner.run_arm` replaced):
every (set, seed, arm) runs once, the baseline first; ``--resume`` keeps the stored runs
whose run config is the one the runner builds now and runs (and replaces) the others; an
arm whose baseline did not run is listed as missing.
"""

from __future__ import annotations

import json

import pytest

import runner
from runner import Arm, Federation, Option

STUDY = runner.Study(
    name="toy", doc="A toy study.\n\nMore.", output=None, sets=("a", "b"),
    federation=lambda name, args: Federation(name, "m", (), {"task": name}),
    arms=lambda args, index: [Arm("base", {}), Arm("knob", {"knob": args.knob})],
    schedule=lambda args, base: {"num-server-rounds": args.rounds},
    fields=lambda outcome, run, workdir: {},
    summary=lambda meta, rows, missing, args: {"meta": meta, "rows": rows, "missing": missing},
    table=lambda payload: f"{len(payload['rows'])} rows", rows_of=lambda p: p["rows"],
    arm_key="arm", experiment="bench-toy", baseline="base",
    options=(Option("--knob", {"type": int, "default": 1}),
             Option("--rounds", {"type": int, "default": 2})))


@pytest.fixture()
def runs(monkeypatch) -> list[tuple]:
    """The (set, seed, arm) of each run, in order; the rows record their run config."""
    ran: list[tuple] = []

    def fake(study, federation, arm, seed, schedule, workdir):
        ran.append((federation.name, seed, arm.name))
        return {"set": federation.name, "seed": seed, "arm": arm.name, "rounds": 2,
                "seconds": 0.0, "curve": [0.5],
                "run_config": runner.run_config(study, federation, arm, seed, schedule)}

    monkeypatch.setattr(runner, "run_arm", fake)
    monkeypatch.setattr(runner, "check_arms", lambda study, args, federations: None)
    return ran


def _main(tmp_path, *argv: str) -> dict:
    out = tmp_path / "toy.json"
    assert runner.main(STUDY, [*argv, "--output", str(out), "--workdir", str(tmp_path)]) == 0
    return json.loads(out.read_text())


def test_every_set_seed_and_arm_runs_once_the_baseline_first(tmp_path, runs):
    payload = _main(tmp_path, "--seeds", "0", "1")
    assert runs == [(s, seed, a) for seed in (0, 1) for s in ("a", "b") for a in ("base", "knob")]
    knob = next(r for r in payload["rows"] if (r["set"], r["arm"]) == ("b", "knob"))
    assert knob["run_config"] == {"task": "b", "knob": 1, "seed": 0, "num-server-rounds": 2,
                                  "experiment": "bench-toy-b"}
    assert payload["meta"]["sets"] == {"a": {"task": "a"}, "b": {"task": "b"}}


def test_resume_keeps_the_runs_of_the_same_config_and_replaces_the_others(tmp_path, runs):
    _main(tmp_path, "--sets", "a")
    runs.clear()
    again = _main(tmp_path, "--sets", "a", "--resume")
    assert runs == [] and len(again["rows"]) == 2 and len(again["meta"]["commands"]) == 2
    changed = _main(tmp_path, "--sets", "a", "--knob", "3", "--resume")
    assert runs == [("a", 0, "knob")]  # only the arm whose run config changed
    assert [(r["arm"], r["run_config"].get("knob")) for r in changed["rows"]] == [
        ("base", None), ("knob", 3)]
    fresh = _main(tmp_path, "--sets", "a")  # without --resume: everything again
    assert len(fresh["rows"]) == 2 and len(fresh["meta"]["commands"]) == 1


def test_an_arm_without_its_baseline_is_missing(tmp_path, runs):
    payload = _main(tmp_path, "--sets", "a", "--budget-seconds", "-1")
    assert runs == [] and payload["missing"] == ["a seed 0 base", "a seed 0 knob"]
