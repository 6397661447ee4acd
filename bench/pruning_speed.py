"""Does a pruned network train and predict faster? The product's trainer on dense vs pruned models.

Issue 32's speed claim at the level of one site's training step, where it comes from: the
product's training loop (:func:`clients.training.trainer.train_steps`, Adam, the task's loss,
AMP on CUDA) on the task's network (:meth:`SiteTask.model_for_run`), pruned as a federation
prunes it: the structure of :func:`clients.training.pruning.model_structure`, PruneFL's initial
magnitude pruning (:class:`strategies.plugins.pruning.prunefl.PruneFL`) at ``--density``, then

* ``dense``: the network as it is;
* ``unstructured``: the dense network with the pruned weights masked
  (:class:`~clients.training.pruning.MaskedTraining`, the site's hooks: same FLOPs, a little more
  work per step);
* ``structured``: the network torch-pruning cuts out (:func:`~clients.training.pruning.shrink`),
  which is what a structured site trains and what ``make predict`` runs.

Measured: training samples per second (``--steps`` steps after a warm-up, alternating the
variants ``--repeats`` times, median) and prediction (eval forward) samples per second, on
random inputs of the task's shape (the data pipeline is the same for every variant and not what
pruning changes). Results: ``bench/results/pruning_speed.json`` with the device.

Usage::

    .venv/bin/python bench/pruning_speed.py [--tasks pe-seg cxr-cls] [--density 0.5]
        [--image-size 64] [--batch 16] [--steps 20] [--repeats 3] [--device auto]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clients.registry import task_class  # noqa: E402
from clients.training.pruning import (MaskedTraining, model_cost, model_structure,  # noqa: E402
                                      shrink)
from clients.training.site_task import TaskSettings, make_optimizer  # noqa: E402
from clients.training.trainer import ComputeDevice, select_device, train_steps  # noqa: E402
from strategies.plugins.pruning.prunefl import PruneFL  # noqa: E402

DEFAULT_OUTPUT = ROOT / "bench" / "results" / "pruning_speed.json"
VARIANTS = ("dense", "unstructured", "structured")


def _masks(model: torch.nn.Module, mode: str, density: float,
           example: torch.Tensor) -> dict[str, np.ndarray]:
    """The mask PruneFL's initial magnitude pruning gives ``model`` at ``density``."""
    structure = model_structure(model, mode, example)
    pruning = PruneFL(mode=mode, initial_density=density, max_density=1.0)
    named = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    pruning.initialise(named, structure)
    return pruning.masks


def _batches(example: torch.Tensor, target: torch.Tensor):
    while True:
        yield example, target


def _train_rate(model, hooks, example, target, loss_fn, steps, compute) -> float:
    model.to(compute.device)
    optimizer = make_optimizer("adam", model.parameters(), 1e-3, 0.9)
    if compute.device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    train_steps(model, _batches(example, target), loss_fn, optimizer, steps, compute,
                progress_every=10 ** 9, step_hooks=hooks)
    if compute.device.type == "cuda":
        torch.cuda.synchronize()
    return steps * example.shape[0] / (time.perf_counter() - started)


@torch.no_grad()
def _predict_rate(model, example, steps, compute) -> float:
    model.to(compute.device).eval()
    x = example.to(compute.device)
    with compute.autocast():
        model(x)
    if compute.device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        with compute.autocast():
            model(x)
    if compute.device.type == "cuda":
        torch.cuda.synchronize()
    return steps * example.shape[0] / (time.perf_counter() - started)


def measure(task_name: str, settings: TaskSettings, density: float, steps: int, repeats: int,
            compute: ComputeDevice) -> dict:
    """One task's rates per variant (medians over ``repeats``) and their ratios to dense."""
    task = task_class(task_name)
    torch.manual_seed(0)
    dense = task.model_for_run(settings)
    example = torch.as_tensor(task.example_input(settings)).float()
    batch = torch.cat([example[:1]] * settings.batch_size)
    with torch.no_grad():
        out = dense.eval()(batch)
    target = (torch.rand_like(out) > 0.5).float()  # both tasks: binary targets like the logits
    loss_fn = task.loss_fn()
    unstructured = _masks(dense, "unstructured", density, example)
    structured = shrink(dense, model_structure(dense, "structured", example),
                        _masks(dense, "structured", density, example), example).model
    masked = copy.deepcopy(dense)  # each variant its own network, from the same weights
    hooks = MaskedTraining(unstructured, True)
    hooks.zero_pruned(masked)
    models = {"dense": (dense, None), "unstructured": (masked, hooks),
              "structured": (structured, None)}
    start = {v: copy.deepcopy(m.state_dict()) for v, (m, _) in models.items()}
    train = {v: [] for v in VARIANTS}
    predict = {v: [] for v in VARIANTS}
    for variant, (model, hooks) in models.items():  # warm-up
        _train_rate(model, hooks, batch, target, loss_fn, 2, compute)
    for _ in range(repeats):
        for variant, (model, hooks) in models.items():
            model.load_state_dict(start[variant])  # every measurement from the same weights
            train[variant].append(_train_rate(model, hooks, batch, target, loss_fn, steps,
                                              compute))
            predict[variant].append(_predict_rate(model, batch, steps, compute))
    cpu_example = example.cpu()
    costs = {v: model_cost(m.cpu(), cpu_example) for v, (m, _) in models.items()}
    result = {"task": task_name, "image_size": settings.image_size,
              "batch": settings.batch_size, "density": density, "variants": {}}
    for variant in VARIANTS:
        rate, pred = statistics.median(train[variant]), statistics.median(predict[variant])
        result["variants"][variant] = {
            "train_samples_per_s": rate, "predict_samples_per_s": pred,
            "train_speedup": rate / statistics.median(train["dense"]),
            "predict_speedup": pred / statistics.median(predict["dense"]),
            "params": costs[variant]["params"], "flops": costs[variant]["flops"]}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["pe-seg", "cxr-cls"])
    parser.add_argument("--density", type=float, default=0.5,
                        help="pruning.initial-density (of units: weights or channels)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    compute = select_device(args.device)
    rows = []
    for name in args.tasks:
        settings = TaskSettings(image_size=args.image_size, batch_size=args.batch)
        row = measure(name, settings, args.density, args.steps, args.repeats, compute)
        rows.append(row)
        for variant, values in row["variants"].items():
            print(f"{name:8s} {variant:12s} train {values['train_samples_per_s']:9.1f}/s "
                  f"(x{values['train_speedup']:.2f})  predict {values['predict_samples_per_s']:9.1f}/s "
                  f"(x{values['predict_speedup']:.2f})  params {values['params']:.0f} "
                  f"flops {values['flops']:.3g}", flush=True)
    device = (torch.cuda.get_device_name(0) if compute.device.type == "cuda"
              else f"cpu x{torch.get_num_threads()} threads")
    report = {"meta": {"device": device, "torch": torch.__version__, "argv": sys.argv[1:]},
              "rows": rows}
    output = args.output
    runs = json.loads(output.read_text())["runs"] if output.exists() else []
    runs = [r for r in runs if r["meta"]["device"] != device
            or r["meta"]["argv"] != report["meta"]["argv"]] + [report]  # others kept
    report = {"runs": runs}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
