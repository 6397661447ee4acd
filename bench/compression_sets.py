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

Both benchmarks are studies of :mod:`runner`: :func:`codec_arm` is a
:class:`codec_configs.CodecConfig` as an arm, :func:`codec_fields` the row
fields both read beside the runner's, :data:`SET_OPTIONS` the sets' options.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from codec_configs import CodecConfig
from engine_runs import RoundSeries, shared_sites, synthetic_sites
from runner import Arm, Federation, Option, SetMissing

__all__ = ["PRIMARY", "SET_OPTIONS", "compression_set", "codec_arm", "codec_fields"]

#: The metric each set's final value and bytes-to-target are read on.
PRIMARY = {"cxr": "auc", "pe": "dice"}

#: The sets' sizes and local training (defaults: the shortened CPU runs of issue 27).
SET_OPTIONS = tuple(Option(f"--{key}", {"type": type(default), "default": default})
                    for key, default in (("cxr-sites", 4), ("cxr-steps", 15),
                                         ("cxr-batch-size", 16), ("cxr-lr", 1e-3),
                                         ("cxr-image-size", 32), ("pe-steps", 30),
                                         ("pe-batch-size", 8), ("pe-image-size", 32),
                                         ("pe-lr", 3e-3)))


def compression_set(name: str, args: argparse.Namespace) -> Federation:
    """The set ``name`` (its folders generated once).

    Raises
    ------
    runner.SetMissing
        If PneumoniaMNIST is absent from ``--shared-data`` (set ``cxr``).
    """
    if name == "cxr":
        if not (Path(args.shared_data) / "cxr2d" / "pneumoniamnist_balanced.npz").is_file():
            raise SetMissing("PneumoniaMNIST not found")
        folders = shared_sites("cxr-cls", "pneumoniamnist", args.cxr_sites, 0,
                               shared=args.shared_data)
        return Federation(name, PRIMARY[name], tuple(folders), {
            "task": "cxr-cls", "image-size": args.cxr_image_size, "optimizer": "adam",
            "local-steps": args.cxr_steps, "batch-size": args.cxr_batch_size,
            "lr": args.cxr_lr})
    folders = (sorted(Path(args.pe_data).glob("hospital-*")) if args.pe_data
               else synthetic_sites("pe-seg", 3, 0, 96))
    return Federation(name, PRIMARY[name], tuple(folders), {
        "task": "pe-seg", "image-size": args.pe_image_size, "optimizer": "adam",
        "local-steps": args.pe_steps, "batch-size": args.pe_batch_size, "lr": args.pe_lr})


def codec_arm(config: CodecConfig) -> Arm:
    """``config`` as an arm: its run-config keys and the row fields naming it."""
    return Arm(config.name, config.overrides(), {
        "label": config.label, "uplink": config.spec, "error_feedback": config.error_feedback,
        "downlink": config.downlink, "warmup_rounds": config.warmup_rounds})


def codec_fields(outcome, run: RoundSeries, workdir: Path) -> dict:
    """A codec run's own row fields: per round the sites' mean residual norm and train loss."""
    return {"residual_norm": [float(np.mean([m.get("residual-norm", 0.0) for m in r.values()]))
                              for r in run.train],
            "train_loss": [float(np.mean([m.get("train-loss", 0.0) for m in r.values()]))
                           for r in run.train]}
