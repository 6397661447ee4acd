"""Time and memory against the limits: the product's overhead over pure training, on CPU.

Issue 49, item 4. Every federation is the product's ServerApp in the in-process
engine against the real ClientApp at each virtual site, each in a process of its
own (:mod:`limits_worker`, which says how the server's and a site's memory are
told apart). Measured, for the default preset (``configs/pe-seg-default.toml``)
and every clinical preset present (``configs/*-clinical*.toml``), each at the
reduced scale its row's ``data_scale`` states (two CPU cores):

* **round vs pure training** (``runs``): per round from round 2 on, the ServerApp's
  round time (``round_s``, its RoundReport), the slowest site's own
  ``train-seconds`` (the trainer's time for the round's steps), the transfer of
  its instruction and reply at ``--link-mbps``, and ``ratio``: the round a
  deployment would take with the sites side by side (slowest train message +
  slowest evaluate message + the server's part + transfer, all measured here)
  over the slowest site's training + transfer. Goal: <= 1.1.
  ``in_process_ratio`` is the engine's own round over the sum of every site's
  training (the engine answers the sites one after the other);
* **decode vs disk** (``study_decode``): :func:`clients.io.dicom_series.read_dicom_series`
  of one synthetic 512x512 CT series (:mod:`clients.pe_seg.synthetic`) against reading
  the same files' bytes (page cache warm: both read it after one untimed read); and
  the first round against the later ones (a site decodes its data once, in round 1).
  Goal: decode not the bottleneck of a round after the first;
* **server throughput** (``server_throughput``): the server's codecs and FedAvg on the
  preset's model, in GB/s against ``np.sum`` of the same arrays. Goal: >= 0.5x;
* **growth** (``growth``): round time and server memory from 3 to 50 sites at a fixed,
  tiny per-site load (pe-seg, 32 px, 2 steps), with a least-squares slope (s/site,
  MB/site) and the last segment's slope over the first's (> 1: growing faster than
  linear). Goal: linear or better.

Results: ``bench/results/limits.json``. Run it alone (``--skip-clinical``: about 7
minutes on two cores; each clinical preset adds its own data generation and run)::

    nice -n 19 .venv/bin/python bench/limits.py [--skip-clinical] [--link-mbps 100]
    .venv/bin/python bench/limits.py --quick --out /tmp/limits.json   # tiny, minutes
"""

from __future__ import annotations

import single_thread  # noqa: F401  (first: one BLAS thread, repository root on sys.path)

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from engine_runs import synthetic_sites
from limits_worker import MARKER, _best
from report import Column, environment, print_table, write_report
from single_thread import ROOT
from strategies.wire.errors import FederationError

__all__ = ["Preset", "presets", "federation_point", "study_decode", "growth_fit", "main"]

RESULTS = ROOT / "bench" / "results" / "limits.json"
DEFAULT_PRESET = ROOT / "configs" / "pe-seg-default.toml"
#: Keys of a preset this benchmark scales down on two CPU cores (the rest are kept).
SCALED = ("local-steps", "num-server-rounds", "image-size", "batch-size")
GROWTH_LOAD = {"task": "pe-seg", "image-size": 32, "local-steps": 2, "batch-size": 2,
               "num-server-rounds": 3, "optimizer": "sgd", "lr": 0.01}
RUN_COLUMNS = (
    Column("preset", "<28", lambda r: r["preset"]),
    Column("sites", "5d", lambda r: r["sites"]),
    Column("round s", "8.2f", lambda r: r["round_s"]),
    Column("train s", "8.2f", lambda r: r["slowest_site_train_s"]),
    Column("ratio", "6.2f", lambda r: r["ratio"]),
    Column("server MB", "9.0f", lambda r: r["server_peak_mb"]),
    Column("model MB", "8.1f", lambda r: r["model_mb"]),
    Column("site MB", "8.0f", lambda r: r["site_peak_mb"]),
)


class Preset:
    """A run-config preset (TOML) and the reduced scale it runs at here."""

    def __init__(self, path: Path, scale: dict[str, int]) -> None:
        self.path = Path(path)
        self.values = tomllib.loads(self.path.read_text())
        unknown = sorted(set(scale) - set(SCALED))
        if unknown:
            raise FederationError(f"bench/limits.py: cannot scale {unknown}; only {SCALED}")
        self.scale = scale
        self.name = self.path.stem

    @property
    def overrides(self) -> dict[str, Any]:
        return {**self.values, **self.scale}

    @property
    def data_scale(self) -> dict[str, Any]:
        """Each scaled key as ``[used here, the preset's]`` and the fraction of its steps."""
        preset = {key: self.values.get(key) for key in self.scale}
        steps = self.values.get("local-steps")
        return {**{key: [self.scale[key], preset[key]] for key in self.scale},
                "step_fraction": (self.overrides["local-steps"] / steps) if steps else None}


def presets(quick: bool, clinical: bool = True) -> list[Preset]:
    """The default preset and (``clinical``) every ``configs/*-clinical*.toml``, scaled."""
    if quick:
        return [Preset(DEFAULT_PRESET, {"local-steps": 2, "num-server-rounds": 2,
                                        "image-size": 32, "batch-size": 2})]
    found = [Preset(DEFAULT_PRESET, {"local-steps": 20, "num-server-rounds": 3})]
    for path in sorted((ROOT / "configs").glob("*-clinical*.toml")) if clinical else ():
        found.append(Preset(path, {"local-steps": 2, "num-server-rounds": 2, "batch-size": 2}))
    return found


def federation_point(overrides: dict[str, Any], folders: list[Path], work: Path,
                     link_mbps: float, throughput: bool, repeats: int = 3,
                     timeout: float = 1800.0) -> dict[str, Any]:
    """One federation in a fresh process (:mod:`limits_worker`); what it measured."""
    work.mkdir(parents=True, exist_ok=True)
    config = {**overrides, "min-nodes": len(folders), "experiment": "limits",
              "node-wait-timeout": 60.0, "round-timeout": 1200.0}
    spec = {"overrides": config, "sites": [str(f) for f in folders], "workdir": str(work),
            "link_mbps": link_mbps, "throughput": throughput, "repeats": repeats}
    (work / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "FEDMED_TORCH_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "limits_worker.py"),
                           str(work / "spec.json")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    (work / "worker.log").write_text(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    if done.returncode != 0 or not lines:
        raise FederationError(f"bench/limits.py: worker exited {done.returncode} without a "
                              f"result; see {work / 'worker.log'}")
    return json.loads(lines[-1][len(MARKER):])


def study_decode(work: Path, image_size: int, repeats: int) -> dict[str, Any]:
    """Decode of one synthetic CT series (``image_size`` px) against reading its files' bytes."""
    from clients.io.dicom_series import list_series_files, read_dicom_series  # noqa: PLC0415
    from clients.pe_seg.synthetic import IMAGE_DIR, generate_study, site_profiles  # noqa: PLC0415

    profile = site_profiles(1, seed=3)[0]
    folder = work / "study-000" / IMAGE_DIR
    if not folder.is_dir():
        generate_study(work, "study-000", replace(profile, num_slices=(64, 64)),
                       np.random.default_rng(3), image_size, with_pe=True)
    files = list_series_files(folder)
    nbytes = sum(f.stat().st_size for f in files)
    read_bytes = lambda: [f.read_bytes() for f in files]  # noqa: E731
    read_bytes()  # warm the page cache for both
    volume = read_dicom_series(folder)
    read_s = _best(read_bytes, repeats)
    decode_s = _best(lambda: read_dicom_series(folder), repeats)
    return {"image_size": image_size, "slices": len(files), "shape": list(volume.hu.shape),
            "file_mb": nbytes / 2**20, "read_s": read_s, "decode_s": decode_s,
            "decode_over_read": decode_s / read_s, "read_GBps": nbytes / read_s / 1e9,
            "decode_GBps": nbytes / decode_s / 1e9, "page_cache": "warm"}


def _segment_slope(xs: list[int], ys: list[float], first: bool) -> float:
    i = 0 if first else len(xs) - 2
    return (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])


def growth_fit(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Least-squares slope of round time and server memory over the site count, and linearity.

    ``growth_ratio`` of a quantity: its last segment's slope over its first's (1: linear,
    < 1: better, > 1: growing faster); ``per_site_ratio``: round seconds per site at the
    most sites over at the fewest.
    """
    if len(points) < 2:
        raise FederationError("bench/limits.py: growth needs at least two site counts")
    xs = [p["sites"] for p in points]
    fit: dict[str, Any] = {"sites": xs}
    for key, unit in (("round_s", "s_per_site"), ("server_peak_mb", "mb_per_site")):
        ys = [p[key] for p in points]
        slope, intercept = np.polyfit(xs, ys, 1)
        first, last = _segment_slope(xs, ys, True), _segment_slope(xs, ys, False)
        fit[key] = {"values": ys, unit: float(slope), "intercept": float(intercept),
                    "first_segment_slope": first, "last_segment_slope": last,
                    "growth_ratio": (last / first) if first > 0 else None}
    fit["per_site_ratio"] = (points[-1]["round_s"] / xs[-1]) / (points[0]["round_s"] / xs[0])
    fit["linear_or_better"] = all(
        fit[key]["last_segment_slope"] <= 1.25 * max(fit[key]["first_segment_slope"], 0.0)
        + (0.0 if key == "round_s" else 1.0)  # 1 MB: the sampler's noise on memory
        for key in ("round_s", "server_peak_mb"))
    return fit


def _row(preset: Preset, sites: int, point: dict[str, Any]) -> dict[str, Any]:
    keep = ("round_s", "slowest_site_train_s", "ratio", "server_peak_mb", "model_mb",
            "site_peak_mb")
    extra = {k: v for k, v in point.items() if k not in keep and k != "throughput"}
    return {"preset": preset.name, "sites": sites, **{k: point[k] for k in keep},
            "data_scale": preset.data_scale, **extra}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes (CI): default preset only, 2 sites, growth 2 -> 3")
    parser.add_argument("--link-mbps", type=float, default=100.0,
                        help="link speed of the transfer added to both sides of the ratio")
    parser.add_argument("--sites", type=int, default=3, help="sites of each preset's run")
    parser.add_argument("--growth", type=int, nargs="+", default=[3, 10, 25, 50])
    parser.add_argument("--skip-clinical", action="store_true",
                        help="the default preset only (the clinical ones take longest)")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/fedmed-bench-limits"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.link_mbps <= 0:
        parser.error("--link-mbps must be > 0")
    sites, growth = (2, [2, 3]) if args.quick else (args.sites, sorted(args.growth))
    repeats = 1 if args.quick else 3
    started = time.monotonic()
    runs, throughput = [], {}
    for preset in presets(args.quick, not args.skip_clinical):
        values = preset.overrides
        folders = synthetic_sites(values["task"], sites, seed=0,
                                  image_size=int(values.get("image-size", 64)), root=args.cache)
        point = federation_point(values, folders, args.cache / "runs" / preset.name,
                                 args.link_mbps, throughput=True, repeats=repeats)
        throughput[preset.name] = point.pop("throughput")
        runs.append(_row(preset, sites, point))
    distinct = synthetic_sites(GROWTH_LOAD["task"], 3, seed=1,
                               image_size=GROWTH_LOAD["image-size"], root=args.cache)
    points = []
    for count in growth:
        folders = [distinct[i % len(distinct)] for i in range(count)]
        point = federation_point(GROWTH_LOAD, folders, args.cache / "growth" / f"sites-{count}",
                                 args.link_mbps, throughput=False)
        points.append({"sites": count, **point})
    decode = study_decode(args.cache / "study", 64 if args.quick else 512, repeats)
    first_round = {r["preset"]: {"first_round_s": r["first_round_s"], "later_round_s": r["round_s"]}
                   for r in runs}
    report = {
        "runs": runs,
        "server_throughput": throughput,
        "study_decode": {**decode, "rounds": first_round},
        "growth": {"load": GROWTH_LOAD, "points": points, "fit": growth_fit(points)},
        "goals": {"ratio_at_most": 1.1, "throughput_vs_numpy_sum_at_least": 0.5,
                  "growth": "linear or better"},
        "link_mbps": args.link_mbps, "quick": args.quick,
        "clinical_presets": [r["preset"] for r in runs if "clinical" in r["preset"]],
        "environment": {**environment(), "cpus": os.cpu_count(),
                        "machine": platform.processor() or platform.machine(),
                        "load_average": os.getloadavg(),
                        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "wall_s": time.monotonic() - started,
    }
    write_report(args.out, report)
    print_table("Round against the slowest site's training", RUN_COLUMNS, runs)
    print_table("Growth at a fixed per-site load", RUN_COLUMNS,
                [{**p, "preset": "growth"} for p in points])
    fit = report["growth"]["fit"]
    print(f"growth: {fit['round_s']['s_per_site']:.3f} s/site, "
          f"{fit['server_peak_mb']['mb_per_site']:.2f} MB/site, linear or better: "
          f"{fit['linear_or_better']}; decode/read of a {decode['image_size']} px series: "
          f"{decode['decode_over_read']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
