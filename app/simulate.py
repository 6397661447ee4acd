"""Run a federation locally in Flower's simulation engine, with real Flower processes.

``python -m app.simulate`` (what ``make simulate`` calls) starts a
``flower-superlink`` in simulation mode on a free loopback port, submits this
app with ``flwr run`` (one virtual SuperNode per synthetic hospital), streams
the ServerApp's progress, then reads the run's final status with
``flwr ls --format json`` (``flwr run`` itself exits 0 even when the run
failed), prints a summary from MLflow, and stops the SuperLink.
Exit code 0 only when the run finished as ``finished:completed``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from app.flower_processes import (
    FlowerProcessError,
    SuperLinkProcess,
    flower_env,
    run_status,
    stop_process_group,
    write_connection,
)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONNECTION = "fedmed-sim"
_RUN_ID = re.compile(r"Successfully started run (\d+)")


def _toml_value(value: str) -> str:
    """Quote a command-line value for ``flwr run --run-config`` unless it is a number/bool."""
    if re.fullmatch(r"-?\d+(\.\d*)?([eE]-?\d+)?|true|false", value) or value.startswith('"'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return _toml_value(str(value))


def build_run_config(overrides: list[str], data_root: Path, tracking_uri: str,
                     artifact_root: Path, preset: Path | None = None) -> str:
    """The ``--run-config`` string: absolute paths, then the preset file, then overrides."""
    values = {"data-root": str(data_root.resolve()), "tracking-uri": tracking_uri,
              "artifact-root": str(artifact_root.resolve())}
    if preset is not None:
        with open(preset, "rb") as handle:
            values.update({k: _toml_literal(v) for k, v in tomllib.load(handle).items()})
    for item in overrides:
        if "=" not in item:
            raise SystemExit(f"run-config override must be key=value, got {item!r}")
        key, value = item.split("=", 1)
        values[key.strip()] = value.strip()
    return " ".join(f"{k}={_toml_value(v)}" for k, v in values.items())


def print_summary(tracking_uri: str, flwr_run_id: int, seconds: float) -> None:
    """Per-round validation metric and the MLflow location, read back from MLflow."""
    import mlflow  # noqa: PLC0415 - heavy import, only needed at the end
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient()
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list",
                              filter_string=f"tags.`flwr.run-id` = '{flwr_run_id}'")
    print("\n=== Federation summary ===")
    print(f"wall time: {seconds:.1f} s")
    if not runs:
        print(f"no MLflow run found with tag flwr.run-id={flwr_run_id} in {tracking_uri}")
        return
    run = runs[0]
    from clients.tasks import task_class  # noqa: PLC0415 - imports torch

    metric = f"val-{task_class(run.data.params['task']).main_metric}"
    for key, label in ((f"eval/{metric}", metric), ("train/train-loss", "train loss")):
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        values = ", ".join(f"r{m.step} {m.value:.4f}" for m in history)
        print(f"{label:>10} per round: {values}")
    totals = {key: sum(m.value for m in client.get_metric_history(run.info.run_id, key))
              for key in ("strategy/bytes-up", "strategy/bytes-down", "strategy/dense-bytes")}
    rounds = len(client.get_metric_history(run.info.run_id, "strategy/bytes-up"))
    if rounds:
        up, down = totals["strategy/bytes-up"], totals["strategy/bytes-down"]
        print(f"bytes on the wire over {rounds} rounds: up {up / 1e6:.2f} MB, "
              f"down {down / 1e6:.2f} MB (one dense fp32 update: "
              f"{totals['strategy/dense-bytes'] / rounds / 1e6:.2f} MB)")
    experiment = client.get_experiment(run.info.experiment_id)
    skipped = {key.split("/")[1]: int(value) for key, value in run.data.metrics.items()
               if key.startswith("site/") and key.endswith("/studies-skipped")}
    if skipped:
        detail = ", ".join(f"{site} {count}" for site, count in sorted(skipped.items()))
        print(f"studies skipped by the readers: {sum(skipped.values())} ({detail}; "
              "reasons in each site's log)")
    print(f"MLflow: experiment '{experiment.name}', run {run.info.run_id} "
          f"({run.info.run_name}), store {tracking_uri}")
    print("open it with: make mlflow-ui")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", type=Path, required=True,
                        help="folder with hospital-00, hospital-01, ...")
    parser.add_argument("--sites", type=int, default=3, help="virtual SuperNodes")
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("--artifact-root", type=Path, required=True)
    parser.add_argument("--flwr-home", type=Path, default=PROJECT_ROOT / ".flwr")
    parser.add_argument("--log-dir", type=Path, default=PROJECT_ROOT / "runs" / "simulate")
    parser.add_argument("--cpus-per-site", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds before the run is abandoned")
    parser.add_argument("--preset", type=Path, default=None,
                        help="TOML file of run-config values (e.g. configs/pe-seg-quick.toml)")
    parser.add_argument("-c", "--run-config", action="append", default=[],
                        metavar="KEY=VALUE", help="run-config override (repeatable)")
    args = parser.parse_args(argv)

    missing = [f"hospital-{i:02d}" for i in range(args.sites)
               if not (args.data_root / f"hospital-{i:02d}").is_dir()]
    if missing:
        print(f"missing synthetic hospitals under {args.data_root}: {missing}; "
              "run `make data` (or `make simulate`, which generates them)", file=sys.stderr)
        return 2
    flwr_home = args.flwr_home.resolve()
    run_config = build_run_config(args.run_config, args.data_root, args.tracking_uri,
                                  args.artifact_root, args.preset)
    started = time.monotonic()
    link = SuperLinkProcess.start_simulation(flwr_home, args.log_dir.resolve())
    try:
        write_connection(flwr_home, CONNECTION, link.address)
        env = flower_env(flwr_home, {"FEDMED_TORCH_THREADS": str(args.cpus_per_site)})
        command = [
            "flwr", "run", str(PROJECT_ROOT), CONNECTION, "--stream",
            "--run-config", run_config,
            "--federation-config",
            f"num-supernodes={args.sites} client-resources-num-cpus={args.cpus_per_site}",
        ]
        print(f"SuperLink {link.address} (logs: {link.log_file}); submitting the run...",
              flush=True)
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, cwd=PROJECT_ROOT,
                                   start_new_session=True)
        run_id = None
        deadline = time.monotonic() + args.timeout
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            match = _RUN_ID.search(line)
            if match:
                run_id = int(match.group(1))
            if time.monotonic() > deadline:
                print(f"timeout after {args.timeout:.0f} s; stopping", file=sys.stderr)
                break
        stop_process_group(process)
        if run_id is None:
            print("flwr run did not start a run (see the output above)", file=sys.stderr)
            return 1
        status = run_status(flwr_home, CONNECTION, run_id)
        for _ in range(30):
            if status.startswith("finished"):
                break
            time.sleep(1.0)
            status = run_status(flwr_home, CONNECTION, run_id)
        print(f"\nrun {run_id} status: {status}")
        if status != "finished:completed":
            print(f"the run did not complete; SuperLink log: {link.log_file}", file=sys.stderr)
            return 1
    except FlowerProcessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        link.stop()
    print_summary(args.tracking_uri, run_id, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
