"""Scale in simulation: seconds per round and memory with 10 to 1,000 virtual sites, m selected.

Each point is one real ``python -m app.tooling.simulate`` run (what ``make
simulate`` runs: flower-superlink in simulation mode, ``flwr run``, Flower's
Ray engine with one CPU per site, so two actors on the 2-core machine) of the
``cxr-cls`` task with ``N`` connected virtual sites of which the uniform
selector trains ``m`` per round (``selection.m``). The sites are tiny
synthetic chest X-ray hospitals (8 radiographs of 32 px): ``--distinct``
(default 10) are generated once under ``--cache`` (``/tmp``, never the
repository) and site ``i`` is a link to distinct site ``i mod distinct``, so
1,000 site folders cost nothing.

Measured per run:

* ``seconds_per_round``: mean time between the ServerApp's consecutive
  ``Round r/R:`` progress lines from round 2 on (round 1 also pays the actors'
  imports), timed as the lines arrive; ``train_stage_s`` / ``evaluate_stage_s``
  split rounds 2.. into the train stage (``configure_train`` to
  ``aggregate_train``: the ``m`` selected sites) and the rest (evaluation, which
  today goes to every connected site, and tracking), from the log's timestamps;
* ``server_peak_mb``: peak resident set (``VmRSS``) of the ``flwr-simulation``
  process (a descendant of the SuperLink's SuperExec): in Flower's simulation
  the ServerApp runs inside it, next to the engine's driver (the virtual
  nodes' state, the Ray driver), so there is no separate ``flwr-serverapp``;
* ``total_peak_mb``: peak of the summed proportional set size (``Pss`` of
  ``/proc/<pid>/smaps_rollup``: shared pages split between their users, so
  torch's libraries in every Ray worker are not counted once per worker) of
  every process under the run (SuperLink, ServerApp, simulation engine, Ray
  daemons and workers, ``flwr run``); ``total_peak_rss_mb`` is the plain RSS sum.

Sampled every ``--interval`` seconds from ``/proc``. Results:
``bench/results/scale.json``. Run it alone (``nice -n 19``)::

    nice -n 19 .venv/bin/python bench/scale.py [--sites 10 100 300 1000] [--selected 10]
"""

from __future__ import annotations

import single_thread  # noqa: F401  (first: one BLAS thread, repository root on sys.path)

import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from app.tooling.process_tree import descendants
from clients.cxr_cls.synthetic import generate_site, site_profiles
from clients.datagen.federation import hospital_name

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "scale.json"
_ROUND = re.compile(r"Round (\d+)/(\d+):")
_STAMPED = re.compile(r"^(\d\d/\d\d/\d{4} \d\d:\d\d:\d\d):INFO:"
                      r"(configure_train|aggregate_train|Round \d+/\d+:)")
RUN_CONFIG = ("task=cxr-cls", "image-size=32", "batch-size=4", "local-steps=2",
              "optimizer=sgd", "lr=0.05", "experiment=scale", "node-wait-timeout=600",
              "round-timeout=1200", "final-evaluation=false")  # rounds only


def site_folders(cache: Path, sites: int, distinct: int) -> Path:
    """``cache/sites/hospital-XX`` for XX < ``sites``: links to ``distinct`` generated sites."""
    base = cache / f"base-{distinct}"
    if not (base / "done").is_file():
        shutil.rmtree(base, ignore_errors=True)
        for profile in site_profiles(distinct, seed=11):
            generate_site(base / profile.name, dataclasses.replace(profile, num_images=8),
                          seed=11, image_size=32, val_fraction=0.25)
        (base / "done").write_text("ok\n")
    root = cache / "sites"
    root.mkdir(parents=True, exist_ok=True)
    for i in range(sites):
        link = root / hospital_name(i)
        if not link.is_symlink():
            link.symlink_to(base / hospital_name(i % distinct), target_is_directory=True)
    return root


def _proc(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_text(errors="replace")
    except OSError:
        return ""


def _kib(text: str, field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


@dataclasses.dataclass
class MemorySampler:
    """Peak memory of a process tree and of its ServerApp, sampled from /proc."""

    root_pid: int
    interval: float
    server_peak_kib: int = 0
    total_pss_peak_kib: int = 0
    total_rss_peak_kib: int = 0
    server_seen: bool = False
    names: set[str] = dataclasses.field(default_factory=set)
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    def sample(self) -> None:
        pss = rss = 0
        for pid in [self.root_pid, *(pid for pid, _ in descendants(self.root_pid))]:
            rss_kib = _kib(_proc(pid, "status"), "VmRSS")
            rss += rss_kib
            pss += _kib(_proc(pid, "smaps_rollup"), "Pss")
            argv = _proc(pid, "cmdline").split("\0")
            self.names.add(" ".join(Path(a).name for a in argv[:2] if a)[:40])
            if any(a.endswith("flwr-simulation") for a in argv[:2]):
                self.server_seen = True
                self.server_peak_kib = max(self.server_peak_kib, rss_kib)
        self.total_pss_peak_kib = max(self.total_pss_peak_kib, pss)
        self.total_rss_peak_kib = max(self.total_rss_peak_kib, rss)

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()


def stage_seconds(lines: list[str]) -> dict[str, list[int]]:
    """Per round from 2 on, seconds of the train stage (``configure_train`` to
    ``aggregate_train``) and of the rest (evaluation, tracking: to ``Round r/R:``),
    from the ServerApp's log timestamps (1 s resolution)."""
    stamps = [(time.mktime(time.strptime(m.group(1), "%m/%d/%Y %H:%M:%S")), m.group(2))
              for m in map(_STAMPED.match, lines) if m]
    train, rest = [], []
    for i in range(len(stamps) - 2):
        (t0, a), (t1, b), (t2, c) = stamps[i:i + 3]
        if a == "configure_train" and b == "aggregate_train" and c.startswith("Round "):
            train.append(int(t1 - t0))
            rest.append(int(t2 - t1))
    return {"train_stage_s": train[1:], "evaluate_stage_s": rest[1:]}


def run_point(sites: int, selected: int, rounds: int, data_root: Path, work: Path,
              interval: float, timeout: float, evaluated: int = 0, defence: str = "") -> dict:
    """One ``app.tooling.simulate`` run; its per-round seconds and peak memory.

    ``defence`` sets ``strategy.defence`` ("" keeps the run config's default, norm-bound).
    """
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    command = [sys.executable, "-m", "app.tooling.simulate", "--data-root", str(data_root),
               "--sites", str(sites), "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}",
               "--artifact-root", str(work / "artifacts"), "--flwr-home", str(work / "flwr"),
               "--log-dir", str(work / "logs"), "--timeout", str(timeout),
               "-c", f"num-server-rounds={rounds}", "-c", f"selection.m={selected}",
               "-c", f"min-nodes={min(selected, sites)}"]
    if evaluated:  # fraction-evaluate rounds up: (m - 0.5) / N asks exactly m sites
        command += ["-c", f"fraction-evaluate={(min(evaluated, sites) - 0.5) / sites:.6f}"]
    for item in RUN_CONFIG + ((f"strategy.defence={defence}",) if defence else ()):
        command += ["-c", item]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    sampler = MemorySampler(process.pid, interval)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    marks: dict[int, float] = {}
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        match = _ROUND.search(line)
        if match:
            marks.setdefault(int(match.group(1)), time.monotonic())
    code = process.wait()
    sampler.stop()
    thread.join()
    (work / "simulate.out").write_text("".join(lines))
    if code != 0 or len(marks) < rounds or not sampler.server_seen:
        raise RuntimeError(f"{sites} sites: simulate exited {code}, {len(marks)} round lines, "
                           f"server process seen {sampler.server_seen}; see "
                           f"{work / 'simulate.out'}")
    per_round = [marks[r] - marks[r - 1] for r in range(2, rounds + 1)]
    return {"sites": sites, "selected": selected, "rounds": rounds,
            "evaluated": min(evaluated, sites) if evaluated else sites,
            **({"defence": defence} if defence else {}),
            "seconds_per_round": round(sum(per_round) / len(per_round), 2),
            "seconds_per_round_each": [round(s, 2) for s in per_round],
            **stage_seconds(lines),
            "server_peak_mb": round(sampler.server_peak_kib / 1024, 1),
            "total_peak_mb": round(sampler.total_pss_peak_kib / 1024, 1),
            "total_peak_rss_mb": round(sampler.total_rss_peak_kib / 1024, 1),
            "wall_s": round(time.monotonic() - started, 1),
            "processes_sampled": sorted(sampler.names)}


def _identity(point: dict) -> tuple:
    """What makes two points the same configuration (a new one replaces the old)."""
    return (point["sites"], point.get("evaluated", point["sites"]), point["selected"],
            point.get("defence", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[10, 100, 300, 1000])
    parser.add_argument("--selected", type=int, default=10)
    parser.add_argument("--evaluated", type=int, default=0,
                        help="sites evaluating each round (fraction-evaluate); 0: all")
    parser.add_argument("--defence", default="",
                        help="strategy.defence (none streams FedAvg); default: norm-bound")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--distinct", type=int, default=10)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/fedmed-bench-scale"))
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=3000.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    data_root = site_folders(args.cache, max(args.sites), args.distinct)
    runs = (json.loads(args.out.read_text())["runs"] if args.out.is_file() else [])
    for sites in args.sites:
        point = run_point(sites, args.selected, args.rounds, data_root,
                          args.cache / f"run-{sites}", args.interval, args.timeout,
                          args.evaluated, args.defence)
        print(json.dumps(point), flush=True)
        runs = [r for r in runs if _identity(r) != _identity(point)] + [point]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "runs": runs,
            "setup": {"task": "cxr-cls", "images_per_site": 8, "image_size": 32,
                      "distinct_sites": args.distinct, "run_config": list(RUN_CONFIG),
                      "cpus_per_site": 1, "cpus": os.cpu_count(),
                      "machine": platform.processor() or platform.machine()},
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
