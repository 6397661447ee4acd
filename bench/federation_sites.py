"""Site folders and per-site results of the benchmarks that compare training regimes.

``bench/local_fedavg_pooled.py``, ``bench/personalisation.py`` and
``bench/privacy_utility.py`` are configurations of the product: they write
site folders with the product's converter (``python -m clients.datagen
shared``), give them to the in-process engine as :class:`app.engine.VirtualSite`
objects (a site that only measures runs ``configs/site-policy-evaluate-only.toml``,
a hospital's own way to refuse training) and read each site's metrics from the
returned round reports. Nothing here trains, aggregates or builds a message.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from single_thread import ROOT  # noqa: I001 - first: one BLAS thread

import numpy as np  # noqa: E402

from app.engine import VirtualSite  # noqa: E402

__all__ = ["EVALUATE_ONLY", "convert_shared", "pooled_folder", "folder_sites",
           "site_evaluations", "site_mean", "train_totals"]

#: The site policy of a site that answers evaluate requests and refuses every train request.
EVALUATE_ONLY = ROOT / "configs" / "site-policy-evaluate-only.toml"


def convert_shared(task: str, shared: Path, out: Path, args: Sequence[str]) -> list[Path]:
    """``python -m clients.datagen shared --task TASK ... ARGS`` into ``out``; the site folders."""
    subprocess.run([sys.executable, "-m", "clients.datagen", "shared", "--task", task,
                    "--shared", str(shared), "--out", str(out), *args],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return sorted(p for p in Path(out).iterdir() if p.is_dir())


def pooled_folder(folders: Sequence[Path], out: Path) -> Path:
    """One site folder holding every item of ``folders`` (centralised training's data).

    Each site's index file (its top-level ``*.csv``: ``images.csv``, ``manifest.csv``)
    is concatenated with every row's ``split`` kept, and its data files (``images/``,
    ``studies/``) are hard-linked beside them, so the pooled site reads exactly the
    items the sites read, through the same task reader.
    """
    out.mkdir(parents=True)
    tables: dict[str, list[dict[str, str]]] = {}
    for folder in folders:
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.suffix == ".csv":
                with entry.open(newline="") as f:
                    tables.setdefault(entry.name, []).extend(csv.DictReader(f))
            elif entry.is_dir():
                shutil.copytree(entry, out / entry.name, copy_function=os.link,
                                dirs_exist_ok=True)
    for name, rows in tables.items():
        with (out / name).open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    (out / "SOURCE.txt").write_text("Pooled by bench/federation_sites.py from "
                                    + ", ".join(f.name for f in folders) + "\n")
    return out


def folder_sites(folders: Iterable[Path], evaluate_only: Iterable[Path] = (),
                 node_config: Mapping[str, Mapping] | None = None,
                 state_root: Path | None = None) -> list[VirtualSite]:
    """One virtual site per folder (its name: the folder's); those in ``evaluate_only``
    refuse training by their site policy. ``node_config`` adds node_config keys per
    site name (``local-steps-cap``). ``state_root``: each site's ``state-dir`` is
    ``state_root/<name>`` (a fresh privacy ledger per run) instead of the folder's own."""
    measuring = {Path(p).resolve() for p in evaluate_only}
    sites = []
    for folder in folders:
        path = Path(folder).resolve()
        site = VirtualSite.folder(path, site_name=path.name,
                                  state_dir=state_root / path.name if state_root else None,
                                  policy_path=EVALUATE_ONLY if path in measuring else None)
        site.node_config = {**site.node_config, **(node_config or {}).get(path.name, {})}
        sites.append(site)
    return sites


def site_evaluations(outcome, server_round: int | None = None) -> dict[str, dict[str, float]]:
    """Each site's evaluate metrics of ``server_round`` (default: the last round)."""
    return dict(outcome.reports[server_round or max(outcome.reports)].evaluate)


def site_mean(per_site: Mapping[str, Mapping[str, float]], key: str) -> float:
    """Example-weighted mean of ``key`` over the sites where it is finite (NaN: nowhere)."""
    pairs = [(m[key], m["num-examples"]) for m in per_site.values()
             if key in m and math.isfinite(m[key])]
    values, weights = zip(*pairs) if pairs else ((), ())
    return float(np.average(values, weights=weights)) if sum(weights) > 0 else math.nan


def train_totals(outcome, first_round: int = 1) -> dict[str, dict[str, float]]:
    """Per site, over the rounds from ``first_round``: accepted train replies' ``steps``
    and ``train-seconds``."""
    totals: dict[str, dict[str, float]] = {}
    for report in (r for n, r in outcome.reports.items() if n >= first_round):
        for site, metrics in report.train.items():
            row = totals.setdefault(site, {"steps": 0.0, "train-seconds": 0.0, "rounds": 0.0})
            row["steps"] += metrics.get("steps", 0.0)
            row["train-seconds"] += metrics.get("train-seconds", 0.0)
            row["rounds"] += 1
    return totals
