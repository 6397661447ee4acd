"""Which of the repository's files one default round goes through, and the hops between them.

Runs the product's whole federation on the in-process engine
(:func:`app.engine.run_federation`: the real ServerApp's :func:`~app.server_app.federate`,
which builds the default strategy from pyproject.toml's run config (FedAvg behind
norm-bound with ``kappa``, fixed tau, uniform selection, codec ``none``), the MLflow
tracker and its outbox, and the per-round checkpoint, against three small synthetic
pe-seg hospitals answered by the product's real ClientApp). Round 1 runs untraced
(it imports torch, MONAI and MLflow, opens the store and loads each site's
studies); round 2, from the end of round 1's round observer
(:class:`app.server_app.RoundRecorder`) to the end of round 2's (train and
evaluate exchanges, the round's MLflow record queued in the outbox, the server
checkpoint written, the outbox flushed), runs under :func:`sys.setprofile`. The
run then stops (the end of the federation, the cross-site evaluation and the
models' logging are not part of a round). Every Python call whose code lies in
this repository (not in ``.venv``, not this script) is attributed to its file; a
*hop* is a call from one repository file into another (the caller is the nearest
repository frame up the stack). It reports, for the whole round, for the server
(the ServerApp, its strategy, tracking, checkpoint and the engine's grid) and
for the sites (what runs under the ClientApp):

* ``files``: the distinct repository files entered;
* ``hops``: the distinct (caller file, callee file) pairs;
* ``calls``: the calls that crossed a file boundary, counted each time (it varies
  from run to run: the exchanges poll the grid; not compared by the staleness test);
* ``off_feature_files``: the round's files that belong to a feature the run has off
  (:data:`FEATURES`, each with the run-config test that says it is off);
* ``goal_files`` / ``goal_met``: issue 45's goal, at most that many files in a round.

Run: ``.venv/bin/python bench/round_trace.py --json bench/results/round_trace.json``
(about 30 s on two cores). ``tests/bench/test_round_trace.py`` runs the same
trace and fails when the committed JSON no longer matches the tree.
``bench/results/round_trace_94d096a.json`` is the strategy-only trace (the
previous version of this script: ``FederatedStrategy.start`` on the engine, no
ServerApp, tracking or checkpoint) of the tree at commit 94d096a, before issue
27's round loop.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import app.server_app as server_app
from app.engine import full_run_config, partition_sites, run_federation
from clients.pe_seg.manifest import read_manifest, write_manifest
from clients.pe_seg.synthetic import generate_federation
from clients.registry import task_class
from app.config.run_config import RunConfig

#: The tree traced: the one this script lies in (the project is installed editable;
#: ``PYTHONPATH=<tree>`` traces another checkout, the script copied into it).
ROOT = Path(__file__).resolve().parents[1]

SITES = 3
#: The round traced (round 1 before it imports and loads; no later round runs).
TRACED_ROUND = 2
#: Issue 45's goal: one default round through at most this many files.
GOAL_FILES = 35
#: Overrides of pyproject.toml's run config: small and short, every feature as by default.
RUN_OVERRIDES: dict[str, Any] = {
    "num-server-rounds": TRACED_ROUND + 1,  # round 2 is not the last round
    "min-nodes": SITES, "local-steps": 2, "batch-size": 2, "image-size": 32,
    "node-wait-timeout": 30.0, "experiment": "round-trace",
}


@dataclass(frozen=True)
class Feature:
    """A feature of the product, its files (``fnmatch`` patterns of repository paths) and
    the test that says it is off in a run (``off(run_config, global_model_keys)``)."""

    name: str
    patterns: tuple[str, ...]
    off: Callable[[Mapping[str, Any], list[str]], bool]

    def owns(self, path: str) -> bool:
        return any(fnmatch(path, pattern) for pattern in self.patterns)


def _statistics(keys: list[str]) -> bool:
    return any(k.rsplit(".", 1)[-1] in ("running_mean", "running_var", "num_batches_tracked")
               for k in keys)


#: The features a default round should not touch when they are off (issue 45: "no file of
#: a feature that is off"). A feature's ``none`` plug-in is one of its files: the round
#: still crosses into it.
FEATURES: tuple[Feature, ...] = (
    Feature("control variates (SCAFFOLD)",
            ("*scaffold*", "*control_variate*"),
            lambda run, _: run["strategy.control-variates"] == "none"),
    Feature("personalisation",
            ("*personalis*", "*fedbn*", "*per_fedavg*", "*reptile*", "*site_adaptation*"),
            lambda run, _: run["personalisation.method"] == "none"),
    Feature("differential privacy",
            ("*privacy*", "*private*", "*dp_*", "*opacus*", "*grad_sampler*"),
            lambda run, _: float(run["privacy.noise-multiplier"]) == 0),
    Feature("lr schedule",
            ("*lr_schedule*",),
            lambda run, _: run["lr-schedule"] == "constant"),
    Feature("codec rate",
            ("*codec_rate*",),
            lambda run, _: run["strategy.codec-rate"] == "fixed"),
    Feature("uplink codec",
            ("strategies/wire/codecs/*", "strategies/compression.py",
             "strategies/wire/update_codec.py"),
            lambda run, _: run["strategy.codec"] == "none"),
    Feature("server optimizer",
            ("*server_opt*",),
            lambda run, _: (run["strategy.server-opt"] == "sgd"
                            and float(run["server-opt.eta"]) in (0.0, 1.0))),
    Feature("normalisation statistics",
            ("*normalisation_statistics*",),
            lambda _, keys: not _statistics(keys)),
    Feature("pruning",
            ("*prun*", "*model_sparsity*"),
            lambda run, _: run["strategy.pruning"] == "none"),
    Feature("downlink codec",
            ("strategies/downlink*", "strategies/wire/downlink*", "clients/site/last_global.py"),
            lambda run, _: run["strategy.downlink-codec"] == "none"),
    Feature("secure aggregation",
            ("*secure*", "*secagg*"),
            lambda run, _: run["strategy.secure-aggregation"] == "none"),
)


class FileTrace:
    """A :func:`sys.setprofile` hook that counts calls between repository files, per side.

    A call belongs to the *site* when the ClientApp (``app/client_app.py``) is on the
    stack, else to the *server*.
    """

    def __init__(self, root: Path, skip: Path) -> None:
        self.root, self.skip = str(root), str(skip)
        self.site_app = str(root / "app" / "client_app.py")
        self.files: dict[str, Counter[str]] = {"server": Counter(), "site": Counter()}
        self.hops: dict[str, Counter[tuple[str, str]]] = {"server": Counter(),
                                                           "site": Counter()}

    def _side(self, frame) -> str:
        while frame is not None:
            if frame.f_code.co_filename == self.site_app:
                return "site"
            frame = frame.f_back
        return "server"

    def _repo_file(self, filename: str) -> str | None:
        if (not filename.startswith(self.root) or "/.venv/" in filename
                or filename == self.skip):
            return None
        return str(Path(filename).relative_to(self.root))

    def __call__(self, frame, event, _arg) -> None:
        if event != "call":
            return
        callee = self._repo_file(frame.f_code.co_filename)
        if callee is None:
            return
        side = self._side(frame)
        self.files[side][callee] += 1
        caller_frame = frame.f_back
        while caller_frame is not None and self._repo_file(caller_frame.f_code.co_filename) is None:
            caller_frame = caller_frame.f_back
        caller = None if caller_frame is None else self._repo_file(caller_frame.f_code.co_filename)
        if caller is not None and caller != callee:
            self.hops[side][(caller, callee)] += 1

    def summary(self, *sides: str) -> dict:
        """Files, distinct hops and crossing calls of ``sides`` (``server``, ``site``)."""
        files = sorted(set().union(*(self.files[side] for side in sides)))
        hops: Counter[tuple[str, str]] = sum((self.hops[side] for side in sides), Counter())
        return {"files": len(files), "hops": len(hops), "calls": sum(hops.values()),
                "file_list": files, "hop_list": [f"{a} -> {b}" for a, b in sorted(hops)]}


def small_hospitals(root: Path) -> None:
    """Three synthetic pe-seg hospitals (32x32) of four studies: two train, one val, one test."""
    for site in generate_federation(root, num_sites=SITES, seed=0, image_size=32):
        entries = read_manifest(site)
        write_manifest(site, [e for e in entries if e.split == "train"][:2]
                       + [e for e in entries if e.split == "val"][:1]
                       + [e for e in entries if e.split == "test"][:1])


class _TracedRoundDone(Exception):
    """Raised by the traced round observer after round 2: the federation stops there."""


def trace_round(data_root: Path, work: Path, tracking_uri: str = "") -> tuple[FileTrace, dict]:
    """Round 1 untraced, round 2 traced, of the default federation through the real apps.

    ``work`` holds the checkpoints, the artefacts and (without ``tracking_uri``) a fresh
    sqlite MLflow store. Returns the trace and the run config the federation ran with.
    """
    uri = tracking_uri or f"sqlite:///{work / 'mlflow.db'}"
    overrides = {**RUN_OVERRIDES, "data-root": str(data_root), "tracking-uri": uri,
                 "artifact-root": str(work / "artifacts"),
                 "checkpoint-dir": str(work / "checkpoints")}
    trace = FileTrace(ROOT, Path(__file__).resolve())
    reports: dict[int, Any] = {}
    recorder = server_app.RoundRecorder

    class TracedRecorder(recorder):
        """The ServerApp's round observer, tracing from the end of round 1 to the end of 2."""

        def __call__(self, report, arrays) -> bool:
            stop = super().__call__(report, arrays)
            reports[report.server_round] = report
            if report.server_round == TRACED_ROUND - 1:
                sys.setprofile(trace)
            elif report.server_round == TRACED_ROUND:
                sys.setprofile(None)
                raise _TracedRoundDone
            return stop

    server_app.RoundRecorder = TracedRecorder
    try:
        run_federation(overrides, partition_sites(SITES), run_id=1)
    except _TracedRoundDone:
        pass
    finally:
        sys.setprofile(None)
        server_app.RoundRecorder = recorder
    report = reports.get(TRACED_ROUND)
    assert report is not None and len(report.train) == SITES and len(report.evaluate) == SITES, (
        report and (report.train_dropped, report.evaluate_dropped))
    assert (work / "checkpoints").is_dir(), "the traced round wrote no checkpoint"
    return trace, full_run_config(overrides)


def off_features(run_config: Mapping[str, Any]) -> list[Feature]:
    """The features of :data:`FEATURES` that ``run_config`` has off."""
    settings = RunConfig.from_mapping(run_config)
    model = task_class(settings.task).model_for_run(settings.task_settings(), private=False)
    keys = list(model.state_dict())
    return [feature for feature in FEATURES if feature.off(run_config, keys)]


def measure(tracking_uri: str = "") -> dict:
    """The trace of one default round (:func:`trace_round` on fresh synthetic hospitals)."""
    with tempfile.TemporaryDirectory() as folder:
        data, work = Path(folder) / "data", Path(folder) / "work"
        small_hospitals(data)
        work.mkdir()
        trace, run_config = trace_round(data, work, tracking_uri)
    result: dict[str, Any] = {"round": trace.summary("server", "site"),
                              "server": trace.summary("server"), "site": trace.summary("site")}
    files = result["round"]["file_list"]
    result["off_feature_files"] = {
        feature.name: owned for feature in off_features(run_config)
        if (owned := [path for path in files if feature.owns(path)])}
    result["goal_files"] = GOAL_FILES
    result["goal_met"] = (result["round"]["files"] <= GOAL_FILES
                          and not result["off_feature_files"])
    return result


#: What the staleness test compares (``calls`` varies from run to run).
COMPARED = ("files", "hops", "file_list", "hop_list")


def comparable(result: Mapping[str, Any]) -> dict:
    """The deterministic part of a result: per side, :data:`COMPARED`; the off-feature files."""
    return {**{side: {key: result[side][key] for key in COMPARED}
               for side in ("round", "server", "site")},
            "off_feature_files": result["off_feature_files"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args(argv)
    result = measure()
    for name in ("round", "server", "site"):
        part = result[name]
        print(f"{name}: {part['files']} files, {part['hops']} hops "
              f"({part['calls']} calls across files)")
    for name in result["round"]["file_list"]:
        print(f"  {name}")
    off = sum(len(paths) for paths in result["off_feature_files"].values())
    print(f"files of features that are off: {off}")
    for feature, paths in result["off_feature_files"].items():
        print(f"  {feature}: {', '.join(paths)}")
    print(f"goal: at most {GOAL_FILES} files, none of a feature that is off: "
          f"{'met' if result['goal_met'] else 'not met'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
