"""Benchmark the update codecs of ``strategies.compression`` on one CPU core.

For each codec spec, encode and decode a random 30M-parameter float32 update
(the size of a mid-sized 3D segmentation network), take the best of a few
repeats, and report

* encode / decode time (s) and throughput in MB/s of *dense float32 input*
  (``4 * d / (t_encode + t_decode)``, MB = 10**6 bytes),
* payload bytes and compression ratio (dense fp32 bytes / payload bytes),
* relative reconstruction error ``||decode(encode(v)) - v|| / ||v||``.

Results go to ``bench/results/codec_throughput.json`` and a table is printed.
Usage::

    python bench/codec_throughput.py [--size 30000000] [--repeats 3]

Threads are limited to one (BLAS/OpenMP env vars set before numpy loads) and,
where the OS allows it, the process is pinned to a single core.
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import ROOT  # noqa: I001

import os  # noqa: E402

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from report import Column, environment, print_table, write_report  # noqa: E402
from strategies.compression import decode, encode  # noqa: E402

SPECS = [
    "none", "fp16", "topk:0.01", "topk:0.001", "topk:0.1",
    "randk:0.01", "qsgd:4", "qsgd:16", "qsgd:127", "sign",
]
DEFAULT_OUTPUT = ROOT / "bench" / "results" / "codec_throughput.json"
#: The printed table, one row per codec spec.
COLUMNS = (
    Column("spec", "<12", lambda r: r["spec"]),
    Column("enc ms", "8.1f", lambda r: r["encode_s"] * 1e3),
    Column("dec ms", "8.1f", lambda r: r["decode_s"] * 1e3),
    Column("MB/s", "8.0f", lambda r: r["throughput_MBps"]),
    Column("payload B", "12,d", lambda r: r["payload_bytes"]),
    Column("ratio", "8.1f", lambda r: r["compression_ratio"]),
    Column("rel err", "8.4f", lambda r: r["relative_error"]),
)


def pin_to_one_core() -> int | None:
    """Pin this process to one CPU core; return it (None if unsupported)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def measure(
    vec: np.ndarray, spec: str, repeats: int, seed: int = 1
) -> dict[str, float | int | str]:
    """Best-of-``repeats`` encode and decode times and payload statistics."""
    best_encode = best_decode = float("inf")
    payload = out = None
    for _ in range(repeats):
        start = time.perf_counter()
        payload = encode(vec, spec, seed=seed)
        middle = time.perf_counter()
        out = decode(payload, spec, vec.size, seed=seed)
        end = time.perf_counter()
        best_encode = min(best_encode, middle - start)
        best_decode = min(best_decode, end - middle)
        del out
    assert payload is not None
    out = decode(payload, spec, vec.size, seed=seed)
    dense_bytes = 4 * vec.size
    error = np.linalg.norm((out - vec).astype(np.float64))
    rel_error = float(error / np.linalg.norm(vec.astype(np.float64)))
    return {
        "spec": spec,
        "encode_s": best_encode,
        "decode_s": best_decode,
        "encode_MBps": dense_bytes / best_encode / 1e6,
        "decode_MBps": dense_bytes / best_decode / 1e6,
        "throughput_MBps": dense_bytes / (best_encode + best_decode) / 1e6,
        "payload_bytes": int(payload.size),
        "compression_ratio": dense_bytes / payload.size,
        "relative_error": rel_error,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=30_000_000, help="update length d")
    parser.add_argument("--repeats", type=int, default=3, help="repeats per codec (best is kept)")
    parser.add_argument("--specs", nargs="*", default=SPECS, help="codec specs to run")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON output path")
    args = parser.parse_args(argv)

    core = pin_to_one_core()
    vec = np.random.default_rng(0).standard_normal(args.size, dtype=np.float32)
    started = time.perf_counter()
    results = [measure(vec, spec, args.repeats) for spec in args.specs]
    report = {
        "benchmark": "codec_throughput",
        "size": args.size,
        "dense_bytes": 4 * args.size,
        "distribution": "standard normal float32, seed 0",
        "repeats": args.repeats,
        "timing": "best of repeats; throughput = dense fp32 bytes / (encode + decode), MB = 1e6 bytes",
        **environment(),
        "pinned_core": core,
        "cpu": platform.processor() or platform.machine(),
        "wall_s": time.perf_counter() - started,
        "results": results,
    }
    write_report(args.output, report)
    print_table(f"d = {args.size:,} float32 ({4 * args.size / 1e6:.0f} MB dense), 1 thread, "
                f"core {core}, best of {args.repeats}", COLUMNS, results)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
