"""One federation of ``bench/limits.py``, alone in its own process: round parts and memory.

``python bench/limits_worker.py SPEC.json`` runs the product's ServerApp in the
in-process engine (:func:`app.engine.run_federation`) against one
:class:`app.engine.VirtualSite` per folder of the spec, each answered by the
product's real ClientApp (:func:`app.engine.virtual_site.default_handler`) through
:class:`TimedSite`, which only notes, per message, its wall seconds and the
process's resident set around it. It prints one line ``LIMITS-RESULT {json}``.

Its own process, so that its peak memory is the federation's alone. The server
and the sites share that process; they are told apart by *when* memory is held
(:class:`RssSampler`, ``VmRSS`` every few milliseconds):

* ``server_peak_mb``: the peak while no site answers a message: the interpreter,
  torch, MLflow, the ServerApp (replies held, intake, defence, aggregation,
  tracking) and what the virtual sites keep between messages (their contexts,
  decoded caches and whatever the allocator kept of their freed memory), so an
  upper bound of a coordinator's own process;
* ``site_peak_mb``: the largest rise of the resident set during one site's
  message above what the process held when the message came: the site's own
  working set (data, model, optimiser, activations) beyond the shared process.

With ``"throughput": true`` it also times the server's codecs and FedAvg on the
final global model (:func:`server_throughput`) in the same process.
"""

from __future__ import annotations

import single_thread  # noqa: F401  (first: one BLAS thread, repository root on sys.path)

import json
import re
import resource
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context, Message

from app.engine.grid import server_round
from app.engine.virtual_site import VirtualSite, default_handler
from engine_runs import run_product
from strategies.aggregation import fedavg_delta
from strategies.compression import decode, encode
from strategies.wire import message_keys as keys
from strategies.wire.model_layout import dense_update, pack_dense
from strategies.wire.errors import ConfigError
from clients.datagen.federation import hospital_name

__all__ = ["RssSampler", "TimedSite", "round_parts", "server_throughput", "main"]

MARKER = "LIMITS-RESULT "
_VMRSS = re.compile(r"^VmRSS:\s+(\d+) kB", re.MULTILINE)


def rss_mb() -> float:
    """This process's resident set now (``VmRSS``), MB (2**20 bytes)."""
    match = _VMRSS.search(Path("/proc/self/status").read_text())
    return int(match.group(1)) / 1024 if match else 0.0


@dataclass
class RssSampler:
    """Peak resident set outside the sites' messages, and each message's rise above its start."""

    interval: float = 0.005
    server_peak_mb: float = 0.0
    site_peak_mb: float = 0.0
    _inside: bool = False
    _entry_mb: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        now = rss_mb()
        if self._inside:
            self.site_peak_mb = max(self.site_peak_mb, now - self._entry_mb)
        else:
            self.server_peak_mb = max(self.server_peak_mb, now)

    def enter(self) -> None:
        self.sample()
        self._entry_mb, self._inside = rss_mb(), True

    def leave(self) -> None:
        self.sample()
        self._inside = False

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()


@dataclass
class TimedSite:
    """The product's ClientApp at one site, each message's wall seconds noted by (round, type)."""

    sampler: RssSampler
    seconds: dict[tuple[int, str], float] = field(default_factory=lambda: defaultdict(float))

    def __post_init__(self) -> None:
        self._app = default_handler()

    def __call__(self, message: Message, context: Context) -> Message:
        self.sampler.enter()
        started = time.perf_counter()
        try:
            return self._app(message, context)
        finally:
            kind = message.metadata.message_type.split(".")[0]
            self.seconds[(server_round(message), kind)] += time.perf_counter() - started
            self.sampler.leave()


def round_parts(report, timed: dict[str, TimedSite], link_mbps: float) -> dict[str, float]:
    """One round's parts, from its :class:`~strategies.rounds.round_report.RoundReport`.

    ``round_s`` is the ServerApp's own round time (``report.seconds``: train and
    evaluate); each site's pure training time is its own ``train-seconds`` metric
    (the trainer's, :mod:`clients.site.site_round`). The in-process engine answers
    the sites one after the other, so the server's part is the round less every
    site message (``server_s``); a deployment runs the sites side by side, so its
    round is projected as the slowest site's train message + the slowest evaluate
    message + the server's part + the slowest site's transfer (instruction down
    and reply up, ``link_mbps``), against the slowest site's pure training plus the
    same transfer (``ratio``).
    """
    r = report.server_round
    train_s = {site: float(m.get(keys.TRAIN_SECONDS, 0.0)) for site, m in report.train.items()}
    if not train_s:
        raise ConfigError(f"bench/limits_worker.py: round {r} has no accepted train reply "
                          f"(dropped: {report.train_dropped})")
    messages = {name: {kind: s for (rr, kind), s in t.seconds.items() if rr == r}
                for name, t in timed.items()}
    train_msg = max(m.get("train", 0.0) for m in messages.values())
    eval_msg = max(m.get("evaluate", 0.0) for m in messages.values())
    all_msgs = sum(s for m in messages.values() for s in m.values())
    server_s = max(report.seconds - all_msgs, 0.0)
    transfer_s = max((t.get("bytes-down", 0.0) + t.get("bytes-up", 0.0)) * 8 / (link_mbps * 1e6)
                     for t in report.traffic.values()) if report.traffic else 0.0
    slowest = max(train_s.values())
    projected = train_msg + eval_msg + server_s + transfer_s
    return {"round_s": report.seconds, "slowest_site_train_s": slowest,
            "sum_site_train_s": sum(train_s.values()), "slowest_train_message_s": train_msg,
            "slowest_evaluate_message_s": eval_msg, "server_s": server_s,
            "transfer_s": transfer_s, "projected_round_s": projected,
            "ratio": projected / (slowest + transfer_s),
            "in_process_ratio": report.seconds / sum(train_s.values())}


def _best(action, repeats: int) -> float:
    """The fewest seconds of ``repeats`` calls of ``action``."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def server_throughput(arrays: list[np.ndarray], sites: int, repeats: int = 3,
                      specs: tuple[str, ...] = ("none", "fp16", "topk:0.01")) -> dict[str, Any]:
    """GB/s (10**9 bytes of float32 input per second) of the server's own codec and FedAvg
    calls on ``arrays`` (a real model's), against ``np.sum`` of the same bytes.

    * ``encode`` / ``decode``: :func:`strategies.compression.encode` and ``decode`` of the
      model as one float32 vector per spec (the downlink codecs and the replies' payloads),
      and the dense reply path the server takes by default (``pack_dense`` /
      ``dense_update``, codec ``none``); against ``np.sum`` of that vector;
    * ``aggregate``: :func:`strategies.aggregation.fedavg_delta` of ``sites`` updates of the
      model's arrays, against ``np.sum(stacked, axis=0)`` of the same ``sites`` vectors.
    """
    vector = np.concatenate([np.ravel(a) for a in arrays if a.dtype.kind == "f"]).astype(
        np.float32)
    nbytes = vector.nbytes
    plain = _gbps(nbytes, _best(lambda: np.sum(vector), repeats))
    rows = []
    for spec in specs:
        payload = encode(vector, spec)
        enc = _gbps(nbytes, _best(lambda: encode(vector, spec), repeats))
        dec = _gbps(nbytes, _best(lambda: decode(payload, spec, vector.size), repeats))
        rows.append({"spec": spec, "encode_GBps": enc, "decode_GBps": dec,
                     "encode_vs_numpy_sum": enc / plain, "decode_vs_numpy_sum": dec / plain})
    packed = pack_dense(arrays)
    rows.append({"spec": "dense reply (pack_dense / dense_update)",
                 "encode_GBps": (enc := _gbps(nbytes, _best(lambda: pack_dense(arrays), repeats))),
                 "decode_GBps": (dec := _gbps(nbytes, _best(lambda: dense_update(packed, arrays),
                                                            repeats))),
                 "encode_vs_numpy_sum": enc / plain, "decode_vs_numpy_sum": dec / plain})
    deltas = [[a * (1.0 + 0.01 * i) if a.dtype.kind == "f" else a for a in arrays]
              for i in range(sites)]
    stacked = np.stack([vector * (1.0 + 0.01 * i) for i in range(sites)])
    agg = _gbps(sites * nbytes, _best(lambda: fedavg_delta(deltas, [10 + i for i in range(sites)]),
                                      repeats))
    plain_sum = _gbps(sites * nbytes, _best(lambda: np.sum(stacked, axis=0), repeats))
    return {"model_float32_mb": nbytes / 2**20, "numpy_sum_GBps": plain, "codecs": rows,
            "aggregate": {"updates": sites, "fedavg_GBps": agg, "numpy_sum_GBps": plain_sum,
                          "fedavg_vs_numpy_sum": agg / plain_sum},
            "min_ratio": min([agg / plain_sum] + [min(r["encode_vs_numpy_sum"],
                                                      r["decode_vs_numpy_sum"]) for r in rows])}


def _mean(rows: list[dict[str, float]], key: str) -> float:
    return sum(row[key] for row in rows) / len(rows)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """The federation of ``spec`` (overrides, site folders, workdir); its measured parts."""
    sampler = RssSampler()
    names = [hospital_name(i) for i in range(len(spec["sites"]))]
    timed = {name: TimedSite(sampler) for name in names}
    work = Path(spec["workdir"])
    sites = [VirtualSite.folder(Path(folder), site_name=name, state_dir=work / "state" / name,
                                handler=timed[name])
             for name, folder in zip(names, spec["sites"])]
    baseline = rss_mb()
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    try:
        outcome, wall = run_product(spec["overrides"], sites, work)
    finally:
        sampler.stop()
        thread.join()
    rounds = [outcome.reports[r] for r in sorted(outcome.reports)]
    later = rounds[1:] or rounds  # round 1 also pays imports and the first data load
    parts = [round_parts(report, timed, spec["link_mbps"]) for report in later]
    arrays = outcome.arrays.to_numpy_ndarrays()
    result = {key: _mean(parts, key) for key in parts[0]}
    result.update({
        "rounds_measured": [report.server_round for report in later],
        "round_s_each": [p["round_s"] for p in parts],
        "first_round_s": rounds[0].seconds,
        "model_mb": sum(a.nbytes for a in arrays) / 2**20,
        "model_parameters": int(sum(a.size for a in arrays)),
        "server_peak_mb": sampler.server_peak_mb, "site_peak_mb": sampler.site_peak_mb,
        "baseline_mb": baseline,
        "process_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "wall_s": wall})
    if spec.get("throughput"):
        result["throughput"] = server_throughput(arrays, len(spec["sites"]),
                                                 repeats=spec.get("repeats", 3))
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python bench/limits_worker.py SPEC.json", file=sys.stderr)
        return 2
    print(MARKER + json.dumps(run(json.loads(Path(args[0]).read_text()))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
