"""Seconds per message at a hospital: one process per message (Flower) vs the warm site worker.

A real deployment on 127.0.0.1: a TLS SuperLink with SuperNode authentication
and two TLS SuperNodes on small synthetic hospitals (32x32 pe-seg, three studies
each, ``local-steps=1``), so each message costs little work and the rest is
the site's overhead. The same federation runs twice:

* **before**: ``flower-supernode --isolation subprocess``, Flower's executor: one
  ``flwr-clientapp`` process per message (imports torch/MONAI, loads the app);
* **after**: :mod:`app.site_runtime.site_node`: the SuperNode with the hospital's
  site runner (app check) and a warm worker per (app, task).

Per message: seconds from the ServerApp's push of the instruction to its pull
of the reply (MLflow ``site/<name>/train-reply-seconds`` and
``evaluate-reply-seconds``, :class:`strategies.rounds.round_policy.Collected`),
train and evaluate messages of every round and site. The first round's
messages include the warm worker's start and are reported apart.

Writes ``bench/results/site_overhead.json``::

    {"before_s": median, "after_s": median, "messages": n, "flwr": version, ...}

with the Flower version, the time and the machine's load average, and under
``earlier`` the summaries of the runs the file held before (newest first), so a
re-measurement (e.g. after a Flower upgrade) stands beside the figures it replaces.

and, per mode, the median of each phase of a message (``phases_median_s``, read
from the SuperNodes' logs by ``bench/site_overhead_phases.py``): the SuperNode's
receipt from the SuperLink (``receive_s``); with the warm worker the site runner's
phases as its line logs them: its pull (``pull_s``), its own answer (``answer_s``:
policy, app and install checks, less what lies inside it), the worker's round trip
(``worker_s``), its push (``push_s``), the audit append (``audit_s``), and any
part it logs later (a sandbox, an egress filter) under its own name; the time at
the site, the send of the reply and the rest (``at_site_s``, ``send_s``,
``rest_s``). An earlier run's summary under ``earlier`` keeps its phases, so a
change's cost reads off the two.

Run: ``.venv/bin/python bench/site_overhead.py [--rounds 6] [--logs DIR]`` (about 5
minutes on two cores). ``--logs DIR`` keeps the SuperLink's and the SuperNodes' logs
and each run's ``flwr run`` output there (the site runner logs its parts per message,
``pull X s (receipt R s), answer Y s (worker W s), push Z s, audit A s``; with
``FLWR_LOG_LEVEL=DEBUG`` every Flower process logs its requests with timestamps).
``--runners warm`` measures one kind only (no JSON written).

``--runners flower,warm,unsandboxed`` also runs the warm worker with the policy's
``sandbox = "off"`` (a plain process; the runtime's gate, ledger and egress filter still
run) and adds ``sandbox``: the warm message's median with the sandbox over without, and
both runs' phases (the egress filter's own cost is the ``egress_s`` phase).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import flwr  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from app.tooling.certs import ensure_server_certificate, ensure_site_keys  # noqa: E402
from app.tooling.environment import free_port  # noqa: E402
from app.tooling.flwr_cli import CONNECTION, wait_online, write_connection  # noqa: E402
from app.tooling.layout import DeployLayout  # noqa: E402
from app.tooling.registration import register_site  # noqa: E402
from app.tooling.run_submission import submit_run  # noqa: E402
from app.tooling.superlink import SuperLinkProcess  # noqa: E402
from app.site_runtime.supernode import SuperNodeProcess  # noqa: E402
from clients.pe_seg.manifest import read_manifest, write_manifest  # noqa: E402
from clients.pe_seg.synthetic import generate_federation  # noqa: E402
from site_overhead_phases import median_phases, message_phases  # noqa: E402

SITES = ("hospital-a", "hospital-b")
OUT = ROOT / "bench" / "results" / "site_overhead.json"
#: What an earlier run's summary keeps (``earlier`` in the JSON).
SUMMARY_KEYS = ("before_s", "after_s", "ratio", "messages", "rounds", "first_round_median_s",
                "phases_median_s", "flwr", "measured_at", "load_average")


def earlier_runs(path: Path) -> list[dict]:
    """The summaries of the runs ``path`` holds (its own first, then its ``earlier``)."""
    if not path.is_file():
        return []
    previous = json.loads(path.read_text())
    return [{k: previous[k] for k in SUMMARY_KEYS if k in previous},
            *previous.get("earlier", [])]


def small_hospitals(root: Path) -> list[Path]:
    """Two synthetic hospitals (32x32) cut to three studies each: two train, one val."""
    sites = generate_federation(root, num_sites=len(SITES), seed=0, image_size=32)
    for site in sites:
        entries = read_manifest(site)
        write_manifest(site, [e for e in entries if e.split == "train"][:2]
                       + [e for e in entries if e.split == "val"][:1])
    return sites


def reply_seconds(tracking: str, experiment: str) -> dict[tuple[str, str, int], float]:
    """``(site, "train" or "evaluate", round) -> reply seconds`` of the experiment's run."""
    client = MlflowClient(tracking)
    run = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])[0]
    seconds: dict[tuple[str, str, int], float] = {}
    for key in run.data.metrics:
        if key.startswith("site/") and key.endswith("-reply-seconds"):
            _, site, name = key.split("/")
            for metric in client.get_metric_history(run.info.run_id, key):
                seconds[(site, name.split("-")[0], metric.step)] = metric.value
    return seconds


def later_phases(logs: dict[str, str], seconds: dict[tuple[str, str, int], float]) -> dict:
    """Median phases (``bench/site_overhead_phases.py``) of the messages of rounds 2 onward.

    The k-th train (evaluate) message in a site's log is that of round k.
    """
    later, totals = [], []
    for site, text in logs.items():
        count: dict[str, int] = {}
        for message in message_phases(text):
            count[message["kind"]] = count.get(message["kind"], 0) + 1
            if count[message["kind"]] > 1 and (site, message["kind"], count[message["kind"]]) \
                    in seconds:
                later.append(message)
                totals.append(seconds[(site, message["kind"], count[message["kind"]])])
    return median_phases(later, totals)


def federate(root: Path, link: SuperLinkProcess, layout: DeployLayout, flwr_home: Path,
             data: list[Path], runner: str, rounds: int, logs: Path | None = None
             ) -> tuple[dict[int, list[float]], dict]:
    """One federation with SuperNodes of kind ``runner``: reply seconds per round, and the
    median phases of rounds 2 onward (:func:`later_phases`).

    With ``logs``, the run's ``flwr run`` output is written to ``logs/<runner>-run.log``.
    """
    tracking = f"sqlite:///{root / f'mlflow-{runner}.db'}"
    policy = ROOT / "configs" / "site-policy-permissive.toml"
    if runner == "unsandboxed":  # the warm worker as a plain process
        policy = root / "policy-unsandboxed.toml"
        policy.write_text('sandbox = "off"\n' + (ROOT / "configs" /
                                                  "site-policy-permissive.toml").read_text())
    run_config = (f"num-server-rounds={rounds} local-steps=1 image-size=32 batch-size=4 "
                  "final-evaluation=false "  # the rounds' messages only
                  f'min-nodes=2 node-wait-timeout=90 tracking-uri="{tracking}" '
                  f'artifact-root="{root / "art"}" experiment="overhead-{runner}"')
    node_ids = [register_site(layout, flwr_home, s) for s in SITES]
    nodes = []
    try:
        for site, site_dir in zip(SITES, data):
            nodes.append(SuperNodeProcess.start(
                layout, site, link.address, site_dir, state_dir=root / runner / site,
                port=free_port(), torch_threads=1,
                runner="warm" if runner == "unsandboxed" else runner, policy=policy))
        wait_online(flwr_home, node_ids, timeout=120, watch=nodes)
        lines: list[str] = []

        def progress(line: str) -> None:  # the run's output, and its round lines on stdout
            lines.append(line)
            if "[ROUND" in line:
                print(f"{runner}: {line[line.index('[ROUND'):].strip()}", flush=True)

        print(f"{runner}: {len(nodes)} SuperNodes online, submitting {rounds} rounds", flush=True)
        started = time.monotonic()
        outcome = submit_run(flwr_home, run_config, timeout=1500, on_line=progress)
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
            (logs / f"{runner}-run.log").write_text("".join(lines))
        if outcome.status != "finished:completed":
            raise RuntimeError(f"{runner}: run ended {outcome.status}:\n" + "".join(lines)[-3000:])
        print(f"{runner}: {rounds} rounds in {time.monotonic() - started:.0f} s", flush=True)
    finally:
        for node in nodes:
            node.stop()
    seconds = reply_seconds(tracking, f"overhead-{runner}")
    by_round: dict[int, list[float]] = {}
    for (_, _, round_), value in seconds.items():
        by_round.setdefault(round_, []).append(value)
    return by_round, later_phases({node.site: node.log_text() for node in nodes}, seconds)


def keep_logs(layout: DeployLayout, logs: Path) -> None:
    """Copy the SuperLink's and the SuperNodes' logs of the deployment into ``logs``."""
    logs.mkdir(parents=True, exist_ok=True)
    for log_file in [*layout.superlink_dir.glob("superlink.*"),
                     *(layout.supernode_dir(site) / "supernode.log" for site in SITES)]:
        if log_file.is_file():
            shutil.copy(log_file, logs / f"{log_file.parent.name}-{log_file.name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--logs", type=Path, default=None,
                        help="keep the daemons' logs and the runs' output in this folder")
    parser.add_argument("--runners", default="flower,warm",
                        help="comma-separated: flower (before), warm (after), unsandboxed "
                             "(after, sandbox = off); JSON needs flower and warm")
    args = parser.parse_args(argv)
    runners = args.runners.split(",")
    measured_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fedmed-overhead-") as tmp:
        root = Path(tmp)
        layout = DeployLayout(root / "deploy")
        ensure_server_certificate(layout.certs, "localhost,127.0.0.1")
        for site in SITES:
            ensure_site_keys(layout.certs, site)
        flwr_home = root / "flwr-cli"
        data = small_hospitals(root / "data")
        link = SuperLinkProcess.start_tls(layout, host="127.0.0.1", port=free_port())
        try:
            write_connection(flwr_home, CONNECTION, link.address, layout.ca_cert)
            measured = {runner: federate(root, link, layout, flwr_home, data, runner,
                                         args.rounds, args.logs)
                        for runner in runners}
        finally:
            link.stop()
            if args.logs is not None:
                keep_logs(layout, args.logs)
    seconds = {runner: by_round for runner, (by_round, _) in measured.items()}
    phases = {runner: medians for runner, (_, medians) in measured.items()}
    later = {runner: [s for r, values in by_round.items() if r > 1 for s in values]
             for runner, by_round in seconds.items()}
    first = {runner: by_round.get(1, []) for runner, by_round in seconds.items()}
    load = f"{load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    if not {"flower", "warm"} <= set(runners):
        print(json.dumps({r: {"median_s": statistics.median(later[r]), "per_message_s": later[r],
                              "first_round_median_s": statistics.median(first[r]),
                              "phases_median_s": phases[r], "load_average": load}
                          for r in runners}, indent=2))
        return 0
    result = {
        "before_s": statistics.median(later["flower"]),
        "after_s": statistics.median(later["warm"]),
        "messages": len(later["warm"]),
        "ratio": statistics.median(later["flower"]) / statistics.median(later["warm"]),
        "first_round_median_s": {"before": statistics.median(first["flower"]),
                                 "after": statistics.median(first["warm"])},
        "per_message_s": {"before": later["flower"], "after": later["warm"]},
        "phases_median_s": {"before": phases["flower"], "after": phases["warm"]},
        "rounds": args.rounds, "sites": len(SITES),
        "flwr": flwr.__version__, "measured_at": measured_at,
        "load_average": load,
        "note": "rounds 2.. of each run; round 1 includes the warm worker's start",
        **({"sandbox": {
            "sandboxed_s": statistics.median(later["warm"]),
            "unsandboxed_s": statistics.median(later["unsandboxed"]),
            "ratio": statistics.median(later["warm"]) / statistics.median(later["unsandboxed"]),
            "phases_median_s": {"sandboxed": phases["warm"],
                                "unsandboxed": phases["unsandboxed"]}}}
           if "unsandboxed" in runners else {}),
        "earlier": earlier_runs(OUT),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("before_s", "after_s", "messages", "ratio",
                                              "first_round_median_s", "phases_median_s",
                                              "flwr", "load_average")},
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
