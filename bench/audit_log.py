"""Cost of the site's audit log: microseconds per message audited, bytes per 1,000, verify time,
and a console page's time and memory at 100 to 100,000 records.

The site runtime appends one record per message it receives
(:class:`app.site_runtime.audit_log.AuditLog`, as :mod:`app.site_runtime.site_audit`
does). This appends ``--records`` records like the ones the runtime writes (kind
``message``, a train instruction's ``asked`` settings, the decision, bytes sent,
epsilon, seconds; every tenth one a refusal naming its rule) to a fresh log in a
temporary state dir per run (the runs' appends interleaved), timing each
:meth:`~app.site_runtime.audit_log.AuditLog.append`, then verifies each chain
(:func:`app.site_runtime.audit_chain.verify_chain`). Runs:

* ``fsync``: the default (each line and the head fsynced, 8 MiB segments);
* ``no-fsync``: ``sync=False``, what the file system's write-back costs without the flush;
* ``fsync-rotating`` / ``no-fsync-rotating``: segments of ``--rotate-bytes`` (64 KiB),
  so the appends include the rotations and the verification walks many segments.

Per run: median and 95th percentile microseconds per appended record, bytes on disk per
1,000 records (every segment plus head.json), seconds to verify 1,000 records.

The console (:class:`app.site_runtime.console_pages.AuditView`): for each of
``--console-sizes`` records (a log written without fsync, 8 MiB segments), the console's
first page (it verifies the whole log once), then ``--pages`` pages each after
``--new`` more records: the audit work of the Overview and of the Activity page (all
rows and the refused ones, its first :data:`~app.site_runtime.console.PAGE_ROWS` rows),
median seconds, and the peak memory a page allocates (``tracemalloc``, a page of its
own), with the records parsed per page and the memory the view holds. For comparison,
``full_page_s`` is what a page cost when the console read and verified the whole log
after every new record (``AuditLog.records`` and ``verify_chain``).

The timings are wall clock on whatever machine runs it (a shared machine: noisy; fsync
costs are the disk's). Results: ``bench/results/audit_log.json``. Usage::

    python bench/audit_log.py [--records 2000] [--rotate-bytes 65536]
        [--console-sizes 100,10000,100000] [--pages 5] [--new 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.site_runtime.audit_chain import verify_chain  # noqa: E402
from app.site_runtime.audit_log import DEFAULT_MAX_BYTES, AuditLog, audit_dir  # noqa: E402
from app.site_runtime.console import PAGE_ROWS  # noqa: E402
from app.site_runtime.console_pages import (  # noqa: E402
    AuditView, activity_rows, chain_banner, overview,
)

#: (name, fsync, rotate) of each run.
RUNS = (("fsync", True, False), ("no-fsync", False, False),
        ("fsync-rotating", True, True), ("no-fsync-rotating", False, True))


def message_record(number: int) -> dict:
    """A ``message`` record as the site runtime writes one for a train instruction."""
    refused = number % 10 == 9
    return {
        "kind": "message", "site": "hospital-03", "run": 4211836207, "federation": "fed-pe-seg",
        "app": "3f9c0a51d2e4b7c6a8f0e1d2c3b4a5968778695a4b3c2d1e0f9a8b7c6d5e4f30",
        "type": "train",
        "asked": {"server-round": 1 + number // 3, "local-steps": 20, "batch-size": 8,
                  "codec": "topk:0.05+q8", "error-feedback": True, "downlink-codec": "q8",
                  "task": "pe-seg", "image-size": 64, "optimizer": "sgd", "lr": 0.01,
                  "privacy.noise-multiplier": 1.1, "privacy.max-grad-norm": 1.0},
        "decision": "refused" if refused else "answered",
        "rule": "min-batch-size" if refused else None,
        "error_code": 4003 if refused else None,
        "bytes_sent": 0 if refused else 118_432 + number % 7,
        "epsilon": 0.0 if refused else 0.0213 + number * 1e-6,
        "seconds": 0.004 if refused else 12.731 + (number % 13) / 100,
    }


def _disk_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.iterdir()
               if path.is_file() and path.name != ".lock")


def measure(runs: Sequence[tuple[str, bool, int | None]], records: int,
            root: Path) -> list[dict]:
    """Append ``records`` records to a fresh log per run ``(name, fsync, rotate bytes or
    None)`` under ``root``, the runs' appends interleaved (the machine's noise falls on
    every run alike), then verify each log; one row per run."""
    logs = [AuditLog(root / name, max_bytes=rotate or DEFAULT_MAX_BYTES, sync=fsync)
            for name, fsync, rotate in runs]
    micros: list[list[float]] = [[] for _ in runs]
    for number in range(records):
        record = message_record(number)
        for log, times in zip(logs, micros):
            start = time.perf_counter()
            log.append(record)
            times.append((time.perf_counter() - start) * 1e6)
    rows = []
    for (name, fsync, rotate), times in zip(runs, micros):
        start = time.perf_counter()
        report = verify_chain(root / name)
        verify_seconds = time.perf_counter() - start
        if not report.ok or report.records != records:
            raise RuntimeError(f"{name}: {report.message()}")
        folder = audit_dir(root / name)
        rows.append({"name": name, "fsync": fsync, "records": records,
                     "max_bytes": rotate or DEFAULT_MAX_BYTES,
                     "segments": sum(1 for _ in folder.glob("audit*.jsonl")),
                     "us_per_record_median": statistics.median(times),
                     "us_per_record_p95": statistics.quantiles(times, n=20)[-1],
                     "bytes_per_1000": _disk_bytes(folder) * 1000 / records,
                     "verify_seconds_per_1000": verify_seconds * 1000 / records})
    return rows


def _page(view: AuditView) -> tuple[int, int]:
    """The audit work of an Overview and an Activity page (all rows, then the refused
    ones): ``(rows shown, rows counted)``."""
    records, _, chain = view.snapshot()
    overview(records)
    chain_banner(chain)
    rows = [activity_rows(records), activity_rows(records, decision="refused")]
    return sum(len(r[:PAGE_ROWS]) for r in rows), sum(len(r) for r in rows)


def _timed(action) -> tuple[float, int]:
    """``(seconds, peak bytes allocated)`` of ``action()``: timed, then run again under
    ``tracemalloc`` (it slows Python down) for its peak."""
    start = time.perf_counter()
    action()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    action()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak


def console_pages(sizes: Sequence[int], root: Path, pages: int = 5, new: int = 10
                  ) -> list[dict]:
    """One row per log size: the console's first page, then ``pages`` pages each after
    ``new`` more records, and the whole-log page it replaced."""
    rows = []
    for size in sizes:
        state = root / f"console-{size}"
        log = AuditLog(state, sync=False)
        for number in range(size):
            log.append(message_record(number))
        view = AuditView(state)
        start = time.perf_counter()
        _page(view)
        first_seconds = time.perf_counter() - start
        tracemalloc.start()
        traced = AuditView(state)
        _page(traced)
        held, first_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del traced
        times, peaks, parsed = [], [], []
        for page in range(pages):
            before = view.parsed
            for number in range(new):  # two pages' worth: one timed, one traced
                log.append(message_record(size + page * new + number))
            seconds = time.perf_counter()
            _page(view)
            times.append(time.perf_counter() - seconds)
            parsed.append(view.parsed - before)
            for number in range(new):
                log.append(message_record(size + page * new + number))
            tracemalloc.start()
            _page(view)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        full_seconds, full_peak = _timed(lambda: (list(log.records()), verify_chain(state)))
        rows.append({"records": size, "new_per_page": new, "pages": pages,
                     "first_page_s": first_seconds, "first_page_peak_mb": first_peak / 2**20,
                     "view_holds_mb": held / 2**20,
                     "page_s_median": statistics.median(times), "page_s_max": max(times),
                     "page_peak_mb_median": statistics.median(peaks) / 2**20,
                     "records_parsed_per_page": sorted(set(parsed)),
                     "full_page_s": full_seconds, "full_page_peak_mb": full_peak / 2**20})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run every configuration, write the JSON and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--rotate-bytes", type=int, default=64 * 1024)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the temporary state dirs go (its disk is the one measured)")
    parser.add_argument("--console-sizes", default="100,10000,100000",
                        help="log lengths the console's page is measured at (comma-separated)")
    parser.add_argument("--pages", type=int, default=5, help="pages measured per log length")
    parser.add_argument("--new", type=int, default=10, help="records appended before each page")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "audit_log.json")
    args = parser.parse_args(argv)
    runs = [(name, fsync, args.rotate_bytes if rotate else None) for name, fsync, rotate in RUNS]
    sizes = [int(size) for size in args.console_sizes.split(",") if size]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = measure(runs, args.records, Path(tmp))
        console = console_pages(sizes, Path(tmp), args.pages, args.new)
        disk = os.statvfs(tmp)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"platform": platform.platform(), "cpus": os.cpu_count(),
               "python": platform.python_version(), "block_size": disk.f_bsize,
               "note": "shared machine (2 cores, other engineers' tests running): noisy"}
    args.out.write_text(json.dumps({"runs": rows, "console": console, "machine": machine},
                                   indent=2) + "\n")
    print("| run | fsync | records | segments | µs/record median | µs/record p95 "
          "| bytes per 1,000 | verify s per 1,000 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {'yes' if r['fsync'] else 'no'} | {r['records']} | "
              f"{r['segments']} | {r['us_per_record_median']:.0f} | "
              f"{r['us_per_record_p95']:.0f} | {r['bytes_per_1000']:,.0f} | "
              f"{r['verify_seconds_per_1000']:.4f} |")
    print("\n| records | first page s | page s (median) | page peak MB | parsed per page "
          "| view holds MB | whole-log page s | whole-log page peak MB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in console:
        print(f"| {r['records']:,} | {r['first_page_s']:.3f} | {r['page_s_median']:.4f} | "
              f"{r['page_peak_mb_median']:.2f} | {', '.join(map(str, r['records_parsed_per_page']))} "
              f"| {r['view_holds_mb']:.1f} | {r['full_page_s']:.3f} | "
              f"{r['full_page_peak_mb']:.1f} |")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
