"""One federation of a wide model through the in-process engine, in its own process.

``python -m tests.integration.large_model_run --width W --out result.json [--secagg]``
registers :class:`~tests.integration.wide_tabular_task.WideTabularTask` as task
``wide-tabular`` (hidden layers of ``W`` units), writes two synthetic tabular hospitals,
runs the product's ServerApp against them (:func:`app.engine.run_federation`) and writes
what the run left behind and its peak memory (``ru_maxrss`` of this process: the
ServerApp, both sites and every message between them share it) to ``result.json``.

Without ``--secagg``: two rounds of one local step, uplink ``topk:0.01`` with error
feedback, downlink ``fp16`` (round 1 dense, round 2 the compressed step), the default
``norm-bound`` defence, the server checkpoint, MLflow model logging (final and best),
final evaluation. With ``--secagg``: SecAgg+ (``fp16`` uplink with error feedback, no
defence: SecAgg+ refuses one), same rest.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

#: Run-config keys of both runs; ``data-root`` and tracking paths are added per run.
COMMON = {"task": "wide-tabular", "num-server-rounds": 2, "local-steps": 1, "batch-size": 4,
          "optimizer": "sgd", "momentum": 0.0, "lr": 0.01, "node-wait-timeout": 5,
          "min-nodes": 2, "experiment": "large-model", "cross-site.finetune-steps": 0,
          "strategy.error-feedback": True, "strategy.downlink-codec": "fp16"}
PLAIN = {"strategy.codec": "topk:0.01", "strategy.defence": "norm-bound"}
SECAGG = {"strategy.codec": "fp16", "strategy.defence": "none",
          "strategy.secure-aggregation": "secagg+", "secagg.min-participants": 2}


def _peak_rss_mb() -> float:
    """This process's peak resident set, MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(width: int, folder: Path, secagg: bool, tracking_uri: str = "") -> dict:
    """Run the federation under ``folder`` (tracking into ``tracking_uri``, else a fresh
    sqlite store there); the summary the test reads."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: PLC0415

    from app.engine import partition_sites, run_federation  # noqa: PLC0415
    from clients.registry import TASKS, TaskEntry  # noqa: PLC0415
    from clients.tabular.synthetic import generate_federation  # noqa: PLC0415
    from tests.integration.wide_tabular_task import WideTabularTask, parameter_count  # noqa: PLC0415

    WideTabularTask.width = width
    TASKS.add("wide-tabular", TaskEntry("tests.integration.wide_tabular_task:WideTabularTask",
                                        "clients.tabular.synthetic", "clients.tabular.shared",
                                        ("heart-disease",), ()))
    generate_federation(folder / "data", 2, seed=3)
    if not tracking_uri:
        tracking_uri = f"sqlite:///{folder / 'mlflow.db'}"
        SqlAlchemyStore(tracking_uri, (folder / "artifacts").as_uri())
    before = _peak_rss_mb()
    started = time.perf_counter()
    outcome = run_federation({
        **COMMON, **(SECAGG if secagg else PLAIN), "data-root": str(folder / "data"),
        "tracking-uri": tracking_uri,
        "artifact-root": str(folder / "artifacts"),
        "checkpoint-dir": str(folder / "checkpoints")}, partition_sites(2))
    wall = time.perf_counter() - started
    checkpoint = folder / "checkpoints" / outcome.mlflow_run_id / "server-checkpoint.npz"
    return {
        "width": width, "parameters": parameter_count(width),
        "model_mb": parameter_count(width) * 4 / 1e6,
        "final_parameters": sum(int(a.numpy().size) for a in outcome.arrays.values()),
        "peak_rss_mb": _peak_rss_mb(), "rss_before_run_mb": before, "wall_s": wall,
        "secagg": secagg, "mlflow_run_id": outcome.mlflow_run_id,
        "final_uri": outcome.models.final_uri, "best_uri": outcome.models.best_uri,
        "best_round": outcome.best_round, "checkpoint": str(checkpoint),
        "rounds": {str(r): {"train": sorted(rep.train), "dropped": dict(rep.train_dropped),
                            "evaluate": sorted(rep.evaluate),
                            "aggregation_failed": bool(rep.aggregation_failed),
                            "steps": [m.get("steps") for m in rep.train.values()],
                            "strategy": {k: v for k, v in rep.strategy.items()
                                         if isinstance(v, (int, float, str, bool))}}
                   for r, rep in outcome.reports.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, required=True, help="hidden units of the MLP")
    parser.add_argument("--out", type=Path, required=True, help="the JSON summary")
    parser.add_argument("--tracking-uri", default="", help="an MLflow store (default: a new one)")
    parser.add_argument("--secagg", action="store_true", help="SecAgg+ in place of the defence")
    args = parser.parse_args(argv)
    folder = args.out.parent / ("run-secagg" if args.secagg else "run")
    folder.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(run(args.width, folder, args.secagg, args.tracking_uri), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
