"""The warm site worker: one long-lived process that runs an approved app's ClientApp.

Flower starts one ``flwr-clientapp`` process per message (flwrlabs/flower#3670):
every message pays the imports (torch, MONAI: 9-20 s on two cores), the decoded
data cache and the model set-up again. NVIDIA FLARE keeps long-running trainers
instead (``launch_once``). Here the hospital's site runner
(:mod:`app.site_runtime.site_runner`) keeps one worker per (approved app bundle,
imaging task); the worker loads the bundle's ClientApp once and answers every
message of that app from the same process, so imports, the per-process task
cache and the GPU context stay warm.

The worker never talks to Flower. The runner has already pulled the message,
checked the app against the site policy and installed the bundle; it sends a
job (a dict with :data:`JOB_KEYS`) over a socket and gets back
``("done", reply, context)`` or ``("failed", exception type, load error)``: the
exception's *type* only, its text may hold a path (see :mod:`app.site_errors`).
Only builtins and ``flwr`` objects cross the socket, so unpickling never
imports the hospital's copy of the product.

The file runs as a script, never as ``app.site_runtime.site_worker``: it imports
only the standard library and ``flwr`` before the bundle's ClientApp, so the
bundle's own packages (``app``, ``clients``, ...) are imported from the bundle
and not from the hospital's installed copy.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from multiprocessing.connection import Connection
from typing import Any

if __name__ == "__main__" and sys.path and os.path.dirname(os.path.abspath(__file__)) == (
        os.path.abspath(sys.path[0])):
    sys.path.pop(0)  # this folder's modules must not shadow the bundle's

__all__ = ["JOB_KEYS", "serve", "main"]

log = logging.getLogger("fedmed.site_worker")


#: A job: the ids Flower's message machinery needs, the app bundle, the data.
JOB_KEYS = ("task_id", "run_id", "node_id", "fab_id", "fab_version", "fab_hash", "message",
            "context")


def _run(job: dict[str, Any], apps: dict[str, Any]) -> tuple:
    """Run one job: ``("done", reply, context)`` or ``("failed", error type, load error)``."""
    from flwr.clientapp.client_app import LoadClientAppError
    from flwr.clientapp.utils import get_load_client_app_fn
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id = job['task_id']
    TaskIdentity.run_id = job['run_id']
    TaskIdentity.node_id = job['node_id']
    try:
        if job['fab_hash'] not in apps:
            load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
            apps[job['fab_hash']] = load(job['fab_id'], job['fab_version'], job['fab_hash'])
        reply = apps[job['fab_hash']](message=job['message'], context=job['context'])
    except Exception as exc:  # pylint: disable=broad-exception-caught
        log.exception("ClientApp of app %s raised", job['fab_hash'][:12])
        return ("failed", type(exc).__name__, isinstance(exc, LoadClientAppError))
    return ("done", reply, job['context'])


def serve(connection: Connection) -> None:
    """Answer jobs until the runner closes the connection."""
    apps: dict[str, Any] = {}
    while True:
        try:
            job = connection.recv()
        except (EOFError, OSError):
            return
        connection.send(_run(job, apps))


def main(argv: list[str] | None = None) -> None:
    """``python site_worker.py --fd N --parent-pid P``: serve jobs on the inherited socket."""
    parser = argparse.ArgumentParser(description="fedmed warm site worker")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket descriptor")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit when this process (the site runner) is gone")
    args = parser.parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s site-worker %(message)s"))
    log.addHandler(handler)
    if args.parent_pid is not None:
        from flwr.supercore.app_utils import start_parent_process_monitor
        start_parent_process_monitor(args.parent_pid)
    serve(Connection(args.fd))


if __name__ == "__main__":
    main()
