"""Cost of the site runtime's egress filter per reply, on the product's own task models.

A configuration of the product: two synthetic hospitals of the task
(``python -m clients.datagen synthetic``, 64 px) and one round of one local step through
the in-process engine (the real ServerApp and ClientApp) with the engine's
``egress_filter`` on (:class:`app.engine.VirtualSite`): every reply passes
:class:`app.site_runtime.egress_filter.EgressFilter` before it leaves, as the site
runtime holds it. Each reply the engine checked is judged again ``--repeat`` times, each
time on a fresh copy read back from its wire form (:func:`app.engine.grid.over_the_wire`),
as the runtime receives it from its worker: Flower's object hashes are not cached yet, so
the serialised-size check pays them, as the first check of a reply in the runtime does.

Models (the run config's defaults, ``image-size`` 64): the pe-seg 2.5D U-Net, the cxr
DenseNet (``model-size = "small"``, the default) and DenseNet121 (``"full"``, the size a
hospital deploys). Codecs: ``none``, ``fp16``, ``topk:0.01``, ``qsgd:16:b512``; the
evaluate replies of the ``none`` round. Per row: the model's entries, the reply's
serialised bytes, the check's median and 95th percentile milliseconds, and the median
milliseconds of the serialised-size computation alone
(:func:`strategies.rounds.reply_intake.wire_size` on a fresh copy: the part the audit
record computes too). Wall clock on whatever machine runs it. Results: ``bench/results/egress_filter.json``. Usage::

    python bench/egress_filter.py [--repeat 20] [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from single_thread import ROOT  # noqa: I001 - first: one BLAS thread

from engine_runs import run_product, synthetic_sites  # noqa: E402
from report import Column, environment, print_table, write_report  # noqa: E402

from app.engine import VirtualSite  # noqa: E402
from app.engine.grid import EgressCheck, over_the_wire  # noqa: E402
from app.site_runtime.egress_filter import EgressFilter  # noqa: E402
from strategies.wire import message_keys as keys  # noqa: E402
from strategies.rounds.instructions import unpack_arrays  # noqa: E402
from strategies.rounds.reply_intake import wire_size  # noqa: E402

#: (name, run-config overrides) of each model measured.
MODELS = (("pe-seg U-Net", {"task": "pe-seg"}),
          ("cxr DenseNet small", {"task": "cxr-cls", "model-size": "small"}),
          ("cxr DenseNet121", {"task": "cxr-cls", "model-size": "full"}))
CODECS = ("none", "fp16", "topk:0.01", "qsgd:16:b512")


def _seconds(call, repeat: int, reply) -> list[float]:
    """Wall seconds of ``call(fresh copy of reply)``, ``repeat`` times."""
    times = []
    for _ in range(repeat):
        fresh = over_the_wire(reply)
        started = time.perf_counter()
        call(fresh)
        times.append(time.perf_counter() - started)
    return times


def timed(site: VirtualSite, check: EgressCheck, repeat: int, egress: EgressFilter
          ) -> dict[str, Any]:
    """The row of one reply the engine's filter checked at ``site``, judged ``repeat`` times
    again by ``egress`` (``passed``: every verdict, the engine's included)."""
    message, reply = check.message, check.reply
    passed = [check.verdict.passed]
    checks = _seconds(lambda fresh: passed.append(
        egress.check(message, fresh, site.context, check.policy).passed), repeat, reply)
    sizes = _seconds(lambda fresh: wire_size(fresh.content), repeat, reply)
    return {"kind": message.metadata.message_type, "reply_bytes": wire_size(reply.content),
            "entries": sum(int(a.numpy().size) for a in
                           unpack_arrays(message.content[keys.ARRAYS]).values()),
            "passed": all(passed), "check_ms_median": 1e3 * statistics.median(checks),
            "check_ms_p95": 1e3 * sorted(checks)[int(0.95 * (len(checks) - 1))],
            "wire_size_ms_median": 1e3 * statistics.median(sizes)}


def measure(models: Sequence[tuple[str, dict]], codecs: Sequence[str], repeat: int,
            workdir: Path, folders_of: Mapping[str, Sequence[Path]] | None = None
            ) -> list[dict[str, Any]]:
    """One round per (model, codec); a row per (model, codec, message kind): the medians.

    ``folders_of`` maps a task to its site folders (default: two synthetic hospitals).
    """
    rows = []
    for name, overrides in models:
        task = overrides["task"]
        folders = (folders_of or {}).get(task) or synthetic_sites(task, 2, seed=0, image_size=64)
        for codec in codecs:
            sites = [VirtualSite.folder(folder, egress_filter=True) for folder in folders]
            run_product({**overrides, "num-server-rounds": 1, "local-steps": 1,
                         "strategy.codec": codec, "image-size": 64, "node-wait-timeout": 30,
                         "experiment": "egress-filter", "checkpoint-dir": str(workdir / "ckpt"),
                         "cross-site.finetune-steps": 0}, sites, workdir / name / codec)
            egress = EgressFilter()
            replies = [timed(site, check, repeat, egress)
                       for site in sites for check in site.egress_checks]
            kinds = ("train", "evaluate") if codec == codecs[0] else ("train",)
            for kind in kinds:
                mine = [r for r in replies if r["kind"] == kind]
                rows.append({"model": name, "codec": codec, "kind": kind,
                             "entries": mine[0]["entries"], "replies": len(mine),
                             "passed": all(r["passed"] for r in mine),
                             **{key: statistics.median(r[key] for r in mine) for key in
                                ("reply_bytes", "check_ms_median", "check_ms_p95",
                                 "wire_size_ms_median")}})
    return rows


#: The printed table's columns.
COLUMNS = (Column("model", "<19", lambda r: r["model"]),
           Column("entries", "10,d", lambda r: r["entries"]),
           Column("codec", "<13", lambda r: r["codec"]), Column("reply", "<9", lambda r: r["kind"]),
           Column("bytes", "11,.0f", lambda r: r["reply_bytes"]),
           Column("check ms", "9.2f", lambda r: r["check_ms_median"]),
           Column("p95 ms", "7.2f", lambda r: r["check_ms_p95"]),
           Column("wire size ms", "13.2f", lambda r: r["wire_size_ms_median"]),
           Column("passed", ">7", lambda r: "yes" if r["passed"] else "NO"))


def main(argv: list[str] | None = None) -> int:
    """Run every configuration, write the JSON and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="checks of each reply")
    parser.add_argument("--quick", action="store_true", help="the U-Net and two codecs only")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "bench" / "results" / "egress_filter.json")
    args = parser.parse_args(argv)
    models, codecs = (MODELS[:1], CODECS[:2]) if args.quick else (MODELS, CODECS)
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(models, codecs, args.repeat, Path(tmp))
    write_report(args.out, {"rows": rows, "repeat": args.repeat, **environment(),
                            "platform": platform.platform(), "cpus": os.cpu_count(),
                            "note": "shared machine (2 cores, other engineers' tests running)"})
    print_table("egress filter: milliseconds per reply (median of fresh copies)", COLUMNS, rows)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
