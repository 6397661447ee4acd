"""The federations the compression benchmarks run, and one codec run on them through the product.

Two sets, each site folders from the product's generators plus run-config
overrides (:mod:`engine_runs`):

``cxr``
    PneumoniaMNIST dealt IID to ``--cxr-sites`` folders by ``clients.datagen
    shared`` (the product's cxr-cls task, small DenseNet, 32 px; Adam);
    metric ``auc`` (validation ROC AUC).
``pe``
    The synthetic PE hospitals of ``clients.datagen synthetic --task pe-seg``
    (3 sites, 96 px written, trained on 32 px slabs; Adam); metric ``dice``.

:func:`codec_run` runs one :class:`codec_configs.CodecConfig` on a set for a
given seed and returns the JSON row both benchmarks write.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bytes_to_target import traffic_fields
from codec_configs import CodecConfig
from engine_runs import SHARED, run_product, series, shared_sites, synthetic_sites

__all__ = ["PRIMARY", "CompressionSet", "add_set_arguments", "compression_set", "codec_run"]

#: The metric each set's final value and bytes-to-target are read on.
PRIMARY = {"cxr": "auc", "pe": "dice"}


@dataclass(frozen=True)
class CompressionSet:
    """A federation to compress: its name, site folders and run-config overrides."""

    name: str
    folders: tuple[Path, ...]
    overrides: dict

    @property
    def metric(self) -> str:
        return PRIMARY[self.name]


def add_set_arguments(parser: argparse.ArgumentParser) -> None:
    """The sets' sizes and local training (defaults: the shortened CPU runs of issue 27)."""
    parser.add_argument("--shared-data", type=Path, default=SHARED)
    parser.add_argument("--cxr-sites", type=int, default=4)
    parser.add_argument("--cxr-steps", type=int, default=15)
    parser.add_argument("--cxr-batch-size", type=int, default=16)
    parser.add_argument("--cxr-lr", type=float, default=1e-3)
    parser.add_argument("--cxr-image-size", type=int, default=32)
    parser.add_argument("--pe-data", type=Path, default=None,
                        help="folder of pe-seg site folders hospital-NN (default: 3 generated "
                             "once under data/bench/)")
    parser.add_argument("--pe-steps", type=int, default=30)
    parser.add_argument("--pe-batch-size", type=int, default=8)
    parser.add_argument("--pe-image-size", type=int, default=32)
    parser.add_argument("--pe-lr", type=float, default=3e-3)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="MLflow store of the runs (default: a temporary folder)")


def compression_set(name: str, args: argparse.Namespace) -> CompressionSet | None:
    """The set ``name`` (its folders generated once); ``None`` if its real data is absent."""
    if name == "cxr":
        if not (Path(args.shared_data) / "cxr2d" / "pneumoniamnist_balanced.npz").is_file():
            return None
        folders = shared_sites("cxr-cls", "pneumoniamnist", args.cxr_sites, 0,
                               shared=args.shared_data)
        return CompressionSet(name, tuple(folders), {
            "task": "cxr-cls", "image-size": args.cxr_image_size, "optimizer": "adam",
            "local-steps": args.cxr_steps, "batch-size": args.cxr_batch_size,
            "lr": args.cxr_lr})
    folders = (sorted(Path(args.pe_data).glob("hospital-*")) if args.pe_data
               else synthetic_sites("pe-seg", 3, 0, 96))
    return CompressionSet(name, tuple(folders), {
        "task": "pe-seg", "image-size": args.pe_image_size, "optimizer": "adam",
        "local-steps": args.pe_steps, "batch-size": args.pe_batch_size, "lr": args.pe_lr})


def codec_run(federation: CompressionSet, config: CodecConfig, seed: int, rounds: int,
              workdir: Path, patience: int = 0, min_delta: float = 0.0) -> dict:
    """One federation of ``config`` on ``federation``; its JSON row.

    ``patience`` > 0 lets the product's early stopping end the run before
    ``rounds`` (``early-stopping.patience`` / ``min-delta``).
    """
    from app.engine import VirtualSite  # noqa: PLC0415 - the engine loads Flower

    sites = [VirtualSite.folder(folder, site_name=folder.name) for folder in federation.folders]
    overrides = {**federation.overrides, **config.overrides(), "seed": seed,
                 "num-server-rounds": rounds, "early-stopping.patience": patience,
                 "early-stopping.min-delta": min_delta,
                 "experiment": f"bench-compression-{federation.name}"}
    outcome, seconds = run_product(overrides, sites, workdir)
    run = series(outcome)
    metric = federation.metric
    return {
        "set": federation.name, "seed": seed, "config": config.name, "label": config.label,
        "uplink": config.spec, "error_feedback": config.error_feedback,
        "downlink": config.downlink, "warmup_rounds": config.warmup_rounds,
        "engine": "in-process", "sites": len(sites), "rounds": run.rounds, "metric": metric,
        "curve": run.metrics[metric], "curves": run.metrics,
        **traffic_fields(run),
        "residual_norm": [float(np.mean([m.get("residual-norm", 0.0) for m in r.values()]))
                          for r in run.train],
        "train_loss": [float(np.mean([m.get("train-loss", 0.0) for m in r.values()]))
                       for r in run.train],
        "dropped": run.dropped, "seconds": seconds, "mlflow_run_id": outcome.mlflow_run_id,
        "run_config": overrides,
    }
