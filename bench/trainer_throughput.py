"""Throughput of the client trainer vs a bare PyTorch loop, for the three site tasks.

For each task model (pe-seg 2.5D U-Net on 64 px slabs, cxr-cls small DenseNet on
64 px radiographs, ct3d-cls small ConvLSTM on 16 x 32 x 32 volumes) this measures
samples per second of

* **ours**: :meth:`clients.training.site_task.SiteTask.train` (so
  :func:`clients.training.trainer.train_steps` with the task's model factory, loss, Adam
  and the task's ``_train_loader``), and
* **bare**: the same model, loss, Adam, DataLoader, batch size and number of
  steps in a plain ``for x, y in loader: zero_grad / forward / loss / backward /
  step`` loop (no progress logging, no extra host syncs).

Each measurement builds a fresh model (same seed), optimiser and loader, so both
loops see the same data. One warm-up pair first (also used to size the number of
steps to ~``--seconds`` per measurement), then ``--repeats`` alternating pairs
(ours-bare, bare-ours, ours-bare, ...). Reported: median (and best) samples/s of
each loop and the ratio ours / bare (target >= 0.9) as the median over pairs of
the per-pair ratio (robust to the load of a shared machine changing between
pairs), with the ratio of medians, of bests and of CPU time alongside.

On CUDA (when available) it is also measured on the GPU: ours uses AMP via
:func:`clients.training.trainer.select_device`; the bare loop runs once in plain fp32 and
once with the same autocast dtype (and GradScaler for fp16). The ratio on GPU is
ours / bare-AMP (like for like).

Results go to ``bench/results/trainer_throughput.json`` and a markdown table is
printed. Usage::

    python bench/trainer_throughput.py [--threads 1] [--seconds 3] [--repeats 3]
        [--models pe-seg cxr-cls ct3d-cls] [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clients.registry import synthetic_module, task_class  # noqa: E402
from clients.training.trainer import ComputeDevice, select_device  # noqa: E402
from clients.training.site_task import SiteTask, TaskSettings  # noqa: E402

DEFAULT_OUTPUT = ROOT / "bench" / "results" / "trainer_throughput.json"
MODELS = ("pe-seg", "cxr-cls", "ct3d-cls")
LR = 1e-3
MOMENTUM = 0.9
SEED = 0
TARGET_RATIO = 0.9
#: Image size of the generated hospital per model (the generator's ``image_size``).
SITE_IMAGE_SIZE = {"pe-seg": 96, "cxr-cls": 64, "ct3d-cls": 64}


def task_settings(name: str, batch: int) -> TaskSettings:
    """The benchmark's settings per model."""
    if name == "pe-seg":
        return TaskSettings(image_size=64, slab_slices=9, batch_size=batch)
    if name == "cxr-cls":
        return TaskSettings(image_size=64, batch_size=batch, model_size="small")
    if name == "ct3d-cls":
        return TaskSettings(image_size=32, volume_depth=16, batch_size=batch,
                            model_size="small")
    raise ValueError(f"unknown model {name!r}; choose from {MODELS}")


def generate_site(name: str, root: Path) -> Path:
    """Write one tiny synthetic hospital for ``name`` under ``root``; return its folder."""
    if name not in SITE_IMAGE_SIZE:
        raise ValueError(f"unknown model {name!r}; choose from {MODELS}")
    root.mkdir(parents=True, exist_ok=True)
    return synthetic_module(name).generate_federation(
        root, num_sites=1, seed=0, image_size=SITE_IMAGE_SIZE[name])[0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


Run = tuple[int, int, float, float]  # (steps, samples, wall s, process CPU s)


def run_ours(task: SiteTask, steps: int, compute: ComputeDevice) -> Run:
    """Our trainer, driven as the ClientApp does: ``task.train``. Returns (steps, samples, wall s, CPU s)."""
    torch.manual_seed(SEED)
    model = task.build_model()
    _sync(compute.device)
    start, cpu = time.perf_counter(), time.process_time()
    result = task.train(model, steps, LR, MOMENTUM, compute, SEED, optimizer="adam")
    _sync(compute.device)
    return (result.steps_done, result.num_examples, time.perf_counter() - start,
            time.process_time() - cpu)


def run_bare(task: SiteTask, steps: int, device: torch.device,
             amp_dtype: torch.dtype | None = None, feed: ComputeDevice | None = None) -> Run:
    """Plain PyTorch loop over the same model, loss, Adam and loader. Returns (steps, samples, wall s, CPU s).

    ``amp_dtype`` (CUDA only) wraps forward + loss in autocast (GradScaler for fp16).
    ``feed``: the PyTorch AMP recipe of that device instead (its autocast dtype, a GradScaler
    only for fp16, channels-last 2D inputs and weights where the task allows it, the task's
    loader with pinned memory and workers as it says: ``bench/gpu.py``'s bare AMP loop).
    """
    torch.manual_seed(SEED)
    model = task.build_model()
    _sync(device)
    start, cpu = time.perf_counter(), time.process_time()
    # Same per-call setup as SiteTask.train: seed, move, fresh Adam, fresh loader.
    torch.manual_seed(SEED)
    layout = (torch.channels_last if feed is not None and feed.channels_last and task.channels_last_ok
              else torch.preserve_format)
    model.to(device, memory_format=layout)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=(MOMENTUM, 0.999))
    # A plain loader unless ``feed``: no pinned memory, no workers (what a bare loop would write).
    loader = task._train_loader(SEED, feed or ComputeDevice(torch.device("cpu"), None))
    loss_fn = task.loss_fn()
    if feed is not None:
        autocast, fp16 = feed.autocast(), feed.needs_grad_scaler
    else:
        autocast = (torch.autocast(device_type=device.type, dtype=amp_dtype)
                    if amp_dtype is not None else nullcontext())
        fp16 = amp_dtype is torch.float16
    # The PyTorch AMP recipe: a disabled scaler passes the loss and the step through.
    scaler = torch.amp.GradScaler("cuda", enabled=fp16)
    non_blocking = device.type == "cuda"
    done = samples = 0
    while done < steps:
        for x, y in loader:
            x = x.to(device, non_blocking=non_blocking,
                     memory_format=layout if x.dim() == 4 else torch.preserve_format)
            y = y.to(device, non_blocking=non_blocking)
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            done += 1
            samples += x.shape[0]
            if done == steps:
                break
    _sync(device)
    return done, samples, time.perf_counter() - start, time.process_time() - cpu


@dataclass
class LoopStats:
    """Repeats of one loop: samples per wall second (median, best), per CPU second, raw times."""

    samples_per_s: float
    best_samples_per_s: float
    samples_per_cpu_s: float
    steps: int
    samples: int
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)


@dataclass
class ModelResult:
    """One model on one device: ours vs bare (and bare AMP on CUDA)."""

    model: str
    device: str
    threads: int
    batch: int
    steps: int
    ours: LoopStats
    bare: LoopStats
    ratio: float
    ratio_of_medians: float
    best_ratio: float
    cpu_ratio: float
    bare_amp: LoopStats | None = None
    ratio_vs_bare_fp32: float | None = None
    amp_dtype: str | None = None
    target_met: bool = False


def _stats(runs: list[Run]) -> LoopStats:
    steps = {r[0] for r in runs}
    samples = {r[1] for r in runs}
    if len(steps) != 1 or len(samples) != 1:
        raise RuntimeError(f"repeats disagree on steps/samples: {runs}")
    n = runs[0][1]
    rates = [n / r[2] for r in runs]
    return LoopStats(samples_per_s=statistics.median(rates), best_samples_per_s=max(rates),
                     samples_per_cpu_s=statistics.median(n / r[3] for r in runs),
                     steps=runs[0][0], samples=n, seconds=[round(r[2], 4) for r in runs],
                     cpu_seconds=[round(r[3], 4) for r in runs])


def measure_model(task: SiteTask, name: str, compute: ComputeDevice, threads: int,
                  seconds: float = 3.0, repeats: int = 3, steps: int | None = None,
                  min_steps: int = 4, max_steps: int = 2000,
                  log: Callable[[str], None] = lambda _m: None) -> ModelResult:
    """Warm up, size the steps to ~``seconds`` (unless ``steps`` given), then ABAB repeats.

    On CUDA, ``compute`` should be the AMP device of ``select_device``; the bare
    loop then also runs with the same autocast dtype (ours / bare-AMP is the ratio).
    """
    device = compute.device
    cuda = device.type == "cuda"
    loops: dict[str, Callable[[int], Run]] = {
        "ours": lambda n: run_ours(task, n, compute),
        "bare": lambda n: run_bare(task, n, device),
    }
    if cuda and compute.amp_dtype is not None:
        loops["bare_amp"] = lambda n: run_bare(task, n, device, compute.amp_dtype)
    # Warm-up (allocator, kernels, caches); the bare warm-up also sizes the steps.
    warm = min_steps if steps is None else max(1, min(steps, min_steps))
    for key, loop in loops.items():
        if key != "bare":
            loop(warm)
    t = loops["bare"](warm)[2]
    if steps is None:
        per_step = t / warm
        steps = int(min(max_steps, max(min_steps, math.ceil(seconds / max(per_step, 1e-6)))))
    log(f"{name} on {device}: {steps} steps per measurement "
        f"(warm-up {t / warm * 1e3:.0f} ms/step)")
    runs: dict[str, list[Run]] = {k: [] for k in loops}
    for i in range(repeats):
        # AB, BA, AB, ...: alternate which loop goes first, so that neither always
        # inherits the other's allocator/cache state or a load trend.
        order = list(loops) if i % 2 == 0 else list(reversed(loops))
        for key in order:
            runs[key].append(loops[key](steps))
            log(f"  repeat {i + 1} {key}: {runs[key][-1][2]:.2f} s "
                f"(CPU {runs[key][-1][3]:.2f} s)")
    stats = {k: _stats(v) for k, v in runs.items()}
    if stats["ours"].samples != stats["bare"].samples or stats["ours"].steps != stats["bare"].steps:
        raise RuntimeError(f"ours and bare differ: {stats['ours']} vs {stats['bare']}")
    ref_key = "bare_amp" if "bare_amp" in stats else "bare"
    ref = stats[ref_key]
    # Primary ratio: within each adjacent (ours, bare) pair, median over pairs; robust to
    # the load of a shared machine drifting between pairs. Equal samples, so the ratio of
    # rates is bare time / ours time.
    ratio = statistics.median(b[2] / a[2] for a, b in zip(runs["ours"], runs[ref_key]))
    return ModelResult(
        model=name, device=str(device), threads=threads, batch=task.settings.batch_size,
        steps=steps, ours=stats["ours"], bare=stats["bare"], ratio=ratio,
        ratio_of_medians=stats["ours"].samples_per_s / ref.samples_per_s,
        best_ratio=stats["ours"].best_samples_per_s / ref.best_samples_per_s,
        cpu_ratio=stats["ours"].samples_per_cpu_s / ref.samples_per_cpu_s,
        bare_amp=stats.get("bare_amp"),
        ratio_vs_bare_fp32=(stats["ours"].samples_per_s / stats["bare"].samples_per_s
                            if "bare_amp" in stats else None),
        amp_dtype=str(compute.amp_dtype).replace("torch.", "") if compute.amp_dtype else None,
        target_met=ratio >= TARGET_RATIO,
    )


def markdown_table(results: list[ModelResult]) -> str:
    lines = ["| model | device | threads | batch | steps | ours (samples/s) | bare (samples/s) "
             "| bare AMP (samples/s) | ratio ours/bare (median of pairs) "
             "| ratio of medians | ratio of bests | ratio (CPU time) | >= 0.9 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        amp = f"{r.bare_amp.samples_per_s:.1f}" if r.bare_amp else "-"
        lines.append(
            f"| {r.model} | {r.device} | {r.threads} | {r.batch} | {r.steps} "
            f"| {r.ours.samples_per_s:.1f} | {r.bare.samples_per_s:.1f} | {amp} "
            f"| {r.ratio:.3f} | {r.ratio_of_medians:.3f} | {r.best_ratio:.3f} | {r.cpu_ratio:.3f} "
            f"| {'yes' if r.target_met else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--seconds", type=float, default=3.0, help="target s per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="fixed steps (skip sizing)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    wall = time.perf_counter()
    cpu = select_device("cpu")           # may apply FEDMED_TORCH_THREADS; --threads wins
    torch.set_num_threads(args.threads)
    devices = [cpu]
    notes = []
    if torch.cuda.is_available():
        devices.append(select_device("cuda"))
    else:
        notes.append("CUDA not available: GPU measurement (ours AMP vs bare fp32 / bare AMP) "
                     "skipped.")
        say(notes[-1])
    results: list[ModelResult] = []
    with tempfile.TemporaryDirectory(prefix="trainer_bench_") as tmp:
        for name in args.models:
            t0 = time.perf_counter()
            site = generate_site(name, Path(tmp) / name)
            task = task_class(name)(site, task_settings(name, args.batch))
            say(f"{name}: {len(task.train_set)} training items "
                f"(data {time.perf_counter() - t0:.1f} s)")
            for compute in devices:
                results.append(measure_model(task, name, compute, args.threads,
                                             seconds=args.seconds, repeats=args.repeats,
                                             steps=args.steps, log=say))
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    payload = {
        "benchmark": "trainer_throughput",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "threads": args.threads,
        "load_average_1_5_15": load,
        "repeats": args.repeats,
        "seconds_per_measurement": args.seconds,
        "statistic": "ours/bare samples per wall second. ratio (target_met uses it) = "
                     "median over the adjacent (ours, bare) pairs of the per-pair ratio; "
                     "ratio_of_medians = median ours / median bare; best_ratio = best / "
                     "best; cpu_ratio = samples per process CPU "
                     "second (less sensitive to time-slicing by other processes; shared caches still count); on CUDA "
                     "the reference is the bare AMP loop",
        "target_ratio": TARGET_RATIO,
        "all_targets_met": all(r.target_met for r in results),
        "wall_seconds": round(time.perf_counter() - wall, 1),
        "notes": notes,
        "results": [asdict(r) for r in results],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(payload, indent=2) + "\n")
    print(markdown_table(results))
    print(f"\ntorch {torch.__version__}, threads {args.threads}, load average {load}, "
          f"wall {payload['wall_seconds']} s -> {args.output}")
    for note in notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(main())
