"""A peer, side by side: the same federation as a plain Flower app and as the product, both on Ray.

Both take ``make simulate``'s path: a local Ray, ``flower-superlink --simulation``, ``flwr
run`` of an app bundle (nothing installed at run time), 3 virtual SuperNodes of one CPU each.

* ``flower``: ``bench/peer_flower_app/``, Flower's own ``flwr.serverapp.strategy.FedAvg``
  (``start``) and a ClientApp written as Flower's quickstart-pytorch writes it
  (``@app.train`` / ``@app.evaluate``: load the site, train, return ArrayRecord +
  MetricRecord), driven by :func:`drive_flower` (``peer_flower.py drive-flower``).
* ``product``: ``python -m app.tooling.simulate`` with the product's default machinery:
  site policy, reply intake, the ``norm-bound`` defence, MLflow tracking (sqlite), a
  server checkpoint every round, the final held-out and cross-site evaluation.

Same data (PneumoniaMNIST converted once by ``python -m clients.datagen shared`` into 3
Dirichlet(0.5) site folders, as ``make shared-data`` does; both apps read them), model
(the product's cxr-cls small DenseNet at 32 px, same seeded initial weights), rounds,
local steps, batch size, Adam and lr; both evaluate every site's validation split after
each round. Besides the machinery, only the sampling differs: the product draws
class-balanced batches, the plain app shuffles as Flower's examples do.

Measured per run, from the lines ``flwr run --stream`` prints, timed on arrival:
``seconds_per_round`` (median between consecutive round ends, from round 2),
``startup_seconds`` (``flwr run``'s "Successfully started run" to round 1's end: bundle,
ServerApp, the Ray actors' imports, round 1), ``launch_to_first_round_seconds`` (from
the driver's start, Ray and SuperLink included); ``final_auc``: ROC AUC of the final
global model on the 3 sites' held-out test items pooled, computed here the same way for
both; ``peak_rss_mb`` / ``peak_pss_mb``: peak summed RSS / PSS of the driver's process
tree (:class:`scale.MemorySampler`). The product's ``phases`` split its rounds 2..R
(medians) from its own round reports in MLflow: site train seconds, slowest train and
evaluate reply (push to pull), and the rest (aggregation, defence, tracking,
checkpoint). Results: ``bench/results/peer_flower.json``. Run it alone::

    nice -n 19 .venv/bin/python bench/peer_flower.py [--rounds 5 --steps 50 --first product]
"""

from __future__ import annotations

import single_thread  # noqa: F401  (first: one BLAS thread, repository root on sys.path)

import argparse
import ast
import dataclasses
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from report import write_report
from scale import MemorySampler

ROOT = Path(__file__).resolve().parents[1]
APP_DIR = ROOT / "bench" / "peer_flower_app"
RESULTS = ROOT / "bench" / "results" / "peer_flower.json"
SHARED = ROOT.parent / "shared" / "data"
CONNECTION = "peer-flower"
_SUBMITTED = re.compile(r"Successfully started run (\d+)")
#: Where a round ends in each app's streamed log: the product's progress line
#: ``Round r/R:``; FedAvg.start's ``[ROUND r+1/R]`` header (round r's end) and,
#: for the last round, ``Strategy execution finished``.
_PRODUCT_ROUND = re.compile(r"Round (\d+)/(\d+):")
_FLOWER_NEXT = re.compile(r"\[ROUND (\d+)/(\d+)\]")
_FLOWER_DONE = "Strategy execution finished"
_AGGREGATED = re.compile(r"Aggregated MetricRecord: (\{.*\})")


@dataclasses.dataclass(frozen=True)
class PeerConfig:
    """The federation both apps run."""

    rounds: int = 5
    steps: int = 50
    batch_size: int = 32
    lr: float = 0.003
    momentum: float = 0.9
    image_size: int = 32
    sites: int = 3
    alpha: float = 0.5
    seed: int = 0


def run_config_string(values: dict) -> str:
    """``flwr run --run-config`` text: ``key=value`` pairs, strings quoted (JSON is valid TOML here)."""
    return " ".join(f"{key}={json.dumps(value)}" for key, value in values.items())


def flower_run_config(config: PeerConfig, data_root: Path, final_model: Path) -> dict:
    """The plain app's run config (``bench/peer_flower_app/pyproject.toml`` names every key)."""
    return {"num-server-rounds": config.rounds, "local-steps": config.steps,
            "batch-size": config.batch_size, "learning-rate": config.lr,
            "momentum": config.momentum, "image-size": config.image_size, "seed": config.seed,
            "fraction-evaluate": 1.0, "min-nodes": config.sites,
            "data-root": str(data_root.resolve()), "final-model": str(final_model.resolve())}


def product_overrides(config: PeerConfig, checkpoints: Path) -> list[str]:
    """``-c KEY=VALUE`` of ``app.tooling.simulate`` (``make simulate TASK=cxr-cls DATA=shared``)."""
    values = {"task": "cxr-cls", "experiment": "peer-flower", "num-server-rounds": config.rounds,
              "local-steps": config.steps, "batch-size": config.batch_size, "lr": config.lr,
              "momentum": config.momentum, "optimizer": "adam", "model-size": "small",
              "image-size": config.image_size, "seed": config.seed, "min-nodes": config.sites,
              "fraction-evaluate": 1.0, "checkpoint-dir": str(checkpoints.resolve())}
    return [item for key, value in values.items() for item in ("-c", f"{key}={value}")]


def convert_sites(config: PeerConfig, cache: Path) -> Path:
    """The 3 Dirichlet site folders of PneumoniaMNIST (``clients.datagen shared``), made once."""
    out = cache / f"sites-{config.sites}-a{config.alpha}-seed{config.seed}"
    if not (out / "done").is_file():
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "clients.datagen", "shared", "--task", "cxr-cls",
                        "--set", "pneumoniamnist", "--shared", str(SHARED),
                        "--sites", str(config.sites), "--scheme", "dirichlet",
                        "--alpha", str(config.alpha), "--seed", str(config.seed),
                        "--out", str(out)], cwd=ROOT, check=True)
        (out / "done").write_text("ok\n")
    return out


def drive_flower(data_root: Path, work: Path, run_config: str, sites: int, timeout: float) -> int:
    """Local Ray, simulation SuperLink, ``flwr run`` of the plain app (``make simulate``'s
    path); 0 when the run finished as ``finished:completed``."""
    from app.tooling.environment import flower_env  # noqa: PLC0415 - the driver process only
    from app.tooling.flwr_cli import write_connection  # noqa: PLC0415
    from app.tooling.local_ray import local_ray  # noqa: PLC0415
    from app.tooling.run_submission import submit_run  # noqa: PLC0415
    from app.tooling.superlink import SuperLinkProcess  # noqa: PLC0415

    flwr_home = (work / "flwr").resolve()
    with local_ray(flower_env(flwr_home)) as address:
        os.environ["RAY_ADDRESS"] = address
        link = SuperLinkProcess.start_simulation(flwr_home, (work / "logs").resolve())
        try:
            write_connection(flwr_home, CONNECTION, link.address)
            outcome = submit_run(flwr_home, run_config, timeout, connection=CONNECTION,
                                 project=APP_DIR, status_timeout=30.0,
                                 on_line=lambda line: print(line, end="", flush=True),
                                 federation_config=f"num-supernodes={sites} "
                                                   "client-resources-num-cpus=1")
        finally:
            link.stop()
    print(f"\nrun {outcome.run_id} status: {outcome.status}", flush=True)
    return 0 if outcome.status == "finished:completed" else 1


def round_ends(app: str, lines: list[tuple[float, str]]) -> dict[int, float]:
    """Seconds (``lines``' clock) at which each round ended, from the app's streamed log."""
    ends: dict[int, float] = {}
    for stamp, line in lines:
        if app == "product":
            match = _PRODUCT_ROUND.search(line)
            if match:
                ends.setdefault(int(match.group(1)), stamp)
            continue
        match = _FLOWER_NEXT.search(line)
        if match and int(match.group(1)) > 1:
            ends.setdefault(int(match.group(1)) - 1, stamp)
        elif _FLOWER_DONE in line and ends:
            ends.setdefault(max(ends) + 1, stamp)
    return ends


def flower_train_seconds(lines: list[tuple[float, str]]) -> list[float]:
    """Per round, the plain app's example-weighted ``train-seconds`` (FedAvg's aggregated line)."""
    found = []
    for _, line in lines:
        match = _AGGREGATED.search(line)
        if match:
            values = ast.literal_eval(match.group(1))
            if "train-seconds" in values:
                found.append(float(values["train-seconds"]))
    return found


def timing(app: str, lines: list[tuple[float, str]], rounds: int) -> dict:
    """``seconds_per_round`` (median from round 2), start-up, per-round seconds.

    Raises
    ------
    RuntimeError
        If a round's end or the submission line is missing from the log.
    """
    ends = round_ends(app, lines)
    submitted = next((stamp for stamp, line in lines if _SUBMITTED.search(line)), None)
    if submitted is None or sorted(ends) != list(range(1, rounds + 1)):
        raise RuntimeError(f"{app}: run not submitted or rounds missing (ends {sorted(ends)})")
    per_round = [ends[r] - ends[r - 1] for r in range(2, rounds + 1)]
    return {"seconds_per_round": round(statistics.median(per_round), 2),
            "seconds_per_round_each": [round(s, 2) for s in per_round],
            "startup_seconds": round(ends[1] - submitted, 2),
            "launch_to_first_round_seconds": round(ends[1], 2)}


@contextmanager
def sampled_tree(pid: int, interval: float) -> Iterator[MemorySampler]:
    """Memory of ``pid``'s process tree, sampled every ``interval`` seconds within the block."""
    sampler = MemorySampler(pid, interval)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    try:
        yield sampler
    finally:
        sampler.stop()
        thread.join()


def run_app(app: str, command: list[str], work: Path, rounds: int, interval: float) -> dict:
    """Run one app's driver, timing its streamed lines and sampling its process tree's memory."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as process, \
            sampled_tree(process.pid, interval) as sampler:
        lines.extend((time.monotonic() - started, line) for line in process.stdout)
        code = process.wait()
    (work / f"{app}.out").write_text("".join(line for _, line in lines))
    if code != 0:
        raise RuntimeError(f"{app}: driver exited {code}; see {work / f'{app}.out'}")
    return {"app": app, **timing(app, lines, rounds),
            "peak_rss_mb": round(sampler.total_rss_peak_kib / 1024, 1),
            "peak_pss_mb": round(sampler.total_pss_peak_kib / 1024, 1),
            "server_peak_mb": round(sampler.server_peak_kib / 1024, 1),
            "wall_seconds": round(time.monotonic() - started, 1), "_lines": lines}


def pooled_test_auc(state: dict, data_root: Path, config: PeerConfig) -> float:
    """ROC AUC of a cxr-cls model (state dict) on every site's held-out test items, pooled."""
    import torch  # noqa: PLC0415

    from clients.cxr_cls.data import load_site  # noqa: PLC0415
    from clients.training.classification import LabelledTensors, evaluate_classifier  # noqa: PLC0415
    from clients.training.trainer import select_device  # noqa: PLC0415
    from models.cxr_densenet import make_cxr_densenet  # noqa: PLC0415

    items = [item for site in sorted(data_root.glob("hospital-*"))
             for item in load_site(site, "test", config.image_size, 1)[0]]
    model = make_cxr_densenet(num_labels=1, small=True)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    result = evaluate_classifier(model, LabelledTensors([i.image for i in items],
                                                        [i.labels for i in items]),
                                 select_device("cpu"), batch_size=64)
    return round(result.metrics["auc"], 4)


def product_final_state(tracking_uri: str) -> dict:
    """The product's final global model: its run's logged ``global-model`` (as ``make predict`` reads it)."""
    import mlflow  # noqa: PLC0415
    from app.model_source import load_state_dict_from  # noqa: PLC0415
    from models.cxr_densenet import make_cxr_densenet  # noqa: PLC0415
    mlflow.set_tracking_uri(tracking_uri)
    run, = mlflow.search_runs(search_all_experiments=True, output_format="list")
    return {name: tensor.numpy() for name, tensor in load_state_dict_from(
        f"runs:/{run.info.run_id}/global-model", make_cxr_densenet(num_labels=1, small=True)).items()}


def product_phases(tracking_uri: str) -> dict:
    """Medians over rounds 2.. of the product's round reports (MLflow): where a round's time goes."""
    import mlflow  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient()
    run, = mlflow.search_runs(search_all_experiments=True, output_format="list")

    def history(suffix: str) -> dict[int, list[float]]:
        by_round: dict[int, list[float]] = {}
        for key in run.data.metrics:
            if key == suffix or (key.startswith("site/") and key.endswith("/" + suffix)):
                for m in client.get_metric_history(run.info.run_id, key):
                    by_round.setdefault(m.step, []).append(m.value)
        return by_round

    rounds, train, train_reply, eval_reply = (history(s) for s in (
        "round-seconds", "train-seconds", "train-reply-seconds", "evaluate-reply-seconds"))
    later = [r for r in sorted(rounds) if r >= 2]
    phase = {"round_seconds": [rounds[r][0] for r in later],
             "site_train_seconds_mean": [statistics.mean(train[r]) for r in later],
             "train_reply_seconds_max": [max(train_reply[r]) for r in later],
             "evaluate_reply_seconds_max": [max(eval_reply[r]) for r in later]}
    phase["rest_seconds"] = [r - t - e for r, t, e in zip(*(phase[k] for k in (
        "round_seconds", "train_reply_seconds_max", "evaluate_reply_seconds_max")))]
    medians = {key: round(statistics.median(values), 2) for key, values in phase.items()}
    medians["product_test_auc_selected_model"] = run.data.metrics.get("test/auc")
    return medians


def summary(runs: list[dict], config: PeerConfig) -> dict:
    """The JSON of ``bench/results/peer_flower.json``: the runs and product / flower ratios."""
    by_app = {r["app"]: r for r in runs}
    flower, product = by_app["flower"], by_app["product"]

    def ratio(key: str) -> float:
        return round(product[key] / flower[key], 2)

    return {"runs": runs,
            "ratio_seconds_per_round": ratio("seconds_per_round"),
            "ratio_startup_seconds": ratio("startup_seconds"),
            "ratio_peak_rss_mb": ratio("peak_rss_mb"),
            "setup": {**dataclasses.asdict(config), "task": "cxr-cls", "model_size": "small",
                      "optimizer": "adam", "data": "pneumoniamnist dirichlet",
                      "cpus_per_site": 1, "cpus": os.cpu_count(),
                      "machine": platform.processor() or platform.machine(),
                      "engine": "Ray (flower-superlink --simulation, flwr run)"}}


def app_command(app: str, config: PeerConfig, data_root: Path, work: Path,
                timeout: float) -> list[str]:
    """The driver of one app: ``drive-flower`` (this script) or ``app.tooling.simulate``."""
    if app == "flower":
        run_config = flower_run_config(config, data_root, work / "final_model.pt")
        return [sys.executable, str(Path(__file__).resolve()), "drive-flower",
                "--data-root", str(data_root), "--work", str(work), "--sites", str(config.sites),
                "--timeout", str(timeout), "--run-config", run_config_string(run_config)]
    return [sys.executable, "-m", "app.tooling.simulate", "--data-root", str(data_root),
            "--sites", str(config.sites), "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}",
            "--artifact-root", str(work / "artifacts"), "--flwr-home", str(work / "flwr"),
            "--log-dir", str(work / "logs"), "--timeout", str(timeout),
            *product_overrides(config, work / "checkpoints")]


def run_pair(config: PeerConfig, cache: Path, interval: float, timeout: float,
             order: tuple[str, ...] = ("flower", "product")) -> dict:
    """Both apps on the same site folders, one after the other in ``order``; the summary."""
    import torch  # noqa: PLC0415

    data_root = convert_sites(config, cache)
    runs = []
    for app in order:
        work = cache / f"run-{app}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        result = run_app(app, app_command(app, config, data_root, work, timeout), work,
                         config.rounds, interval)
        lines = result.pop("_lines")
        if app == "flower":
            state = {k: v.numpy() for k, v in torch.load(work / "final_model.pt").items()}
            result["site_train_seconds_each"] = [round(s, 2) for s in flower_train_seconds(lines)]
        else:
            state = product_final_state(f"sqlite:///{work / 'mlflow.db'}")
            result["phases"] = product_phases(f"sqlite:///{work / 'mlflow.db'}")
        result["final_auc"] = pooled_test_auc(state, data_root, config)
        print(json.dumps(result), flush=True)
        runs.append(result)
    return summary(runs, config)


def summary_with_previous(result: dict, out: Path) -> dict:
    """``result`` with the earlier measurements of the same setup kept under ``repeats``."""
    if out.is_file():
        previous = json.loads(out.read_text())
        if previous.get("setup") == result["setup"]:
            result["repeats"] = [*previous.get("repeats", []),
                                 {k: previous[k] for k in previous if k not in ("setup", "repeats")}]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    drive = sub.add_parser("drive-flower", help="run the plain app once (the bench calls it)")
    drive.add_argument("--data-root", type=Path, required=True)
    drive.add_argument("--work", type=Path, required=True)
    drive.add_argument("--sites", type=int, default=3)
    drive.add_argument("--timeout", type=float, default=3600.0)
    drive.add_argument("--run-config", required=True)
    defaults = PeerConfig()
    for field in dataclasses.fields(PeerConfig):
        default = getattr(defaults, field.name)
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(default),
                            default=default)
    parser.add_argument("--first", choices=("flower", "product"), default="flower",
                        help="which app runs first (alternate between repeats)")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/fedmed-bench-peer"))
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=3000.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.command == "drive-flower":
        return drive_flower(args.data_root, args.work, args.run_config, args.sites, args.timeout)
    config = PeerConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PeerConfig)})
    order = ("flower", "product") if args.first == "flower" else ("product", "flower")
    result = summary_with_previous(
        run_pair(config, args.cache, args.interval, args.timeout, order), args.out)
    write_report(args.out, result)
    print(f"product / flower seconds per round: {result['ratio_seconds_per_round']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
