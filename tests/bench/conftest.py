"""The benchmark scripts are imported by module name here: ``bench/`` goes on ``sys.path``.

(``python bench/<script>.py`` has it there too; the scripts import
``single_thread`` and each other by name.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


@pytest.fixture()
def fake_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``--shared-data`` folder holding an empty file of every shared set the studies ask
    for, and the studies' site generators replaced by ones that write nothing."""
    import compression_sets  # noqa: PLC0415 - bench/ is on sys.path from here on
    import pruning_sets  # noqa: PLC0415

    for spec in pruning_sets.SETS.values():
        if spec.shared_file:
            (tmp_path / spec.shared_file).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / spec.shared_file).touch()
    for module in (compression_sets, pruning_sets):
        monkeypatch.setattr(module, "shared_sites", lambda *a, **k: [])
        monkeypatch.setattr(module, "synthetic_sites", lambda *a, **k: [])
    return tmp_path


def stored_and_rebuilt(study, commands: list[list[str]], rows: list[dict],
                       shared: Path) -> tuple[dict, dict]:
    """Per stored run ``(set, seed, arm)``: the run config a study's JSON holds, and the one
    :mod:`runner` builds for it from the stored ``commands`` (``--shared-data shared``).

    Use it with :func:`fake_shared` (the folders are no part of a run config); a
    baseline's stored row gives the others their schedule, as in a run.
    """
    import runner  # noqa: PLC0415 - bench/ is on sys.path from here on

    keyed = {(r["set"], r["seed"], r[study.arm_key]): r for r in rows}
    built = {}
    for command in commands:
        args = runner.parser(study).parse_args([*command, "--shared-data", str(shared)])
        for index, seed in enumerate(args.seeds):
            for name in args.sets:
                federation = study.federation(name, args)
                for arm in study.arms(args, index):
                    base = None if arm.name == study.baseline else \
                        keyed.get((name, seed, study.baseline))
                    built[(name, seed, arm.name)] = runner.run_config(
                        study, federation, arm, seed, study.schedule(args, base))
    return {k: r["run_config"] for k, r in keyed.items()}, {k: built.get(k) for k in keyed}


def run_on_small_hospitals(tmp_path_factory: pytest.TempPathFactory, mlflow_store, name: str,
                           seed: int, main, args: list[str], output: str = "out.json") -> Path:
    """A benchmark's ``main`` run to its end on two tiny synthetic PE hospitals; its output.

    A fresh folder ``name`` holds the hospitals (``pe/``, ``write_small_hospitals(seed=)``),
    the work folder (``work/``, with the test MLflow store) and the output; ``args`` are
    followed by ``--pe-data``, ``--workdir`` and ``--output`` naming them.
    """
    from tests.integration.conftest import write_small_hospitals  # noqa: PLC0415

    tmp = tmp_path_factory.mktemp(name)
    write_small_hospitals(tmp / "pe", seed=seed)
    mlflow_store(tmp / "work")
    out = tmp / output
    assert main([*args, "--pe-data", str(tmp / "pe"), "--workdir", str(tmp / "work"),
                 "--output", str(out)]) == 0
    return out
