"""Local training at each site alone vs FedAvg vs pooled training, same total work.

In-process (no Flower), with the product's task classes on site folders written
by the product's converter (:mod:`clients.datagen.shared`). Three regimes, all
with the same total number of optimiser steps ``S_total``, the same optimiser
(:meth:`clients.training.site_task.SiteTask.train`'s Adam, lr 1e-3, beta1 0.9), the
same batch size and the same initial model (seeded):

1. **local**: each of the ``K`` sites trains its own model for ``S_total / K``
   steps on its own data only (one optimiser state for the whole run);
2. **FedAvg**: ``R`` rounds x ``tau`` local steps per site from the global
   model (optimiser state fresh every round, as in the product), aggregated
   with :func:`strategies.aggregation.fedavg_delta` on the state_dict arrays
   (``delta_k = x_global - x_local_k``, ``n_k = len(train_set)``,
   ``x_new = x_global - sum_k p_k delta_k``); ``R * tau * K = S_total``;
3. **pooled** (centralised): one model trained on the union of the sites'
   training data for ``S_total`` steps: for the classifiers merged
   :class:`clients.training.classification.LabelledTensors` sampled with the tasks' own
   :func:`clients.training.classification.balanced_loader` (the same positive share per
   batch); for segmentation one :class:`clients.pe_seg.slabs.SlabDataset` of all
   sites' training studies, trained by the task's own ``train`` (same sampler,
   positive-slice share and flips as at a site).

Every model is evaluated with ``task.evaluate`` on every site's validation
split; the summary is the example-weighted mean over sites of ROC AUC and
accuracy (sites whose validation set has a single class have an undefined AUC
and are left out of the AUC mean, with their weight), or of Dice for
segmentation (the task's per-study Dice, weighted by validation slices). For
the local regime the table row is the mean over the ``K`` site-alone models of
their all-site mean ("how a site-alone model generalises"); their own-site
score is reported too.

Labels (honestly): ``cxr-cls`` here is **PneumoniaMNIST pneumonia vs normal**
(28 px), ``ct3d-cls`` is the **AdrenalMNIST3D label** (adrenal mass shape), not
emphysema; ``pe-seg-ctpa`` is the **pulmonary-artery mask of one CT**
(TotalSegmentator output, z-blocks as studies), ``pe-seg-msd-lung`` is the
**manual lung-tumour mask** of MSD Task06 patches (2D, slab 1) - neither is a
pulmonary-embolism label. Results go to ``--output`` and a markdown table is
printed. Usage::

    python bench/local_fedavg_pooled.py --shared /work/shared/data \\
        [--tasks cxr-cls ct3d-cls] [--cxr-steps 600 --cxr-rounds 10] \\
        [--ct3d-steps 120 --ct3d-rounds 5]
    python bench/local_fedavg_pooled.py --tasks pe-seg-ctpa pe-seg-msd-lung --repeats 3 \\
        [--ctpa-steps 900 --ctpa-rounds 10] [--msd-steps 600 --msd-rounds 10] \\
        --output bench/results/local_fedavg_pooled_seg.json

``--repeats N`` trains every regime with the seeds ``seed .. seed + N - 1``
(model initialisation and batches; the site split stays that of ``--seed``)
and reports mean +- sd.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clients.pe_seg.data import load_site  # noqa: E402
from clients.pe_seg.slabs import SlabDataset  # noqa: E402
from clients.registry import task_class  # noqa: E402
from clients.training.classification import LabelledTensors, balanced_loader  # noqa: E402
from clients.training.device import ComputeDevice, select_device  # noqa: E402
from clients.training.site_task import SiteTask, TaskSettings, make_optimizer  # noqa: E402
from clients.training.trainer import train_steps  # noqa: E402
from strategies.aggregation import fedavg_delta  # noqa: E402
from strategies.weighted_mean import weighted_mean  # noqa: E402
from model_arrays import load_arrays, state_arrays  # noqa: E402

LABELS = {
    "cxr-cls": "PneumoniaMNIST: pneumonia (1) vs normal (0), 28 px chest X-rays",
    "ct3d-cls": "AdrenalMNIST3D label (adrenal mass shape); NOT emphysema",
    "pe-seg-ctpa": "pulmonary-artery mask (TotalSegmentator output) of one CTPA-like CT, "
                   "z-blocks as studies; NOT pulmonary embolism",
    "pe-seg-msd-lung": "manual lung-tumour masks, MSD Task06 48 px CT patches (2D, slab 1); "
                       "NOT pulmonary embolism",
}
#: Benchmark entry -> (product task, shared set).
ENTRIES = {"cxr-cls": ("cxr-cls", "pneumoniamnist"), "ct3d-cls": ("ct3d-cls", "adrenalmnist3d"),
           "pe-seg-ctpa": ("pe-seg", "ctpa"), "pe-seg-msd-lung": ("pe-seg", "msd-lung")}
REGIMES = ("local", "fedavg", "pooled")


@dataclass(frozen=True)
class RunConfig:
    """One comparison: a task, its settings and the step budget."""

    task: str
    steps_total: int
    rounds: int
    lr: float = 1e-3
    momentum: float = 0.9
    seed: int = 0


def _fresh_model(task: SiteTask, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return task.build_model()


def evaluate_all(model: nn.Module, tasks: list[SiteTask], compute: ComputeDevice) -> dict:
    """Per-site metrics of ``model`` and their example-weighted means."""
    per_site = []
    for task in tasks:
        result = task.evaluate(model, compute)
        per_site.append({"site": task.site_dir.name, "num_examples": result.num_examples,
                         "loss": result.loss, **result.metrics})
    return {"per_site": per_site, "mean": _weighted_mean(per_site)}


def _metric_keys(per_site: list[dict]) -> list[str]:
    """The metrics reported per site (``auc``, ``accuracy`` / ``dice``), then ``loss``."""
    return [k for k in per_site[0] if k not in ("site", "num_examples", "loss")] + ["loss"]


def _weighted_mean(per_site: list[dict]) -> dict:
    """Example-weighted mean of every metric over the sites where it is defined (finite)."""
    return {key: weighted_mean((s[key], s["num_examples"]) for s in per_site
                               if math.isfinite(s[key]))
            for key in _metric_keys(per_site)}


def merged_train_set(tasks: list[SiteTask]) -> LabelledTensors:
    """Union of the sites' training sets (same tensors, one dataset)."""
    images = [img[0].numpy() for t in tasks for img in t.train_set.images]
    labels = [lab.numpy() for t in tasks for lab in t.train_set.labels]
    return LabelledTensors(images, labels)


def run_local(tasks, cfg: RunConfig, compute) -> dict:
    k = len(tasks)
    steps = cfg.steps_total // k
    models, done = [], 0
    for i, task in enumerate(tasks):
        model = _fresh_model(task, cfg.seed)
        res = task.train(model, steps, cfg.lr, cfg.momentum, compute, seed=cfg.seed + 101 * i,
                         optimizer="adam", label=f"local/{task.site_dir.name}")
        done += res.steps_done
        models.append(model)
    evals = []
    for i, (task, model) in enumerate(zip(tasks, models)):
        ev = evaluate_all(model, tasks, compute)
        ev["trained_at"] = task.site_dir.name
        ev["own_site"] = ev["per_site"][i]
        evals.append(ev)
    keys = list(evals[0]["mean"])
    mean = {key: float(np.nanmean([e["mean"][key] for e in evals])) for key in keys}
    own = {key: float(np.nanmean([e["own_site"][key] for e in evals])) for key in keys}
    return {"steps_done": done, "steps_per_site": steps, "models": evals,
            "mean": mean, "own_site_mean": own}


def run_fedavg(tasks, cfg: RunConfig, compute) -> dict:
    k = len(tasks)
    tau = cfg.steps_total // (cfg.rounds * k)
    global_model = _fresh_model(tasks[0], cfg.seed)
    counts = [len(t.train_set) for t in tasks]
    done = 0
    for r in range(cfg.rounds):
        x_global = state_arrays(global_model)
        deltas = []
        for i, task in enumerate(tasks):
            local = copy.deepcopy(global_model)
            res = task.train(local, tau, cfg.lr, cfg.momentum, compute,
                             seed=cfg.seed + 101 * i + 7919 * (r + 1), optimizer="adam",
                             label=f"fedavg/r{r}/{task.site_dir.name}")
            done += res.steps_done
            deltas.append([np.asarray(g - x) for g, x in zip(x_global, state_arrays(local))])
        delta = fedavg_delta(deltas, counts)
        load_arrays(global_model, [g - d for g, d in zip(x_global, delta)])
    ev = evaluate_all(global_model, tasks, compute)
    return {"steps_done": done, "rounds": cfg.rounds, "local_steps": tau,
            "num_examples": counts, **ev}


def pooled_seg_task(tasks: list[SiteTask]) -> SiteTask:
    """A segmentation task whose training set is every site's training studies (one SlabDataset)."""
    settings = tasks[0].settings
    studies = [s for t in tasks for s in load_site(t.site_dir, split="train")[0]]
    pooled = copy.copy(tasks[0])
    pooled.train_set = SlabDataset(studies, slab=settings.slab_slices, image_size=settings.image_size)
    return pooled


def run_pooled(tasks, cfg: RunConfig, compute) -> dict:
    if tasks[0].name == "pe-seg":
        pooled_task = pooled_seg_task(tasks)
        model = _fresh_model(tasks[0], cfg.seed)
        res = pooled_task.train(model, cfg.steps_total, cfg.lr, cfg.momentum, compute, seed=cfg.seed,
                                optimizer="adam", label="pooled")
        ev = evaluate_all(model, tasks, compute)
        return {"steps_done": res.steps_done, "num_train": len(pooled_task.train_set), **ev}
    pooled = merged_train_set(tasks)
    settings = tasks[0].settings
    model = _fresh_model(tasks[0], cfg.seed)
    torch.manual_seed(cfg.seed)
    model.to(compute.device)
    opt = make_optimizer("adam", model.parameters(), cfg.lr, cfg.momentum)
    loader = balanced_loader(pooled, settings.batch_size, settings.positive_fraction, cfg.seed,
                             compute)
    res = train_steps(model, loader, tasks[0].loss_fn(), opt, cfg.steps_total, compute,
                      label="pooled")
    ev = evaluate_all(model, tasks, compute)
    return {"steps_done": res.steps_done, "num_train": len(pooled), **ev}


def compare(tasks: list[SiteTask], cfg: RunConfig, compute: ComputeDevice) -> dict:
    """The three regimes on ``tasks``; ``steps_total`` must split evenly."""
    k = len(tasks)
    if cfg.steps_total % (cfg.rounds * k):
        raise ValueError(f"steps_total={cfg.steps_total} must be a multiple of "
                         f"rounds x sites = {cfg.rounds * k}")
    out, timing = {}, {}
    for name, fn in (("local", run_local), ("fedavg", run_fedavg), ("pooled", run_pooled)):
        t0 = time.perf_counter()
        out[name] = fn(tasks, cfg, compute)
        timing[name] = time.perf_counter() - t0
    return {"config": asdict(cfg), "regimes": out, "seconds": timing,
            "summary": {name: out[name]["mean"] for name in REGIMES},
            "local_own_site": out["local"]["own_site_mean"]}


def combine_repeats(runs: list[dict]) -> dict:
    """Several :func:`compare` results (training seeds) -> mean and sd per regime and metric.

    One run is returned unchanged; otherwise ``summary`` / ``local_own_site``
    hold the means over the runs, ``summary_sd`` / ``local_own_site_sd`` the
    sample standard deviations, and ``runs`` every run in full.
    """
    if len(runs) == 1:
        return runs[0]

    def stats(get) -> tuple[dict, dict]:
        keys = list(get(runs[0]))
        values = {k: [get(r)[k] for r in runs] for k in keys}
        return ({k: float(np.nanmean(v)) for k, v in values.items()},
                {k: float(np.nanstd(v, ddof=1)) for k, v in values.items()})

    summary, summary_sd = {}, {}
    for name in REGIMES:
        summary[name], summary_sd[name] = stats(lambda r, n=name: r["summary"][n])
    own, own_sd = stats(lambda r: r["local_own_site"])
    return {"config": {**runs[0]["config"], "seeds": [r["config"]["seed"] for r in runs]},
            "summary": summary, "summary_sd": summary_sd,
            "local_own_site": own, "local_own_site_sd": own_sd,
            "seconds": {n: sum(r["seconds"][n] for r in runs) for n in REGIMES}, "runs": runs}


def load_tasks(task_name: str, site_root: Path, settings: TaskSettings) -> list[SiteTask]:
    cls = task_class(task_name)
    return [cls(d, settings) for d in sorted(p for p in site_root.iterdir() if p.is_dir())]


_TITLES = {"auc": "mean val AUC", "accuracy": "mean val accuracy", "dice": "mean val Dice"}


def markdown(task_name: str, result: dict) -> str:
    s = result["summary"]
    sd = result.get("summary_sd")
    cfg = result["config"]
    regimes = result["runs"][0]["regimes"] if "runs" in result else result["regimes"]
    keys = [k for k in s["fedavg"] if k != "loss"]
    seeds = f"; mean +- sd over training seeds {cfg['seeds']}" if "seeds" in cfg else ""
    lines = [f"**{task_name}** — {LABELS.get(task_name, task_name)}; S_total = {cfg['steps_total']} "
             f"steps, FedAvg R = {cfg['rounds']} x tau = {regimes['fedavg']['local_steps']}{seeds}",
             "", "| regime | " + " | ".join(_TITLES.get(k, k) for k in keys) + " |",
             "|---|" + "---|" * len(keys)]
    rows = [(label, s[name], sd[name] if sd else None)
            for name, label in (("local", "local (site-alone models, all sites)"),
                                ("fedavg", "FedAvg"), ("pooled", "pooled (centralised)"))]
    rows.append(("local, own site only", result["local_own_site"], result.get("local_own_site_sd")))
    for label, values, spread in rows:
        cells = [f"{values[k]:.3f}" + (f" +- {spread[k]:.3f}" if spread else "") for k in keys]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_sites(task: str, shared: Path, out: Path, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "clients.datagen", "shared", "--task", task, "--shared", str(shared),
           "--out", str(out), *extra]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=Path("/work/shared/data"))
    p.add_argument("--tasks", nargs="+", default=["cxr-cls", "ct3d-cls"], choices=sorted(LABELS))
    p.add_argument("--sites", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cxr-steps", type=int, default=600)
    p.add_argument("--cxr-rounds", type=int, default=10)
    p.add_argument("--ct3d-steps", type=int, default=120)
    p.add_argument("--ct3d-rounds", type=int, default=5)
    p.add_argument("--ctpa-steps", type=int, default=900)
    p.add_argument("--ctpa-rounds", type=int, default=10)
    p.add_argument("--msd-steps", type=int, default=600)
    p.add_argument("--msd-rounds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=1,
                   help="training seeds per entry (seed, seed+1, ...; the site split stays that of --seed)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", type=Path, default=ROOT / "bench/results/local_fedavg_pooled.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    compute = select_device("cpu")
    t_start = time.perf_counter()
    specs = {
        "cxr-cls": (["--sites", str(args.sites), "--scheme", "dirichlet", "--alpha", "0.5",
                     "--seed", str(args.seed)],
                    TaskSettings(image_size=28, batch_size=16),
                    args.cxr_steps, args.cxr_rounds),
        "ct3d-cls": (["--sites", str(args.sites), "--scheme", "iid", "--max-per-site", "120",
                      "--seed", str(args.seed)],
                     TaskSettings(image_size=32, volume_depth=16, batch_size=4, model_size="small"),
                     args.ct3d_steps, args.ct3d_rounds),
        "pe-seg-ctpa": (["--set", "ctpa", "--sites", str(args.sites), "--scheme", "iid",
                         "--seed", str(args.seed)],
                        TaskSettings(image_size=64, slab_slices=9, batch_size=8),
                        args.ctpa_steps, args.ctpa_rounds),
        "pe-seg-msd-lung": (["--set", "msd-lung", "--sites", str(args.sites), "--scheme", "size",
                             "--seed", str(args.seed)],
                            TaskSettings(image_size=48, slab_slices=1, batch_size=16),
                            args.msd_steps, args.msd_rounds),
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.tasks:
            extra, settings, steps, rounds = specs[name]
            task_name = ENTRIES[name][0]
            site_root = Path(tmp) / name
            build_sites(task_name, args.shared, site_root, extra)
            tasks = load_tasks(task_name, site_root, settings)
            res = combine_repeats([
                compare(tasks, RunConfig(task=name, steps_total=steps, rounds=rounds, seed=args.seed + r),
                        compute)
                for r in range(args.repeats)])
            res["label"] = LABELS[name]
            res["settings"] = asdict(settings)
            res["converter_args"] = extra
            res["sites"] = [{"site": t.site_dir.name, "train": len(t.train_set),
                             "val": len(t.val_set),
                             "train_positive_share": len(t.train_set.positive_indices) / len(t.train_set),
                             **({"train_studies": len(t.train_set.study_ids),
                                 "val_studies": len(t.val_set.study_ids)}
                                if isinstance(t.train_set, SlabDataset) else {})}
                            for t in tasks]
            res["wall_seconds"] = sum(res["seconds"].values())
            results[name] = res
            print(markdown(name, res), "\n", flush=True)
    payload = {
        "description": "local (site-alone) vs FedAvg vs pooled training, same total optimiser steps",
        "device": "cpu", "threads": args.threads, "results": results,
        "wall_seconds": time.perf_counter() - t_start,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "numpy": np.__version__, "platform": platform.platform()},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wall time {payload['wall_seconds']:.1f} s -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
