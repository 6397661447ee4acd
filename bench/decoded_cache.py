"""Site start-up time: decoding the site's files vs reading the decoded-data cache.

In deployment every Flower message runs in a new ClientApp process, which must
rebuild the site's task (read DICOM / NIfTI / PNG, window, resize) before it
can train. This measures, for one synthetic hospital of each task written at
``--image-size`` (the demo's defaults unless given):

* **decode**: ``task_cls(site, settings)``, what every process did before the
  cache (:mod:`clients.site.decoded_cache`);
* **cached**: :func:`clients.site.decoded_cache.load_task` with a warm cache
  (fingerprint of the site's files and the code, then one .npz read, no pickle);
* **first**: the same call with a cold cache (decode + write), once.

Median of ``--repeats`` alternating decode/cached pairs; the ratio decode /
cached is the speed-up. Results: ``bench/results/decoded_cache.json``. Usage::

    python bench/decoded_cache.py [--repeats 5] [--tasks pe-seg cxr-cls ct3d-cls]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clients.registry import synthetic_module, task_class  # noqa: E402
from clients.site.decoded_cache import load_task  # noqa: E402
from clients.training.site_task import TaskSettings  # noqa: E402

SETTINGS = {"pe-seg": TaskSettings(image_size=64), "cxr-cls": TaskSettings(image_size=64),
            "ct3d-cls": TaskSettings(image_size=32, volume_depth=16)}


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(task: str, root: Path, repeats: int) -> dict:
    """Decode vs cached start-up of one generated hospital of ``task``."""
    synthetic_module(task).generate_federation(root / task, num_sites=1, seed=0)
    site = root / task / "hospital-00"
    cache = root / f"{task}-cache"
    cls, settings = task_class(task), SETTINGS[task]
    first = _seconds(lambda: load_task(cls, site, settings, cache))
    decode, cached = [], []
    for _ in range(repeats):
        decode.append(_seconds(lambda: cls(site, settings)))
        cached.append(_seconds(lambda: load_task(cls, site, settings, cache)))
    files = sum(1 for p in site.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    (cache_file,) = cache.glob("*.npz")
    row = {"task": task, "site_files": files, "site_mb": size / 1e6,
           "cache_mb": cache_file.stat().st_size / 1e6, "first_s": first,
           "decode_s": statistics.median(decode), "cached_s": statistics.median(cached)}
    row["speedup"] = row["decode_s"] / row["cached_s"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tasks", nargs="+", default=list(GENERATORS), choices=list(GENERATORS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "decoded_cache.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(task, Path(tmp), args.repeats) for task in args.tasks]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": platform.platform(), "repeats": args.repeats,
                                    "rows": rows}, indent=2) + "\n")
    print("| task | site files | site MB | cache MB | decode s | cached s | decode / cached |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {r['site_files']} | {r['site_mb']:.1f} | {r['cache_mb']:.1f} | "
              f"{r['decode_s']:.3f} | {r['cached_s']:.3f} | {r['speedup']:.1f}x |")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
