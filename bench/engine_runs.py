"""A benchmark run is a configuration of the product: site folders + run config + the engine.

The benchmarks that train a task model (``compression_to_target``,
``compression_fedavg``, ``fednova_pe_task``) describe a federation and run it
with :func:`app.engine.run_federation`: the real ServerApp (reply intake,
default norm-bound defence, size caps, downlink, tracking) against the real
ClientApp at each virtual site (site policy, training, codecs). They read
what they report from the returned :class:`app.server_app.FederationOutcome`:
per round the aggregated validation metrics, every site's train metrics and
the serialised bytes each instruction and reply took (``traffic``).

Site folders come from the product's generators, once, under ``data/bench/``
(git-ignored): ``python -m clients.datagen synthetic`` for the synthetic
hospitals and ``python -m clients.datagen shared`` for a real shared set
(``../shared/data``, read only).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from single_thread import ROOT
from clients.datagen.federation import hospital_name

__all__ = ["DATA", "SHARED", "RoundSeries", "shared_sites", "synthetic_sites",
           "run_product", "series"]

#: Where the benchmarks' site folders are written (git-ignored).
DATA = ROOT / "data" / "bench"
#: The shared real sets (read only).
SHARED = ROOT.parent / "shared" / "data"


def _datagen(args: Sequence[str], out: Path, sites: int) -> list[Path]:
    """Run ``python -m clients.datagen ARGS --out OUT`` once; the site folders."""
    folders = [out / hospital_name(i) for i in range(sites)]
    stamp = out / f".sites-{sites}"
    if not stamp.is_file():
        subprocess.run([sys.executable, "-m", "clients.datagen", *args, "--out", str(out),
                        "--sites", str(sites)], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        stamp.touch()
    return folders


def synthetic_sites(task: str, sites: int, seed: int, image_size: int,
                    root: Path = DATA) -> list[Path]:
    """The task's synthetic hospitals (``clients.datagen synthetic``), generated once."""
    out = (root / f"synthetic-{task}-{image_size}px-seed{seed}").resolve()
    return _datagen(["synthetic", "--task", task, "--seed", str(seed),
                     "--image-size", str(image_size)], out, sites)


def shared_sites(task: str, set_name: str, sites: int, seed: int, scheme: str = "iid",
                 alpha: float = 0.5, shared: Path = SHARED, root: Path = DATA) -> list[Path]:
    """A shared real set dealt to ``sites`` folders (``clients.datagen shared``), once."""
    tag = f"{set_name}-{scheme}{alpha if scheme == 'dirichlet' else ''}-seed{seed}"
    out = (root / f"shared-{task}-{tag}-sites{sites}").resolve()  # a site count of its own
    return _datagen(["shared", "--task", task, "--set", set_name, "--shared", str(shared),
                     "--scheme", scheme, "--alpha", str(alpha), "--seed", str(seed)],
                    out, sites)


def run_product(overrides: Mapping[str, Any], sites: Sequence, workdir: Path):
    """One federation of the product in this process; the outcome and its wall seconds.

    ``sites`` are :class:`app.engine.VirtualSite` objects. MLflow tracks into
    ``workdir`` (one SQLite store per benchmark process); no checkpoints, no
    final cross-site evaluation unless ``overrides`` ask for them.
    """
    from app.engine import run_federation  # noqa: PLC0415 - torch and MLflow load on use

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    config = {"tracking-uri": f"sqlite:///{workdir / 'mlflow.db'}",
              "artifact-root": str(workdir / "artifacts"), "final-evaluation": False,
              **overrides}
    started = time.perf_counter()
    outcome = run_federation(config, sites)
    return outcome, time.perf_counter() - started


@dataclass
class RoundSeries:
    """Per-round values of one federation, read from its round reports (round 1 first).

    Attributes
    ----------
    metrics : dict[str, list[float | None]]
        Aggregated validation metrics per round (``val-auc`` -> ``auc``...);
        ``None`` for a round whose every evaluate reply was dropped (e.g. a
        non-finite loss: the server keeps no metric of that round).
    bytes_up, bytes_down : list[list[int]]
        Per round, per site (sorted by name): serialised reply and instruction bytes.
    dense_fp32_bytes : int
        The model as raw float32 (``bytes-up x uplink-ratio`` of a reply).
    train : list[dict[str, dict[str, float]]]
        Per round, each site's train metrics (``steps``, ``a-norm``, ``residual-norm``...).
    selection_losses : list[dict[str, float]]
        Per round, the query losses a Power-of-Choice selector asked for (else empty).
    dropped : list[dict[str, str]]
        Per round, the train replies the server dropped and why.
    """

    metrics: dict[str, list[float | None]]
    bytes_up: list[list[int]]
    bytes_down: list[list[int]]
    dense_fp32_bytes: int
    train: list[dict[str, dict[str, float]]]
    selection_losses: list[dict[str, float]]
    dropped: list[dict[str, str]]

    @property
    def rounds(self) -> int:
        return len(self.bytes_up)


def _value(value: float | None) -> float | None:
    return None if value is None else float(value)


def series(outcome) -> RoundSeries:
    """The :class:`RoundSeries` of a :class:`~app.server_app.FederationOutcome`."""
    reports = [outcome.reports[r] for r in sorted(outcome.reports)]
    names = sorted({key for report in reports for key in report.evaluate_aggregate
                    if key.startswith("val-")})
    metrics = {key[len("val-"):]: [_value(report.evaluate_aggregate.get(key))
                                   for report in reports] for key in names}
    fp32 = next((int(round(t["bytes-up"] * t["uplink-ratio"])) for report in reports
                 for t in report.traffic.values() if t.get("uplink-ratio")), 0)
    return RoundSeries(
        metrics=metrics,
        bytes_up=[[int(r.traffic[s].get("bytes-up", 0)) for s in sorted(r.traffic)]
                  for r in reports],
        bytes_down=[[int(r.traffic[s].get("bytes-down", 0)) for s in sorted(r.traffic)]
                    for r in reports],
        dense_fp32_bytes=fp32,
        train=[dict(r.train) for r in reports],
        selection_losses=[dict(r.selection.get("losses", {})) for r in reports],
        dropped=[dict(r.train_dropped) for r in reports])
