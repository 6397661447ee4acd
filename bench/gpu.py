"""The clinical presets on one GPU: trainer vs bare AMP, DP-SGD vs plain, a 3-site round, pruning.

One prepared script for the reference GPU (issue 49): under 10 minutes on one GPU, it writes
``bench/results/gpu.json``. For each clinical preset (``configs/*-clinical*.toml``: the
preset's task, sizes, network and batch) on a synthetic hospital of the task's own generator
(few studies: what is measured is throughput; every task resizes its images to the preset's
size, and its sampler draws with replacement):

* **ours over bare AMP**: the product's trainer, driven as the ClientApp drives it
  (:func:`trainer_throughput.run_ours`: :meth:`SiteTask.train`, so
  :func:`clients.training.trainer.train_steps` with the task's model, loss, Adam and loader),
  against a bare PyTorch AMP loop on the same batches (:func:`run_bare_amp`: the task's own
  loader with the same seed, ``torch.autocast`` in the device's dtype, bf16 where supported,
  GradScaler only for fp16, channels-last for the 2D networks, pinned memory and loader
  workers as :func:`~clients.training.trainer.select_device` sets them). Interleaved pairs
  (ours-bare, bare-ours, ...) after a warm-up; the ratio is the median over pairs of
  bare seconds / ours seconds (samples per second ours / bare; goal >= 0.9). Beside it the
  preset's seconds per step and, on CUDA, its peak GPU memory (the numbers a preset states).
* **DP over plain**: DP-SGD (Opacus, sigma 1, C 1, the product's grad-sample mode, on
  ``build_model(private=True)``, full precision as the product runs it) against plain
  training, both through :meth:`SiteTask.train`: median over pairs of DP-SGD's seconds per
  example over plain training's (a cost: 1 = free; goal <= 2). Note that
  ``bench/dp_throughput.py``'s ``dp_over_plain`` is the inverse (a throughput ratio).
* **round over training** (the 512 px PE preset only): a 3-site in-process federation of the
  product (:func:`engine_runs.run_product`: the real ServerApp and ClientApp, sites one after
  the other in :class:`app.engine.grid.InProcessGrid`), no evaluation stage; per round its
  wall seconds over the sum of the sites' reported ``train-seconds`` (median over the rounds
  after the first; 1 = no overhead). The sites choose their device as a site does
  (``select_device()``: CUDA when there is one, whatever ``--device`` says).
* **structured pruning's speed-up** (2D presets): :func:`pruning_speed.measure` (PruneFL's
  initial structured pruning at density 0.5, the network torch-pruning cuts out) on the
  preset's sizes: training samples per second of the pruned network over the dense one.

On CUDA it sets ``torch.backends.cudnn.benchmark``. ``--quick`` runs every part at tiny sizes
(small networks, 32 px, 2 steps, 1 pair, 1 round) so that the script runs in CI on CPU and
cannot rot; its numbers are no GPU result.

Usage::

    .venv/bin/python bench/gpu.py [--device auto|cpu|cuda] [--quick] [--steps 20]
        [--pairs 3] [--rounds 2] [--presets pe-seg-clinical ...] [--output bench/results/gpu.json]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from single_thread import ROOT  # noqa: F401,I001 - first: one BLAS thread, the project importable

import torch  # noqa: E402

import pruning_speed  # noqa: E402
from engine_runs import run_product  # noqa: E402
from report import Column, environment, print_table, write_report  # noqa: E402
from trainer_throughput import LR, MOMENTUM, SEED, Run, run_bare, run_ours  # noqa: E402

from app.config.run_config import RunConfig  # noqa: E402
from app.engine import VirtualSite  # noqa: E402
from clients.datagen.federation import SyntheticFederation  # noqa: E402
from clients.registry import synthetic_module, task_class  # noqa: E402
from clients.training.private_training import DpSettings  # noqa: E402
from clients.training.site_task import SiteTask, TaskSettings  # noqa: E402
from clients.training.trainer import ComputeDevice, select_device  # noqa: E402

__all__ = ["PRESETS", "QUICK_SIZES", "preset_values", "preset_settings", "few_study_sites",
           "run_bare_amp", "trainer_vs_bare", "dp_vs_plain", "federation_round",
           "pruning_speedup", "main"]

DEFAULT_OUTPUT = ROOT / "bench" / "results" / "gpu.json"
#: The clinical presets (issue 49), by name (``configs/<name>.toml``).
PRESETS = ("pe-seg-clinical", "cxr-cls-clinical", "cxr-cls-clinical-512", "ct3d-cls-clinical")
#: The preset whose 3-site federation is timed.
FEDERATED_PRESET = "pe-seg-clinical"
FEDERATION_SITES = 3
#: Tasks whose network pruning_speed cuts (2D networks; the ConvLSTM is not measured).
PRUNED_TASKS = ("pe-seg", "cxr-cls")
PRUNING_DENSITY = 0.5
#: ``--quick``: the sizes every preset is overridden with (CPU, CI).
QUICK_SIZES: Mapping[str, Mapping[str, Any]] = {
    "pe-seg": {"image-size": 32, "slab-slices": 3, "batch-size": 2, "model-size": "small"},
    "cxr-cls": {"image-size": 32, "model-size": "small", "batch-size": 2,
                "augmentation": "none"},
    "ct3d-cls": {"image-size": 16, "volume-depth": 8, "model-size": "small", "batch-size": 2},
}
#: Per task: the profile field holding its number of studies (images) and the cap kept,
#: (full, quick); the slice range of the volumes in quick mode.
_STUDY_FIELD = {"pe-seg": ("num_studies", 6, 4), "cxr-cls": ("num_images", 64, 12),
                "ct3d-cls": ("num_studies", 8, 6)}
_QUICK_SLICES = (8, 10)
#: Generator image size per task (the tasks resize to the preset's size).
_SITE_IMAGE_SIZE = {"pe-seg": 96, "cxr-cls": 64, "ct3d-cls": 64}
_QUICK_SITE_IMAGE_SIZE = {"pe-seg": 32, "cxr-cls": 32, "ct3d-cls": 16}
_DP = DpSettings(noise_multiplier=1.0, max_grad_norm=1.0)
TARGETS = {"ours_over_bare_amp": ">= 0.9", "dp_over_plain": "<= 2",
           "round_over_training": "close to 1 (no target in the issue)"}


def preset_values(name: str, quick: bool = False) -> dict[str, Any]:
    """The run-config values of ``configs/<name>.toml`` (``--quick``: :data:`QUICK_SIZES`),
    checked as the ServerApp checks them."""
    path = ROOT / "configs" / f"{name}.toml"
    if not path.is_file():
        raise ValueError(f"bench/gpu.py: no preset {path}")
    values = tomllib.loads(path.read_text())
    if quick:
        values.update(QUICK_SIZES[values["task"]])
    RunConfig.from_mapping(values)
    return values


def preset_settings(values: Mapping[str, Any]) -> TaskSettings:
    """The task settings of a preset's values."""
    return RunConfig.from_mapping(values).task_settings()


def few_study_sites(task: str, root: Path, num_sites: int, quick: bool) -> list[Path]:
    """``num_sites`` synthetic hospitals of ``task``'s generator with few studies each."""
    module = synthetic_module(task)
    field, full_cap, quick_cap = _STUDY_FIELD[task]
    cap = quick_cap if quick else full_cap
    base: SyntheticFederation = module.generate_federation

    def profiles(n: int, seed: int) -> list:
        out = []
        for profile in base.profiles(n, seed):
            profile = replace(profile, **{field: min(getattr(profile, field), cap)})
            if quick and hasattr(profile, "num_slices"):
                profile = replace(profile, num_slices=_QUICK_SLICES)
            out.append(profile)
        return out

    size = (_QUICK_SITE_IMAGE_SIZE if quick else _SITE_IMAGE_SIZE)[task]
    return replace(base, profiles=profiles)(root / task, num_sites=num_sites, seed=0,
                                            image_size=size)


def run_bare_amp(task: SiteTask, steps: int, compute: ComputeDevice) -> Run:
    """A bare PyTorch AMP loop on the task's batches; (steps, samples, wall s, CPU s).

    The PyTorch AMP recipe (:func:`trainer_throughput.run_bare` fed by ``compute``): autocast
    in ``compute``'s dtype, a GradScaler only for fp16, channels-last 2D inputs and weights
    where the task allows it, the task's own loader (same seed: the same batches as
    :func:`run_ours`; pinned memory and workers as ``compute`` says).
    """
    return run_bare(task, steps, compute.device, feed=compute)


def _pairs(first: Callable[[], Any], second: Callable[[], Any], pairs: int) -> list[tuple]:
    """``pairs`` (first, second) results, alternating which runs first, after a warm-up pair."""
    first(), second()
    out = []
    for k in range(pairs):
        if k % 2 == 0:
            a = first()
            out.append((a, second()))
        else:
            b = second()
            out.append((first(), b))
    return out


def _peak_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2 ** 30


def trainer_vs_bare(task: SiteTask, compute: ComputeDevice, steps: int, pairs: int) -> dict:
    """Ours over the bare AMP loop (median over pairs), our seconds per step and peak memory."""
    device = compute.device
    run_ours(task, 1, compute)  # allocator and cudnn autotuning before the peak is read
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    results = _pairs(lambda: run_ours(task, steps, compute),
                     lambda: run_bare_amp(task, steps, compute), pairs)
    for ours, bare in results:
        if ours[:2] != bare[:2]:
            raise RuntimeError(f"bench/gpu.py: ours and bare did different work: {ours} vs {bare}")
    return {"ours_over_bare_amp": statistics.median(b[2] / a[2] for a, b in results),
            "seconds_per_step": statistics.median(a[2] for a, _ in results) / steps,
            "bare_seconds_per_step": statistics.median(b[2] for _, b in results) / steps,
            "gpu_memory_gib": _peak_gib(device), "steps": steps, "pairs": pairs}


def _seconds_per_example(task: SiteTask, compute: ComputeDevice, steps: int,
                         private: bool) -> float:
    torch.manual_seed(SEED)
    model = task.build_model(private=private)
    result = task.train(model, steps, LR, MOMENTUM, compute, SEED, optimizer="adam",
                        privacy=_DP if private else None)
    return result.seconds / max(result.num_examples, 1)


def dp_vs_plain(task: SiteTask, compute: ComputeDevice, steps: int, pairs: int) -> dict:
    """DP-SGD's seconds per example over plain training's, both through ``task.train``."""
    results = _pairs(lambda: _seconds_per_example(task, compute, steps, False),
                     lambda: _seconds_per_example(task, compute, steps, True), pairs)
    return {"dp_over_plain": statistics.median(d / p for p, d in results),
            "plain_seconds_per_example": statistics.median(p for p, _ in results),
            "dp_seconds_per_example": statistics.median(d for _, d in results),
            "dp_precision": "float32 (the product's DP-SGD)", "noise_multiplier": 1.0,
            "max_grad_norm": 1.0}


def federation_round(values: Mapping[str, Any], sites: list[Path], steps: int, rounds: int,
                     workdir: Path) -> dict:
    """A federation of the product on ``sites``: round seconds over the sites' train seconds."""
    overrides = {**values, "num-server-rounds": rounds, "local-steps": steps,
                 "min-nodes": len(sites), "fraction-evaluate": 0.0}
    outcome, wall = run_product(overrides, [VirtualSite.folder(s) for s in sites], workdir)
    per_round = []
    for number in sorted(outcome.reports):
        report = outcome.reports[number]
        trained = sum(m.get("train-seconds", 0.0) for m in report.train.values())
        if len(report.train) != len(sites) or trained <= 0:
            raise RuntimeError(f"bench/gpu.py: round {number} trained {sorted(report.train)} "
                               f"({trained} s), dropped {report.train_dropped}")
        per_round.append({"round": number, "seconds": report.seconds,
                          "sites_train_seconds": trained})
    kept = per_round[1:] or per_round  # round 1 pays the sites' data loading and warm-up
    return {"round_over_training": statistics.median(r["seconds"] / r["sites_train_seconds"]
                                                     for r in kept),
            "federation": {"sites": len(sites), "rounds": rounds, "local_steps": steps,
                           "wall_seconds": wall, "per_round": per_round,
                           "site_device": str(select_device().device)}}


def pruning_speedup(task_name: str, settings: TaskSettings, compute: ComputeDevice,
                    steps: int, repeats: int) -> dict:
    """Structured pruning's training speed-up (:func:`pruning_speed.measure`)."""
    row = pruning_speed.measure(task_name, settings, PRUNING_DENSITY, steps, repeats, compute)
    structured = row["variants"]["structured"]
    return {"structured_pruning_speedup": structured["train_speedup"],
            "structured_pruning_predict_speedup": structured["predict_speedup"],
            "pruning_density": PRUNING_DENSITY,
            "pruned_params": structured["params"],
            "dense_params": row["variants"]["dense"]["params"]}


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def measure_preset(name: str, args: argparse.Namespace, compute: ComputeDevice,
                   root: Path, log: Callable[[str], None]) -> dict:
    """Every measurement of one preset; its row of ``runs``."""
    values = preset_values(name, args.quick)
    settings = preset_settings(values)
    task_name = values["task"]
    num_sites = FEDERATION_SITES if name == FEDERATED_PRESET else 1
    started = time.perf_counter()
    sites = few_study_sites(task_name, root / name, num_sites, args.quick)
    task = task_class(task_name)(sites[0], settings)
    log(f"{name}: {len(task.train_set)} training items at site 1 "
        f"(data {time.perf_counter() - started:.1f} s)")
    params = sum(p.numel() for p in task.build_model().parameters())
    row: dict[str, Any] = {"preset": name, "task": task_name, "params": params,
                           "settings": {k: values[k] for k in sorted(values)}}
    row.update(trainer_vs_bare(task, compute, args.steps, args.pairs))
    log(f"  ours / bare AMP {row['ours_over_bare_amp']:.3f}, "
        f"{row['seconds_per_step']:.3f} s/step")
    row.update(dp_vs_plain(task, compute, args.steps, args.pairs))
    log(f"  DP-SGD / plain {row['dp_over_plain']:.3f}")
    row["round_over_training"] = None
    if name == FEDERATED_PRESET:
        row.update(federation_round(values, sites, args.steps, args.rounds, root / "mlflow"))
        log(f"  round / sites' training {row['round_over_training']:.3f}")
    row["structured_pruning_speedup"] = None
    if task_name in PRUNED_TASKS:
        row.update(pruning_speedup(task_name, settings, compute, args.steps, args.pairs))
        log(f"  structured pruning x{row['structured_pruning_speedup']:.2f}")
    return row


def _device_name(compute: ComputeDevice) -> str:
    if compute.device.type == "cuda":
        return torch.cuda.get_device_name(compute.device)
    return f"cpu x{torch.get_num_threads()} threads"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes, small networks, 2 steps, 1 pair, 1 round (CI on CPU)")
    p.add_argument("--steps", type=int, default=None, help="steps per measurement (20)")
    p.add_argument("--pairs", type=int, default=None, help="interleaved pairs (3)")
    p.add_argument("--rounds", type=int, default=None, help="federation rounds (2)")
    p.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS)
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    quick_defaults = (2, 1, 1) if args.quick else (20, 3, 2)
    for key, default in zip(("steps", "pairs", "rounds"), quick_defaults):
        if getattr(args, key) is None:
            setattr(args, key, default)
        if getattr(args, key) < 1:
            raise SystemExit(f"bench/gpu.py: --{key} must be >= 1, got {getattr(args, key)}")

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    wall = time.perf_counter()
    compute = select_device(args.device)
    if compute.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        for name in args.presets:
            rows.append(measure_preset(name, args, compute, Path(tmp), say))
    report = {
        "benchmark": "gpu", "device": _device_name(compute),
        "device_type": compute.device.type, "quick": args.quick,
        "amp_dtype": str(compute.amp_dtype).replace("torch.", "") if compute.amp_dtype else None,
        "channels_last": compute.channels_last, "loader_workers": compute.loader_workers,
        "pin_memory": compute.pin_memory,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "torch": torch.__version__, **environment(), "threads": torch.get_num_threads(),
        "argv": sys.argv[1:] if argv is None else list(argv), "targets": TARGETS,
        "targets_met": {
            "ours_over_bare_amp": all(r["ours_over_bare_amp"] >= 0.9 for r in rows),
            "dp_over_plain": all(r["dp_over_plain"] <= 2.0 for r in rows)},
        "wall_seconds": round(time.perf_counter() - wall, 1),
        "runs": rows,
    }
    write_report(args.output, report, allow_nan=False)
    num = lambda key, spec: (lambda r: format(r[key], spec) if _finite(r[key]) else "-")  # noqa: E731
    print_table(f"bench/gpu.py on {report['device']}{' (--quick)' if args.quick else ''}", [
        Column("preset", "<22", lambda r: r["preset"]),
        Column("params", "11,d", lambda r: r["params"]),
        Column("s/step", ">8", num("seconds_per_step", ".3f")),
        Column("GiB", ">6", num("gpu_memory_gib", ".2f")),
        Column("ours/bare AMP", ">13", num("ours_over_bare_amp", ".3f")),
        Column("DP/plain", ">8", num("dp_over_plain", ".2f")),
        Column("round/train", ">11", num("round_over_training", ".3f")),
        Column("pruned x", ">8", num("structured_pruning_speedup", ".2f")),
    ], rows)
    print(f"wall {report['wall_seconds']} s -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
