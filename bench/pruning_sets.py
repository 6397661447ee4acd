"""The federations and variants of ``bench/pruning.py``, and one run of them through the product.

Sets (site folders written once under ``data/bench/`` by the product's
generators, :mod:`engine_runs`; a shared set is skipped when
``../shared/data`` lacks it):

``msd-lung``
    The MSD Task06 lung-tumour CT patches (``seg2d``, 48 px, manual masks)
    dealt IID to ``--sites`` folders by ``clients.datagen shared --task pe-seg
    --set msd-lung``; the pe-seg task's U-Net on 1-slice slabs (2D); Dice.
``pneumoniamnist``
    PneumoniaMNIST (``cxr2d``) dealt IID by ``clients.datagen shared --task
    cxr-cls``; the cxr-cls task's small DenseNet at 32 px; ROC AUC.
``synthetic-pe``
    The synthetic PE hospitals of ``clients.datagen synthetic --task pe-seg``
    (96 px written, 32 px slabs); the 2.5D U-Net; Dice.

A :class:`Variant` is a pruning method (:data:`METHODS`, as run-config keys
of the product's ``strategy.pruning`` plug-in and its ``pruning.*`` section)
with an update codec (:class:`codec_configs.CodecConfig`). Every variant of
a set and seed runs the same rounds from the same initial model (the run
config's ``seed``) on the same sites with the same local training seeds.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from codec_configs import CodecConfig
from engine_runs import RoundSeries, shared_sites, synthetic_sites
from runner import Federation, SetMissing

__all__ = ["METHODS", "SETS", "SetSpec", "PruningSettings", "Variant", "pruning_set",
           "pruning_fields"]

#: Run-config keys of each method (on top of :meth:`PruningSettings.overrides`).
METHODS: dict[str, dict] = {
    "dense": {"strategy.pruning": "none"},
    "magnitude": {"strategy.pruning": "prunefl", "pruning.mode": "unstructured",
                  "pruning.interval": 0},
    "prunefl-unstructured": {"strategy.pruning": "prunefl", "pruning.mode": "unstructured"},
    "prunefl-structured": {"strategy.pruning": "prunefl", "pruning.mode": "structured"},
}
NO_CODEC = CodecConfig("none", False)


@dataclass(frozen=True)
class SetSpec:
    """A set's task, metric, run-config overrides and, for a shared set, its source.

    ``shared_file`` is the ``../shared/data`` file the set needs ("" for a
    synthetic set) and ``shared_set`` the converter's ``--set``.
    """

    task: str
    metric: str
    overrides: dict
    shared_file: str = ""
    shared_set: str = ""


SETS: dict[str, SetSpec] = {
    "msd-lung": SetSpec("pe-seg", "dice", {"image-size": 48, "slab-slices": 1,
                                           "batch-size": 16, "lr": 3e-3, "local-steps": 10},
                        "seg2d/msd_lung_tumour_patches_val.npz", "msd-lung"),
    "pneumoniamnist": SetSpec("cxr-cls", "auc", {"image-size": 32, "batch-size": 16,
                                                 "lr": 1e-3, "local-steps": 10},
                              "cxr2d/pneumoniamnist_balanced.npz", "pneumoniamnist"),
    "synthetic-pe": SetSpec("pe-seg", "dice", {"image-size": 32, "batch-size": 8, "lr": 3e-3,
                                               "local-steps": 20}),
}


@dataclass(frozen=True)
class PruningSettings:
    """The ``pruning.*`` keys the command line sets: per mode (initial, max) density, the
    re-pruning interval and the squared gradients' codec.

    A density is the kept fraction of each group's units (a weight, or an output
    channel with its coordinates in every dependent array): a weight layer
    between two channel groups that each keep ``d`` of their channels keeps
    about ``d^2`` of its weights, so structured pruning wants a higher density
    for the same parameters kept.
    """

    densities: dict[str, tuple[float, float]]
    interval: int
    report_codec: str = "fp16"

    def overrides(self, mode: str) -> dict:
        initial, maximum = self.densities[mode]
        return {"pruning.initial-density": initial, "pruning.max-density": maximum,
                "pruning.interval": self.interval, "pruning.report-codec": self.report_codec}


@dataclass(frozen=True)
class Variant:
    """A pruning method (a key of :data:`METHODS`) and the update codec beside it."""

    method: str
    codec: CodecConfig = field(default=NO_CODEC)

    @property
    def name(self) -> str:
        return self.method if self.codec == NO_CODEC else f"{self.method} {self.codec.name}"

    def overrides(self, settings: PruningSettings) -> dict:
        """The run-config keys of this variant."""
        keys = METHODS[self.method]
        pruning = settings.overrides(keys["pruning.mode"]) if "pruning.mode" in keys else {}
        return {**pruning, **keys, **self.codec.overrides()}


def pruning_set(name: str, args: argparse.Namespace) -> Federation:
    """The set ``name`` (its folders generated once).

    Raises
    ------
    runner.SetMissing
        If its shared data file is absent.
    """
    spec = SETS[name]
    if spec.shared_file:
        if not (Path(args.shared_data) / spec.shared_file).is_file():
            raise SetMissing(f"{spec.shared_file} not found")
        folders = shared_sites(spec.task, spec.shared_set, args.sites, 0,
                               shared=args.shared_data)
    elif args.pe_data:
        folders = sorted(Path(args.pe_data).glob("hospital-*"))
    else:
        folders = synthetic_sites(spec.task, args.sites, 0, 96)
    sizes = {k: v for k, v in (("local-steps", args.steps), ("batch-size", args.batch_size)) if v}
    return Federation(name, spec.metric, tuple(folders), {
        "task": spec.task, "optimizer": "adam", **spec.overrides, **sizes})


def _kept(strategy: dict[str, float], size: int) -> float:
    """The final model's kept fraction of its ``size`` values: the last round's strategy info
    ``pruning-params-kept`` (a count) over it, 1 without pruning."""
    return float(strategy.get("pruning-params-kept", size)) / size


def _logged_model(workdir: Path, run_id: str) -> dict[str, float]:
    """The logged model's sparsity the run recorded in MLflow (``model/*`` metrics: params
    kept, density, bytes, FLOPs of the network that runs and of the dense one); {} for dense."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415 - MLflow loads on use

    store = f"sqlite:///{Path(workdir).resolve() / 'mlflow.db'}"
    metrics = MlflowClient(tracking_uri=store).get_run(run_id).data.metrics
    return {k[len("model/"):]: v for k, v in metrics.items() if k.startswith("model/")}


def pruning_fields(outcome, run: RoundSeries, workdir: Path) -> dict:
    """A pruning run's own row fields (:attr:`runner.Study.fields`): seconds per round, the
    sites' training seconds, the kept parameters and FLOPs, the pruning info per round."""
    reports = [outcome.reports[r] for r in sorted(outcome.reports)]
    logged = _logged_model(workdir, outcome.mlflow_run_id)
    return {
        "seconds_per_round": [float(r.seconds) for r in reports],
        "train_seconds_per_round": [float(sum(m.get("train-seconds", 0.0) for m in r.values()))
                                    for r in run.train],
        "params_kept": _kept(reports[-1].strategy, sum(np.size(a) for a in
                                               outcome.arrays.to_numpy_ndarrays())),
        "flops_kept": logged["flops"] / logged["flops-dense"] if logged else 1.0,
        "logged_model": logged,
        "pruning": [{k: v for k, v in r.strategy.items() if k.startswith("pruning-")}
                    for r in reports]}
