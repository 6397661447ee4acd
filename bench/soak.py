"""Soak: hundreds of rounds over the TLS deployment, with memory, descriptors and disk per round.

A real deployment on 127.0.0.1, started through the product's own tooling: a TLS
SuperLink with SuperNode authentication (:mod:`app.tooling.superlink`), the sites'
keys registered (:mod:`app.tooling.registration`), one SuperNode per site running
the hospital's site runner with its warm, sandboxed worker
(:mod:`app.site_runtime.supernode`), and one federation submitted with ``flwr run``
(:mod:`app.tooling.run_submission`). The sites are tiny synthetic pe-seg hospitals
(32x32, two train studies and one val study each) and every round is one local step
on a batch of 2, so the soak measures what the deployment keeps per round, not the
training.

A round has ended when the ServerApp prints its progress line (``Round N/R: ...``,
:func:`app.round_progress.progress_line`), which it does after the round's
checkpoint is written and its MLflow record sent. Then, per round:

* ``rss_mb``: resident memory (VmRSS) summed over every process of the deployment's
  process trees: the SuperLink and what it started (the ServerApp), each SuperNode
  and its site runner's workers (:func:`app.tooling.process_tree.descendants`).
  Shared pages count once per process, so the sum is above the machine's use; its
  trend is the point. ``pss_mb`` beside it counts shared pages once (smaps_rollup).
* ``fds``: open file descriptors of the same processes (``/proc/<pid>/fd``).
* ``state_mb``: bytes (apparent size) of the sites' state folders, the server
  checkpoints and the MLflow store (tracking database and artifacts); each part also
  apart (``site_state_mb``, of which ``audit_mb``; ``checkpoint_mb``; ``mlflow_mb``).
* ``superlink_db_mb``: the SuperLink's sqlite database (with its ``-wal``/``-shm``).

``rss_slope_mb_per_100_rounds`` is the least-squares slope of ``rss_mb`` over the
rounds after the warm-up (the first 10% of the rounds), per 100 rounds; the same
slope of ``fds``, ``state_mb``, ``audit_mb`` and ``superlink_db_mb`` is under
``slopes_per_100_rounds``. Each row also gives ``rss_mb_by_kind`` and ``fds_by_kind``
(superlink, superexec, serverapp, supernode: the site node with its runner, sandbox:
bubblewrap, worker), and the summary the slope of each kind and
``rss_slope_second_half_mb_per_100_rounds``.

What grows (docs/BENCHMARKS.md, "Soak"): RSS rises fast in the first rounds and ever
more slowly after (200 rounds: 244 MB per 100 rounds over rounds 21-100, 109 over
101-200, 29 over 151-200), spread over the SuperLink, the site nodes and the workers.
With ``MALLOC_ARENA_MAX=2`` the SuperLink's and the site nodes' growth is gone (59 -> 7
and 72 -> 16 MB per 100 rounds in 40 rounds): glibc's per-thread malloc arenas of
their gRPC threads filling up, not objects kept per round. The workers' environment is
scrubbed by the sandbox, so the cap does not reach them; in a 100-round run they are
the main growth and had not slowed by round 100 (+125 then +193 MB per 100 rounds, four
workers, rounds 11-50 / 51-100; anonymous memory, not file pages), and unsandboxed with
the allocator capped they still grow (+137): the workers' growth is not explained yet. Descriptors, the SuperLink's database (Flower deletes delivered messages) and the
checkpoints (one per federation, replaced each round) stay flat; the audit log and the
MLflow store (a few metric rows per round) grow by design.

Run: ``.venv/bin/python bench/soak.py [--rounds 200] [--sites 4]`` -> ``bench/results/soak.json``
(``--out`` elsewhere; ``--work DIR`` keeps the deployment's folder). If the run stops
early (a failure, Ctrl-C) the rounds measured so far are written, ``rounds`` saying
how many ran and ``status`` how it ended.
``tests/integration/test_soak.py`` runs :func:`soak` at 20 rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import re
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import flwr  # noqa: E402

from app.site_runtime.supernode import SuperNodeProcess  # noqa: E402
from app.tooling.certs import ensure_server_certificate, ensure_site_keys  # noqa: E402
from app.tooling.daemon import DaemonProcess  # noqa: E402
from app.tooling.environment import free_port  # noqa: E402
from app.tooling.flwr_cli import CONNECTION, wait_online, write_connection  # noqa: E402
from app.tooling.layout import DeployLayout  # noqa: E402
from app.tooling.process_tree import descendants, start_time  # noqa: E402
from app.tooling.registration import register_site  # noqa: E402
from app.tooling.run_submission import RunOutcome, submit_run  # noqa: E402
from app.tooling.superlink import SuperLinkProcess  # noqa: E402
from clients.datagen.federation import hospital_name  # noqa: E402
from clients.pe_seg.manifest import read_manifest, write_manifest  # noqa: E402
from clients.pe_seg.synthetic import generate_federation  # noqa: E402

OUT = ROOT / "bench" / "results" / "soak.json"
POLICY = ROOT / "configs" / "site-policy-permissive.toml"
#: The ServerApp's progress line of a finished round (app/round_progress.py).
ROUND_LINE = re.compile(r"Round (\d+)/(\d+): ")
#: Fraction of the rounds left out of the slopes as warm-up.
WARM_UP = 0.1
MB = 1e6


def tiny_hospitals(root: Path, sites: int) -> list[Path]:
    """``sites`` synthetic pe-seg hospitals (32x32) cut to two train and one val study."""
    folders = generate_federation(root, num_sites=sites, seed=0, image_size=32)
    for folder in folders:
        entries = read_manifest(folder)
        write_manifest(folder, [e for e in entries if e.split == "train"][:2]
                       + [e for e in entries if e.split == "val"][:1])
    return folders


def folder_bytes(path: Path) -> int:
    """Apparent size of every regular file under ``path`` (0 if it does not exist)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:  # removed while walking (an atomic replace)
                pass
    return total


#: A descendant's kind, by a word of its command line (first match; else ``other``).
KINDS = (("flwr-serverapp", "serverapp"), ("superexec", "superexec"), ("bwrap", "sandbox"),
         ("site_worker", "worker"))


def process_kind(pid: int, daemon_kind: str | None = None) -> str:
    """``superlink``/``supernode`` for a daemon itself, else its kind by :data:`KINDS`."""
    if daemon_kind is not None:
        return daemon_kind
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "other"
    return next((kind for word, kind in KINDS if word in command), "other")


def deployment_pids(daemons: list[DaemonProcess]) -> list[tuple[int, str]]:
    """(pid, start time) of each daemon and every live process it started."""
    return [(pid, started) for pid, started, _ in deployment_processes(daemons)]


def deployment_processes(daemons: list[DaemonProcess]) -> list[tuple[int, str, str]]:
    """(pid, start time, kind) of each daemon and every live process it started."""
    found = []
    for daemon in daemons:
        started = start_time(daemon.pid)
        if started is not None:
            kind = "superlink" if daemon.name == "flower-superlink" else "supernode"
            found.append((daemon.pid, started, kind))
        found.extend((pid, began, process_kind(pid)) for pid, began in descendants(daemon.pid))
    return found


def _kilobytes(path: Path, field: str) -> int:
    """The ``field:  N kB`` value of a /proc file (0 if the process is gone)."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def process_usage(processes: list[tuple[int, str, str]]) -> dict:
    """Summed RSS and PSS (MB) and open descriptors of ``processes``, and the RSS and
    descriptors of each kind apart (``rss_mb_by_kind``, ``fds_by_kind``)."""
    rss = pss = fds = 0
    rss_by_kind: dict[str, float] = {}
    fds_by_kind: dict[str, int] = {}
    for pid, _, kind in processes:
        proc = Path(f"/proc/{pid}")
        kilobytes = _kilobytes(proc / "status", "VmRSS")
        rss += kilobytes
        pss += _kilobytes(proc / "smaps_rollup", "Pss")
        try:
            opened = len(os.listdir(proc / "fd"))
        except OSError:
            opened = 0
        fds += opened
        rss_by_kind[kind] = rss_by_kind.get(kind, 0.0) + kilobytes * 1024 / MB
        fds_by_kind[kind] = fds_by_kind.get(kind, 0) + opened
    return {"rss_mb": rss * 1024 / MB, "pss_mb": pss * 1024 / MB, "fds": fds,
            "processes": len(processes), "rss_mb_by_kind": rss_by_kind,
            "fds_by_kind": fds_by_kind}


def slope_per_100(rounds: list[int], values: list[float]) -> float | None:
    """Least-squares slope of ``values`` over ``rounds``, per 100 rounds (None under 2)."""
    if len(rounds) < 2:
        return None
    mean_r, mean_v = sum(rounds) / len(rounds), sum(values) / len(values)
    spread = sum((r - mean_r) ** 2 for r in rounds)
    return 100 * sum((r - mean_r) * (v - mean_v) for r, v in zip(rounds, values)) / spread


class Deployment:
    """The soak's folders and daemons: a TLS SuperLink, the sites' SuperNodes."""

    def __init__(self, root: Path, sites: int) -> None:
        self.root = root
        self.sites = [hospital_name(i) for i in range(sites)]
        self.layout = DeployLayout(root / "deploy")
        self.flwr_home = root / "flwr-cli"
        self.state = root / "state"
        self.checkpoints = root / "checkpoints"
        self.mlflow = root / "mlflow"
        self.link: SuperLinkProcess | None = None
        self.nodes: list[SuperNodeProcess] = []

    def start(self, data: list[Path]) -> None:
        """Certificates and keys, the SuperLink, registration, SuperNodes online."""
        ensure_server_certificate(self.layout.certs, "localhost,127.0.0.1")
        for site in self.sites:
            ensure_site_keys(self.layout.certs, site)
        self.link = SuperLinkProcess.start_tls(self.layout, host="127.0.0.1", port=free_port(),
                                               startup_timeout=300)
        write_connection(self.flwr_home, CONNECTION, self.link.address, self.layout.ca_cert)
        node_ids = [register_site(self.layout, self.flwr_home, site) for site in self.sites]
        for site, folder in zip(self.sites, data):
            self.nodes.append(SuperNodeProcess.start(
                self.layout, site, self.link.address, folder, state_dir=self.state / site,
                port=free_port(), torch_threads=1, policy=POLICY))
        wait_online(self.flwr_home, node_ids, timeout=300, watch=self.nodes)

    @property
    def daemons(self) -> list[DaemonProcess]:
        return [*([self.link] if self.link else []), *self.nodes]

    def measure(self, server_round: int, started: float) -> dict[str, float]:
        """The round's row: processes, then the disk of each kind of state."""
        db = self.layout.superlink_dir
        audit = sum(folder_bytes(self.state / site / "audit") for site in self.sites)
        site_state = folder_bytes(self.state)
        checkpoint = folder_bytes(self.checkpoints)
        mlflow = folder_bytes(self.mlflow)
        return {"round": server_round, **process_usage(deployment_processes(self.daemons)),
                "state_mb": (site_state + checkpoint + mlflow) / MB,
                "superlink_db_mb": sum(p.stat().st_size for p in db.glob("state.db*")) / MB,
                "site_state_mb": site_state / MB, "audit_mb": audit / MB,
                "checkpoint_mb": checkpoint / MB, "mlflow_mb": mlflow / MB,
                "elapsed_s": time.monotonic() - started}

    def stop(self) -> list[str]:
        """Stop every daemon by PID; the command lines of processes still alive after."""
        pids = deployment_pids(self.daemons)
        for daemon in reversed(self.daemons):
            daemon.stop()
        left = []
        for pid, started in pids:
            if start_time(pid) == started:
                try:
                    left.append(Path(f"/proc/{pid}/cmdline").read_bytes()
                                .replace(b"\0", b" ").decode().strip())
                except OSError:
                    pass
        return left


def run_config(d: Deployment, rounds: int) -> str:
    """One local step on a batch of 2 at 32x32, every site every round, no final evaluation."""
    return (f"num-server-rounds={rounds} local-steps=1 batch-size=2 image-size=32 "
            f"min-nodes={len(d.sites)} final-evaluation=false "
            f"node-wait-timeout=300 round-timeout=600 checkpoint-dir=\"{d.checkpoints}\" "
            f"tracking-uri=\"sqlite:///{d.mlflow / 'mlflow.db'}\" "
            f"artifact-root=\"{d.mlflow / 'artifacts'}\" experiment=\"soak\"")


def federate(d: Deployment, rounds: int, per_round: list[dict],
             on_round: Callable[[dict], None], round_timeout: float) -> RunOutcome:
    """Submit the federation and measure after each round's progress line.

    Waits for each line at most ``round_timeout`` seconds; raises if none comes, or if
    a daemon exits. Rows are appended to ``per_round`` as they are measured.
    """
    ended: queue.Queue[int] = queue.Queue()
    tail: list[str] = []

    def on_line(line: str) -> None:
        tail[:] = (tail + [line])[-40:]
        match = ROUND_LINE.search(line)
        if match:
            ended.put(int(match.group(1)))

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as pool:
        run = pool.submit(submit_run, d.flwr_home, run_config(d, rounds),
                          timeout=600 + rounds * round_timeout, on_line=on_line)
        waited_since = time.monotonic()
        while not (run.done() and ended.empty()):
            try:
                server_round = ended.get(timeout=1.0)
            except queue.Empty:
                gone = [n.name for n in d.daemons if n.process.poll() is not None]
                if gone or time.monotonic() - waited_since > round_timeout:
                    raise RuntimeError(
                        f"{', '.join(gone) + ' exited' if gone else 'no round line'} after "
                        f"round {len(per_round)}:\n" + "".join(tail))
                continue
            row = d.measure(server_round, started)
            per_round.append(row)
            on_round(row)
            waited_since = time.monotonic()
        return run.result()


def summary(rounds: int, sites: int, per_round: list[dict]) -> dict:
    """The JSON document: the rows, and the slopes after the warm-up."""
    warm = max(1, math.ceil(WARM_UP * rounds))
    after = [row for row in per_round if row["round"] > warm]
    steps = [row["round"] for row in after]
    slopes = {key: slope_per_100(steps, [row[key] for row in after])
              for key in ("rss_mb", "pss_mb", "fds", "state_mb", "audit_mb", "site_state_mb",
                          "checkpoint_mb", "mlflow_mb", "superlink_db_mb")}
    late = [row for row in per_round if row["round"] > max(warm, rounds // 2)]
    kinds = sorted({kind for row in after for kind in row["rss_mb_by_kind"]})
    by_kind = {kind: slope_per_100(steps, [row["rss_mb_by_kind"].get(kind, 0.0) for row in after])
               for kind in kinds}
    return {"rounds": len(per_round), "sites": sites, "per_round": per_round,
            "rss_slope_mb_per_100_rounds": slopes["rss_mb"],
            "warm_up_rounds": warm, "slopes_per_100_rounds": slopes,
            "rss_slope_by_kind_mb_per_100_rounds": by_kind,
            "rss_slope_second_half_mb_per_100_rounds": slope_per_100(
                [row["round"] for row in late], [row["rss_mb"] for row in late]),
            "rounds_requested": rounds}


def soak(root: Path, rounds: int, sites: int, on_round: Callable[[dict], None] = lambda _: None,
         round_timeout: float = 600.0) -> dict:
    """Run the soak in ``root``: the summary (:func:`summary`) with ``status`` (the run's
    final status, or the error that stopped it) and ``left_behind`` (command lines of
    the deployment's processes still alive after the stop)."""
    d = Deployment(root, sites)
    per_round: list[dict] = []
    status = "not-started"
    try:
        data = tiny_hospitals(root / "data", sites)
        d.start(data)
        status = federate(d, rounds, per_round, on_round, round_timeout).status
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - the rounds so far are kept
        status = f"stopped: {type(exc).__name__}: {exc}"
    finally:
        left_behind = d.stop()
    return {**summary(rounds, sites, per_round), "status": status, "left_behind": left_behind}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--work", type=Path, default=None,
                        help="the deployment's folder, kept (default: a temporary one)")
    args = parser.parse_args(argv)
    measured_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]

    def show(row: dict) -> None:
        print(f"round {row['round']}: rss {row['rss_mb']:.0f} MB, pss {row['pss_mb']:.0f} MB, "
              f"{row['fds']} fds, {row['processes']} processes, state {row['state_mb']:.2f} MB, "
              f"superlink db {row['superlink_db_mb']:.2f} MB, {row['elapsed_s']:.0f} s; rss "
              + ", ".join(f"{kind} {mb:.0f}" for kind, mb in sorted(row["rss_mb_by_kind"].items())),
              flush=True)

    if args.work is not None:
        result = soak(args.work, args.rounds, args.sites, on_round=show)
    else:
        with tempfile.TemporaryDirectory(prefix="fedmed-soak-") as tmp:
            result = soak(Path(tmp), args.rounds, args.sites, on_round=show)
    result.update({"flwr": flwr.__version__, "measured_at": measured_at,
                   "load_average": f"{load_before:.1f} at start, "
                                   f"{os.getloadavg()[0]:.1f} at end"})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "per_round"}, indent=2))
    return 0 if result["status"] == "finished:completed" and not result["left_behind"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
