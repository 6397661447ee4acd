"""Run a federation locally: in Flower's simulation engine (Ray) or in the in-process engine.

``python -m app.tooling.simulate`` (what ``make simulate`` calls) first checks
the run config as the ServerApp would (:func:`~app.tooling.run_config_string.checked_run_config`):
a bad key or value ends it at once, exit code 2, with one line naming it.

``--engine local`` (``make simulate ENGINE=local``) runs the same run config in
this process: the real ServerApp against one virtual site per synthetic
hospital (:mod:`app.engine`), no SuperLink, no Ray; the same progress lines and
summary. Small runs start in seconds.

``--data-source pacs`` (``make simulate DATA=pacs``) first loads each synthetic
hospital into an Orthanc of its own, syncs its cohort over DICOMweb into a folder under
``--pacs-dir`` and federates over the synced site folders; every Orthanc is stopped
at the end (:mod:`app.tooling.pacs_simulation`).

``--engine ray`` (the default) starts a
local Ray (tried again when Ray's start times out on a loaded machine,
:mod:`app.tooling.local_ray`), then a
``flower-superlink`` in simulation mode on a free loopback port, submits this
app with ``flwr run`` (one virtual SuperNode per synthetic hospital), streams
the ServerApp's progress, then reads the run's final status with
``flwr ls --format json`` (``flwr run`` itself exits 0 even when the run
failed), prints a summary from MLflow, and stops the SuperLink and Ray.
Exit code 0 only when the run finished as ``finished:completed``.

``--ray-address host:port`` (``make simulate RAY_ADDRESS=host:port``; default:
the ``RAY_ADDRESS`` environment variable) runs the virtual SuperNodes on that
existing Ray cluster instead of a Ray started for the run: the address is
checked first (exit code 2 when nothing answers), then set as ``RAY_ADDRESS``
in the SuperLink's environment, from which Flower's simulation engine attaches
(see :mod:`app.tooling.ray_cluster`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from app.config.product_paths import work_root
from app.tooling.environment import flower_env
from app.tooling.errors import FlowerProcessError
from app.tooling.flwr_cli import write_connection
from app.tooling.local_ray import local_ray
from app.tooling.ray_cluster import require_reachable
from app.tooling.run_config_string import build_run_config, checked_run_config
from app.tooling.run_submission import submit_run
from app.tooling.superlink import SuperLinkProcess
from strategies.wire.errors import ConfigError, FedMedError
from clients.datagen.federation import hospital_name

__all__ = ["CONNECTION", "main"]

CONNECTION = "fedmed-sim"


def _echo(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", type=Path, required=True,
                        help="folder with hospital-00, hospital-01, ...")
    parser.add_argument("--sites", type=int, default=3, help="virtual SuperNodes")
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("--artifact-root", type=Path, required=True)
    parser.add_argument("--flwr-home", type=Path, default=work_root() / ".flwr")
    parser.add_argument("--log-dir", type=Path, default=work_root() / "runs" / "simulate")
    parser.add_argument("--engine", choices=("ray", "local"), default="ray",
                        help="ray: Flower's simulation engine (SuperLink + Ray); local: the "
                             "in-process engine (app.engine), for small fast runs")
    parser.add_argument("--cpus-per-site", type=int, default=1,
                        help="CPUs (torch threads) per site; the local engine runs the sites "
                             "one after the other, each with these threads")
    parser.add_argument("--ray-address", default=None,
                        help="(ray) host:port of an existing Ray cluster to run the sites on "
                             "(default: $RAY_ADDRESS; unset: a Ray started for this run)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="(ray) seconds before the run is abandoned")
    parser.add_argument("--preset", type=Path, default=None,
                        help="TOML file of run-config values (e.g. configs/pe-seg-quick.toml)")
    parser.add_argument("--data-source", choices=("folders", "pacs"), default="folders",
                        help="pacs (make simulate DATA=pacs): load each hospital into an Orthanc "
                             "of its own, sync its cohort over DICOMweb, federate from the "
                             "synced site folders (app.tooling.pacs_simulation)")
    parser.add_argument("--pacs-dir", type=Path, default=work_root() / "runs" / "simulate-pacs",
                        help="(pacs) the work folder of the Orthancs and the synced sites")
    parser.add_argument("-c", "--run-config", action="append", default=[],
                        metavar="KEY=VALUE", help="run-config override (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.engine == "local" and args.ray_address:
        print("error: --ray-address runs the sites on Ray; it does not go with --engine local",
              file=sys.stderr)
        return 2
    run_config = build_run_config(args.run_config, args.data_root, args.tracking_uri,
                                  args.artifact_root, args.preset)
    try:
        values = checked_run_config(run_config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = [hospital_name(i) for i in range(args.sites)
               if not (args.data_root / hospital_name(i)).is_dir()]
    if missing:
        print(f"missing synthetic hospitals under {args.data_root}: {missing}; "
              "run `make data` (or `make simulate`, which generates them)", file=sys.stderr)
        return 2
    if args.data_source == "pacs":
        return _from_pacs(args)
    return _run(args, run_config, values)


def _from_pacs(args: argparse.Namespace) -> int:
    """The hospitals into their Orthancs, synced; the federation over the synced folders."""
    from app.tooling.pacs_simulation import pacs_sites  # noqa: PLC0415 - pydicom, dicomweb-client

    try:
        with pacs_sites(args.data_root, args.sites, args.pacs_dir, _echo) as synced:
            args.data_root = synced
            run_config = build_run_config(args.run_config, synced, args.tracking_uri,
                                          args.artifact_root, args.preset)
            return _run(args, run_config, checked_run_config(run_config))
    except FlowerProcessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, run_config: str, values: dict[str, Any]) -> int:
    """The federation over ``args.data_root`` (in this process or on Ray), then the summary."""
    if args.engine == "local":
        return _federate_in_process(args, values)
    ray_address = args.ray_address or os.environ.get("RAY_ADDRESS") or None
    if ray_address:
        try:
            os.environ["RAY_ADDRESS"] = ray_address = require_reachable(ray_address)
        except FlowerProcessError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    flwr_home = args.flwr_home.resolve()
    started = time.monotonic()
    try:
        if ray_address:
            run_id = _federate(args, flwr_home, run_config, ray_address)
        else:
            with local_ray(flower_env(flwr_home, _site_env(args))) as address:
                os.environ["RAY_ADDRESS"] = address  # the engine attaches to this Ray
                run_id = _federate(args, flwr_home, run_config, None)
    except FlowerProcessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if run_id is None:
        return 1
    from app.tooling.federation_summary import print_summary  # noqa: PLC0415 - MLflow

    print_summary(args.tracking_uri, run_id, time.monotonic() - started, args.artifact_root)
    return 0


def _federate_in_process(args: argparse.Namespace, values: dict[str, Any]) -> int:
    """The federation in this process (:func:`app.engine.run_federation`), then the summary."""
    from app.engine import partition_sites, run_federation  # noqa: PLC0415 - torch, MLflow
    from app.engine.federation import new_run_id  # noqa: PLC0415

    os.environ.update(_site_env(args))  # torch threads as a Ray site gets them (one CPU)
    run_id = new_run_id()
    print(f"In-process engine: {args.sites} sites on {args.data_root.resolve()}, run "
          f"{run_id}", flush=True)
    started = time.monotonic()
    try:
        run_federation(values, partition_sites(args.sites), run_id=run_id)
    except FedMedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"\nrun {run_id} status: finished:completed")
    from app.tooling.federation_summary import print_summary  # noqa: PLC0415 - MLflow

    print_summary(args.tracking_uri, run_id, time.monotonic() - started, args.artifact_root)
    return 0


def _site_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment of the virtual sites: torch threads per site."""
    return {"FEDMED_TORCH_THREADS": str(args.cpus_per_site)}


def _federate(args: argparse.Namespace, flwr_home: Path, run_config: str,
              ray_address: str | None) -> int | None:
    """SuperLink, ``flwr run``, final status; the Flower run id if it completed, else None."""
    link = SuperLinkProcess.start_simulation(flwr_home, args.log_dir.resolve())
    try:
        write_connection(flwr_home, CONNECTION, link.address)
        where = f"Ray cluster {ray_address}" if ray_address else "a local Ray"
        print(f"SuperLink {link.address} (logs: {link.flower_log}; sites on {where}); "
              "submitting the run...", flush=True)
        outcome = submit_run(
            flwr_home, run_config, args.timeout, connection=CONNECTION, on_line=_echo,
            env_extra=_site_env(args), status_timeout=30.0,
            federation_config=(f"num-supernodes={args.sites} "
                               f"client-resources-num-cpus={args.cpus_per_site}"))
        if outcome.run_id is None:
            print("flwr run did not start a run (see the output above)", file=sys.stderr)
            return None
        print(f"\nrun {outcome.run_id} status: {outcome.status}")
        if outcome.status != "finished:completed":
            print(f"the run did not complete; SuperLink log: {link.flower_log}",
                  file=sys.stderr)
            return None
        return outcome.run_id
    finally:
        link.stop()


if __name__ == "__main__":
    sys.exit(main())
