"""Which of the repository's files one default round goes through, and the hops between them.

Runs :meth:`FederatedStrategy.start` of the default strategy (``build_strategy``
of pyproject.toml's run config: FedAvg behind norm-bound with ``kappa``, fixed
tau, uniform selection, codec ``none``) on the in-process engine
(:class:`app.engine.InProcessGrid`) against three small synthetic pe-seg
hospitals answered by the product's real ClientApp. Round 1 runs untraced (it
imports torch and MONAI and loads each site's studies); round 2, one train and
one evaluate exchange, runs under :func:`sys.setprofile`. Every Python call whose
code lies in this repository (not in ``.venv``, not this script) is attributed
to its file; a *hop* is a call from one repository file into another (the caller
is the nearest repository frame up the stack). It reports, for the whole round,
for the server (the ServerApp's strategy and the engine) and for the sites (what
runs under the ClientApp):

* ``files``: the distinct repository files entered;
* ``hops``: the distinct (caller file, callee file) pairs;
* ``calls``: the calls that crossed a file boundary, counted each time.

Run: ``.venv/bin/python bench/round_trace.py [--json bench/results/round_trace.json]``
(about three minutes on two cores). ``bench/results/round_trace_94d096a.json`` is
the same trace of the tree at commit 94d096a, before issue 27's round loop (this
script and ``app/engine`` copied into it, run with ``PYTHONPATH`` = that tree).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from flwr.app import ArrayRecord

from app.config.run_config import RunConfig
from app.engine import InProcessGrid, full_run_config, partition_sites, server_identity
from app.server_app import build_strategy
from clients.pe_seg.manifest import read_manifest, write_manifest
from clients.pe_seg.synthetic import generate_federation
from clients.registry import task_class

#: The tree traced: the one this script lies in (the project is installed editable;
#: ``PYTHONPATH=<tree>`` traces another checkout, the script copied into it).
ROOT = Path(__file__).resolve().parents[1]

SITES = 3


class FileTrace:
    """A :func:`sys.setprofile` hook that counts calls between repository files, per side.

    A call belongs to the *site* when the ClientApp (``app/client_app.py``) is on the
    stack, else to the *server*.
    """

    def __init__(self, root: Path, skip: Path) -> None:
        self.root, self.skip = str(root), str(skip)
        self.site_app = str(root / "app" / "client_app.py")
        self.files: dict[str, Counter[str]] = {"server": Counter(), "site": Counter()}
        self.hops: dict[str, Counter[tuple[str, str]]] = {"server": Counter(),
                                                           "site": Counter()}

    def _side(self, frame) -> str:
        while frame is not None:
            if frame.f_code.co_filename == self.site_app:
                return "site"
            frame = frame.f_back
        return "server"

    def _repo_file(self, filename: str) -> str | None:
        if (not filename.startswith(self.root) or "/.venv/" in filename
                or filename == self.skip):
            return None
        return str(Path(filename).relative_to(self.root))

    def __call__(self, frame, event, _arg) -> None:
        if event != "call":
            return
        callee = self._repo_file(frame.f_code.co_filename)
        if callee is None:
            return
        side = self._side(frame)
        self.files[side][callee] += 1
        caller_frame = frame.f_back
        while caller_frame is not None and self._repo_file(caller_frame.f_code.co_filename) is None:
            caller_frame = caller_frame.f_back
        caller = None if caller_frame is None else self._repo_file(caller_frame.f_code.co_filename)
        if caller is not None and caller != callee:
            self.hops[side][(caller, callee)] += 1

    def summary(self, *sides: str) -> dict:
        """Files, distinct hops and crossing calls of ``sides`` (``server``, ``site``)."""
        files = sorted(set().union(*(self.files[side] for side in sides)))
        hops: Counter[tuple[str, str]] = sum((self.hops[side] for side in sides), Counter())
        return {"files": len(files), "hops": len(hops), "calls": sum(hops.values()),
                "file_list": files, "hop_list": [f"{a} -> {b}" for a, b in sorted(hops)]}


def small_hospitals(root: Path) -> None:
    """Three synthetic pe-seg hospitals (32x32) of four studies: two train, one val, one test."""
    for site in generate_federation(root, num_sites=SITES, seed=0, image_size=32):
        entries = read_manifest(site)
        write_manifest(site, [e for e in entries if e.split == "train"][:2]
                       + [e for e in entries if e.split == "val"][:1]
                       + [e for e in entries if e.split == "test"][:1])


def trace_round(data_root: Path) -> FileTrace:
    """Round 1 untraced, round 2 traced, of the default strategy on the in-process engine."""
    config = full_run_config({"data-root": str(data_root), "min-nodes": SITES,
                              "local-steps": 2, "batch-size": 2, "image-size": 32})
    settings = RunConfig.from_mapping(config)
    strategy = build_strategy(settings, federation="trace")
    grid = InProcessGrid(partition_sites(SITES), config, run_id=1)
    model = task_class(settings.task).model_for_run(settings.task_settings(), private=False)
    arrays = ArrayRecord(model.state_dict())
    trace = FileTrace(ROOT, Path(__file__).resolve())
    with server_identity(1):
        arrays = strategy.start(grid, arrays, num_rounds=1).arrays
        sys.setprofile(trace)
        try:
            strategy.start(grid, arrays, num_rounds=2, first_round=2)
        finally:
            sys.setprofile(None)
    report = strategy.reports[2]
    assert len(report.train) == SITES and len(report.evaluate) == SITES, (
        report.train_dropped, report.evaluate_dropped)
    return trace


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        small_hospitals(Path(folder))
        trace = trace_round(Path(folder))
    result = {"round": trace.summary("server", "site"), "server": trace.summary("server"),
              "site": trace.summary("site")}
    for name, part in result.items():
        print(f"{name}: {part['files']} files, {part['hops']} hops "
              f"({part['calls']} calls across files)")
    for name in result["round"]["file_list"]:
        print(f"  {name}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
