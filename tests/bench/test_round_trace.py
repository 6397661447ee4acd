"""bench/round_trace.py: one default round through the real ServerApp and ClientApp, traced;
the committed bench/results/round_trace.json must be the trace of this tree (issue 45)."""

from __future__ import annotations

import json

import round_trace

RESULT = round_trace.ROOT / "bench" / "results" / "round_trace.json"
REGENERATE = ".venv/bin/python bench/round_trace.py --json bench/results/round_trace.json"


def _changes(now: dict, committed: dict) -> list[str]:
    lines = []
    for side in ("round", "server", "site"):
        was, new = committed.get(side, {}), now[side]
        if any(was.get(key) != new[key] for key in round_trace.COMPARED):
            lines.append(f"{side}: {was.get('files')} files / {was.get('hops')} hops committed, "
                         f"{new['files']} / {new['hops']} now")
            for key in ("file_list", "hop_list"):
                added = sorted(set(new[key]) - set(was.get(key, [])))
                gone = sorted(set(was.get(key, [])) - set(new[key]))
                lines += [f"  + {item}" for item in added] + [f"  - {item}" for item in gone]
    if committed.get("off_feature_files") != now["off_feature_files"]:
        lines.append(f"off_feature_files: {committed.get('off_feature_files')} committed, "
                     f"{now['off_feature_files']} now")
    for key in ("goal_files", "goal_met"):
        if committed.get(key) != now[key]:
            lines.append(f"{key}: {committed.get(key)} committed, {now[key]} now")
    return lines


def test_the_committed_round_trace_is_this_trees(mlflow_store, tmp_path):
    result = round_trace.measure(mlflow_store(tmp_path / "mlflow"))
    # the traced round is the whole round: both apps, tracking and checkpoint
    files = result["round"]["file_list"]
    for path in ("app/server_app.py", "app/client_app.py", "app/tracking/tracker.py",
                 "app/tracking/outbox.py", "strategies/rounds/checkpoint.py"):
        assert path in files, path
    assert result["round"]["files"] == len(files)
    assert set(files) == set(result["server"]["file_list"]) | set(result["site"]["file_list"])
    assert "app/client_app.py" in result["site"]["file_list"]
    for feature, paths in result["off_feature_files"].items():
        assert paths and set(paths) <= set(files), feature
    assert result["goal_files"] == round_trace.GOAL_FILES
    committed = json.loads(RESULT.read_text())
    changes = _changes(result, committed)
    assert not changes, ("bench/results/round_trace.json is stale (not the trace of this tree); "
                         f"regenerate it with\n  {REGENERATE}\n" + "\n".join(changes))
