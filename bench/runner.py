"""One runner for the studies that are federations of the product: sets x seeds x arms.

A :class:`Study` is declarative: a product configuration per set (a
:class:`Federation`: site folders and run-config overrides), its arms (each an
:class:`Arm`: a name and the run-config keys it adds), its seeds, the rounds a
run gets (:attr:`Study.schedule`), the row fields it reads from a run and how
its JSON summarises (through :mod:`stats` and the study's summary module).
:func:`run_study` runs every (set, seed, arm) through the product's in-process
engine (:func:`engine_runs.run_product`, no federation loop here) in that
order, once the product has accepted every run's config (:func:`check_arms`);
it writes the study's JSON after every run and, with ``--resume``, keeps the
runs the JSON already holds *with the same run config* (a stored run of the
same set, seed and arm under another config is run again and replaced). The
JSON's ``sets`` records each set's run-config overrides.

The baseline arm (:attr:`Study.baseline`, e.g. dense), if the study has one,
runs first for a set and seed; an arm whose baseline did not run (the
``--budget-seconds`` ran out) is listed in the JSON's ``missing``. One command
line serves every study (:func:`parser`: the shared options plus the study's
:attr:`Study.options`)::

    .venv/bin/python bench/runner.py pruning --seeds 0 --rounds 6 --resume
    .venv/bin/python bench/pruning.py --seeds 0 --rounds 6 --resume   # the same
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
import single_thread  # noqa: F401, I001

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Mapping, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from bytes_to_target import traffic_fields  # noqa: E402
from engine_runs import SHARED, RoundSeries, run_product, series  # noqa: E402
from report import environment, write_report  # noqa: E402

__all__ = ["Federation", "Arm", "Option", "SINGLE_SEED", "SetMissing", "Study", "parser",
           "check_arms", "run_config", "run_arm", "run_study", "main"]


@dataclass(frozen=True)
class Federation:
    """A set as a configuration of the product: its name, metric, site folders, overrides."""

    name: str
    metric: str
    folders: tuple[Path, ...]
    overrides: dict


@dataclass(frozen=True)
class Arm:
    """One arm of a study: its name, the run-config keys it adds, the row fields naming it
    and, per site (in the federation's folder order), node-config keys it adds there."""

    name: str
    overrides: Mapping[str, Any]
    fields: Mapping[str, Any] = field(default_factory=dict)
    site_config: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Option:
    """A study's own command-line option: ``argparse.add_argument(flag, **kwargs)``."""

    flag: str
    kwargs: Mapping[str, Any]


#: ``--seed N``: the one seed of a study whose command line always had one (``--seeds [N]``).
SINGLE_SEED = Option("--seed", {"type": lambda v: [int(v)], "dest": "seeds",
                                "help": "the seed of every run (default 0)"})


class SetMissing(Exception):
    """A set's data are absent (the message says which file); the set is skipped."""


@dataclass(frozen=True)
class Study:
    """A study of the product: what it runs, how it names its runs and how it summarises.

    Attributes
    ----------
    name : str
        The JSON's ``benchmark`` and the module :func:`main` imports (``bench/NAME.py``).
    doc : str
        The study module's docstring (its first line: the command line's description).
    output : Path
        The default ``--output``.
    sets : Sequence[str]
        The set names (``--sets`` choices and default).
    federation : Callable[[str, argparse.Namespace], Federation]
        The set's federation (its folders generated once); raises :class:`SetMissing`.
    arms : Callable[[argparse.Namespace, int], list[Arm]]
        The arms the ``i``-th seed runs, the baseline first.
    schedule : Callable[[argparse.Namespace, dict | None], dict]
        The run-config keys of a run's length (``num-server-rounds``...), given the
        baseline's row of the set and seed (``None`` for the baseline itself).
    fields : Callable[[object, RoundSeries, Path], dict]
        The study's own row fields from a run's outcome, its series and the workdir.
    summary : Callable[[dict, list[dict], list[str], argparse.Namespace], dict]
        The JSON from ``meta``, the rows, the runs left out and the options.
    table : Callable[[dict], str]
        The markdown table of a JSON the study wrote.
    rows_of : Callable[[dict], list[dict]]
        The rows a JSON the study wrote holds (``--resume`` keeps them).
    arm_key : str
        The row field holding the arm's name.
    experiment : str
        The MLflow experiment's prefix (``EXPERIMENT-SET``).
    options : tuple[Option, ...]
        The study's own options beside :func:`parser`'s shared ones.
    defaults : Mapping[str, Any]
        Defaults of shared options the study changes (``seeds``, ``tail``...).
    baseline : str | None
        The arm every other arm of a set and seed needs first (``None``: none).
    warm_up : bool
        Run the baseline one untimed round before a set's first run (torch's start-up).
    """

    name: str
    doc: str
    output: Path
    sets: Sequence[str]
    federation: Callable[[str, argparse.Namespace], Federation]
    arms: Callable[[argparse.Namespace, int], list[Arm]]
    schedule: Callable[[argparse.Namespace, dict | None], dict]
    fields: Callable[[Any, RoundSeries, Path], dict]
    summary: Callable[[dict, list[dict], list[str], argparse.Namespace], dict]
    table: Callable[[dict], str]
    rows_of: Callable[[dict], list[dict]]
    arm_key: str
    experiment: str
    options: tuple[Option, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    baseline: str | None = None
    warm_up: bool = False


def parser(study: Study) -> argparse.ArgumentParser:
    """The command line of ``study``: the shared options, then the study's own."""
    p = argparse.ArgumentParser(prog=f"bench/{study.name}.py",
                                description=study.doc.splitlines()[0])
    p.add_argument("--sets", nargs="+", default=list(study.sets), choices=list(study.sets))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--tail", type=int, default=2, help="final = mean of the last N rounds")
    p.add_argument("--fraction", type=float, default=0.95, help="target = this x the baseline")
    p.add_argument("--budget-seconds", type=float, default=None,
                   help="start no run after this many seconds (default: no limit)")
    p.add_argument("--shared-data", type=Path, default=SHARED)
    p.add_argument("--pe-data", type=Path, default=None,
                   help="a folder of pe-seg site folders hospital-NN (default: generated once "
                        "under data/bench/)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="MLflow store of the runs (default: a temporary folder)")
    p.add_argument("--output", type=Path, default=study.output)
    p.add_argument("--resume", action="store_true",
                   help="keep the runs already in --output with the same run config")
    p.add_argument("--table", action="store_true",
                   help="print the markdown table of --output and run nothing")
    for option in study.options:
        p.add_argument(option.flag, **option.kwargs)
    p.set_defaults(**study.defaults)
    return p


def check_arms(study: Study, args: argparse.Namespace,
               federations: Mapping[str, Federation]) -> None:
    """Validate the run config of every (set, seed, arm) as the product does, before any run.

    Raises
    ------
    strategies.wire.errors.ConfigError
        A key or value the product refuses (the message names it).
    """
    from app.engine import full_run_config  # noqa: PLC0415 - the engine loads Flower

    for index, seed in enumerate(args.seeds):
        for federation in federations.values():
            for arm in study.arms(args, index):
                full_run_config(run_config(study, federation, arm, seed,
                                           study.schedule(args, None)))


def run_config(study: Study, federation: Federation, arm: Arm, seed: int,
               schedule: Mapping[str, Any]) -> dict:
    """The run config one (set, seed, arm) hands the engine (on top of its defaults)."""
    return {**federation.overrides, **arm.overrides, "seed": seed, **schedule,
            "experiment": f"{study.experiment}-{federation.name}"}


def run_arm(study: Study, federation: Federation, arm: Arm, seed: int,
            schedule: Mapping[str, Any], workdir: Path) -> dict:
    """One federation of ``arm`` on ``federation`` through the engine; its JSON row."""
    from app.engine import VirtualSite  # noqa: PLC0415 - the engine loads Flower

    sites = [VirtualSite.folder(folder, site_name=folder.name) for folder in federation.folders]
    for site, keys in zip(sites, arm.site_config):
        site.node_config = {**site.node_config, **keys}
    overrides = run_config(study, federation, arm, seed, schedule)
    outcome, seconds = run_product(overrides, sites, workdir)
    run = series(outcome)
    return {"set": federation.name, "seed": seed, study.arm_key: arm.name, **arm.fields,
            "engine": "in-process", "sites": len(sites), "rounds": run.rounds,
            "metric": federation.metric, "curve": run.metrics[federation.metric],
            "curves": run.metrics, **traffic_fields(run), **study.fields(outcome, run, workdir),
            "dropped": run.dropped, "seconds": seconds, "mlflow_run_id": outcome.mlflow_run_id,
            "run_config": overrides}


def _runs(rows: list[dict], study: Study, name: str, seed: int, arm: str | None) -> list[dict]:
    """The rows of set ``name``, ``seed`` and arm ``arm``."""
    return [r for r in rows if (r["set"], r["seed"], r[study.arm_key]) == (name, seed, arm)]


def _same(row: dict, config: dict) -> bool:
    """Whether a stored row ran ``config`` (compared as the JSON holds it)."""
    return row.get("run_config") == json.loads(json.dumps(config))


def run_study(study: Study, args: argparse.Namespace, command: Sequence[str]) -> dict:
    """Run ``study`` under ``args`` (see the module docstring); the JSON it wrote last."""
    started = time.perf_counter()
    previous = json.loads(args.output.read_text()) if args.resume and \
        args.output.is_file() else {}
    meta = {"benchmark": study.name, "description": study.doc.split("\n\n")[0],
            "engine": "in-process", "setup": {k: (str(v) if isinstance(v, Path) else v)
                                              for k, v in vars(args).items()},
            "sets": {}, "skipped": {}, "versions": environment(),
            "commands": previous.get("meta", previous).get("commands", []) + [list(command)]}
    federations = {}
    for name in args.sets:
        try:
            federations[name] = study.federation(name, args)
        except SetMissing as exc:
            meta["skipped"][name] = f"{args.shared_data}: {exc}"
            print(f"[{name}] skipped: {meta['skipped'][name]}", flush=True)
            continue
        meta["sets"][name] = federations[name].overrides
    check_arms(study, args, federations)
    rows: list[dict] = list(study.rows_of(previous)) if previous else []
    missing: list[str] = []
    warm: set[str] = set()
    with tempfile.TemporaryDirectory(prefix=f"{study.name}-") as tmp:
        workdir = args.workdir or Path(tmp)
        for index, seed in enumerate(args.seeds):
            for name, federation in federations.items():
                for arm in study.arms(args, index):
                    baseline = next(iter(_runs(rows, study, name, seed, study.baseline)), None)
                    schedule = study.schedule(args, None if arm.name == study.baseline
                                              else baseline)
                    config = run_config(study, federation, arm, seed, schedule)
                    mine = _runs(rows, study, name, seed, arm.name)
                    if any(_same(r, config) for r in mine):
                        continue
                    if (args.budget_seconds is not None and time.perf_counter() - started
                            > args.budget_seconds) or (baseline is None and study.baseline
                                                       not in (None, arm.name)):
                        missing.append(f"{name} seed {seed} {arm.name}")
                        continue
                    if study.warm_up and name not in warm:  # untimed: torch's start-up
                        run_arm(study, federation, study.arms(args, index)[0], seed,
                                {**study.schedule(args, None), "num-server-rounds": 1}, workdir)
                        warm.add(name)
                    rows[:] = [r for r in rows if r not in mine]
                    rows.append(run_arm(study, federation, arm, seed, schedule, workdir))
                    last = rows[-1]
                    print(f"[{name} seed {seed}] {arm.name:<36} {last['rounds']:3d} rounds "
                          f"{last['seconds']:6.1f} s  final {last['curve'][-1]}", flush=True)
                    write_report(args.output, study.summary(meta, rows, missing, args),
                                 indent=1)
    meta["wall_seconds"] = time.perf_counter() - started
    payload = study.summary(meta, rows, missing, args)
    write_report(args.output, payload, indent=1)
    return payload


def main(study: Study, argv: Sequence[str] | None = None) -> int:
    """``study``'s command line: run it (or ``--table``: print its stored table)."""
    args = parser(study).parse_args(argv)
    if args.table:
        print(study.table(json.loads(args.output.read_text())))
        return 0
    payload = run_study(study, args, sys.argv[1:] if argv is None else argv)
    missing = payload.get("missing", [])
    print(f"\n{study.table(payload)}\n\nresults in {args.output}"
          + (f" (not run: {'; '.join(missing)})" if missing else ""))
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: bench/runner.py STUDY [options]  (STUDY: a module of bench/ with STUDY)")
    sys.exit(main(importlib.import_module(sys.argv[1]).STUDY, sys.argv[2:]))
