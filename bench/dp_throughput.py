"""DP-SGD's cost per sample against plain training, for the three tasks' models.

For each task (cxr-cls small DenseNet, pe-seg 2.5D U-Net, ct3d-cls small
ConvLSTM) a synthetic hospital is written by the task's own generator and the
product's :meth:`clients.training.site_task.SiteTask.train` is timed both ways,
as a site trains:

- **plain**: the task's plain model (``build_model()``: BatchNorm where the
  network has it, slices folded into the batch), plain training;
- **dp**: the DP-compatible model (``build_model(private=True)``) under DP-SGD
  (Opacus, Poisson sampling, per-example clipping to C = 1, noise sigma = 1,
  ``DpSettings.grad_sample_mode``, the product's default).

Both use Adam and the task's loader; samples per second are the train result's
examples over its own ``seconds`` (the training loop, not model building). The
two are measured in interleaved pairs (plain-dp, dp-plain, ...) after one
warm-up pair. The reported ``dp_cost_x`` is the median over pairs of DP-SGD's
process CPU seconds per sample over plain training's (1 = free, 2 = DP-SGD costs
2x; ``dp_over_plain`` its inverse): one thread's CPU time is what the computation
costs, whatever else a shared machine runs, where wall time also counts the waits
for a core (``dp_cost_x_wall``, beside it). Two sizes per task
(:data:`TASK_SETTINGS`): the privacy-utility sets' small inputs (32 px radiographs,
48 px single-slice slabs, 32 px volumes), where the small networks' per-layer work
is so small that Opacus's per-layer hooks weigh, and 64 px inputs (the run
config's default image size; slabs of 9 slices), where the arithmetic dominates.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from single_thread import ROOT  # noqa: F401,I001 - first: one BLAS thread, the project importable

import torch  # noqa: E402

from clients.registry import synthetic_module, task_class  # noqa: E402
from clients.training.trainer import select_device  # noqa: E402
from clients.training.private_training import DpSettings  # noqa: E402
from clients.training.site_task import TaskSettings  # noqa: E402

__all__ = ["TASK_SETTINGS", "SITE_IMAGE_SIZE", "dp_throughput"]

#: Task sizes of the measurement (batch = the expected Poisson batch under DP).
TASK_SETTINGS = {
    "cxr-cls": (TaskSettings(image_size=32, batch_size=64),
                TaskSettings(image_size=64, batch_size=64)),
    "pe-seg": (TaskSettings(image_size=48, slab_slices=1, batch_size=16),
               TaskSettings(image_size=64, slab_slices=9, batch_size=16)),
    "ct3d-cls": (TaskSettings(image_size=32, volume_depth=16, batch_size=8),
                 TaskSettings(image_size=64, volume_depth=16, batch_size=8)),
}
#: Image size the synthetic hospital is written at, per task.
SITE_IMAGE_SIZE = {"cxr-cls": 64, "pe-seg": 96, "ct3d-cls": 64}
_DP = DpSettings(noise_multiplier=1.0, max_grad_norm=1.0)


def _seconds_per_sample(task, private: bool, steps: int) -> tuple[float, float]:
    """One training call of ``steps`` (fresh model, seed 0): (wall, CPU) seconds per example."""
    torch.manual_seed(0)
    model = task.build_model(private=private)
    cpu = time.process_time()
    result = task.train(model, steps, 1e-3, 0.9, select_device("cpu"), seed=0,
                        optimizer="adam", privacy=_DP if private else None)
    examples = max(result.num_examples, 1)
    return result.seconds / examples, (time.process_time() - cpu) / examples


def dp_throughput(name: str, steps: int = 10, pairs: int = 3,
                  root: Path | None = None) -> list[dict]:
    """Per size of :data:`TASK_SETTINGS`: ``name``'s plain and DP-SGD samples/s (medians)
    and their median pairwise ratio."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="dp-throughput-") as tmp:
        folder = synthetic_module(name).generate_federation(
            Path(root or tmp) / name, num_sites=1, seed=0, image_size=SITE_IMAGE_SIZE[name])[0]
        for settings in TASK_SETTINGS[name]:
            rows.append(_measure(task_class(name)(folder, settings), steps, pairs))
    return rows


def _measure(task, steps: int, pairs: int) -> dict:
    _seconds_per_sample(task, False, 2), _seconds_per_sample(task, True, 2)  # warm-up
    plain, private = [], []
    for k in range(pairs):
        for is_private in ((False, True) if k % 2 == 0 else (True, False)):
            (private if is_private else plain).append(_seconds_per_sample(task, is_private, steps))
    wall = statistics.median(d[0] / p[0] for p, d in zip(plain, private))
    cpu = statistics.median(d[1] / p[1] for p, d in zip(plain, private))
    return {"task": task.name, "settings": asdict(task.settings), "steps": steps,
            "pairs": pairs, "plain_samples_per_s": 1 / statistics.median(p[0] for p in plain),
            "dp_samples_per_s": 1 / statistics.median(d[0] for d in private),
            "dp_cost_x": cpu, "dp_over_plain": 1 / cpu, "dp_cost_x_wall": wall,
            "grad_sample_mode": _DP.grad_sample_mode,
            "plain_model": "task model (BatchNorm, folded slices), plain training",
            "dp_model": "build_model(private=True) (GroupNorm, per-example layers), DP-SGD",
            "measured": f"median of {pairs} interleaved pairs of {steps} steps, CPU, 1 thread; "
                        "dp_cost_x from process CPU time, dp_cost_x_wall from wall time"}
