"""A hospital's node process: Flower's SuperNode and the hospital's site runner, together.

``python -m app.processes.site_node --policy /abs/policy.toml [--poll-interval S]
[--max-workers N] -- <flower-supernode arguments>`` runs, in one process the
hospital starts:

* ``flower-supernode`` with ``--isolation process`` (it serves its Runtime API on
  loopback and starts nothing itself), and
* the :class:`~app.processes.site_runner.SiteRunner` in a thread: it acquires
  each ClientApp task, checks the app bundle against the site policy and runs
  approved ones in warm workers.

Flower's SuperNode waits a fixed 3 s between two polls of the SuperLink when
it has no message, and 0.5 s between two looks for a finished reply (both
hard-coded in ``flwr/supernode/start_client_internal.py``, Flower 1.41), and
backs off up to 10 s while a message's arrays are still being uploaded:
seconds of every message are spent waiting. ``--poll-interval`` caps all these
waits (default 0.25 s, :func:`cap_supernode_waits`), at the price of more idle
requests to the SuperLink (4 per second per site instead of one every 3 s).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from flwr.supercore.inflatable.inflatable_utils import pull_objects

from app.processes.errors import FlowerProcessError
from app.processes.site_runner import SiteRunner

__all__ = ["main", "cap_supernode_waits"]


def cap_supernode_waits(seconds: float) -> None:
    """Make the SuperNode's waits at most ``seconds``: polls and the object-pull backoff.

    The fixed poll waits (3 s idle, 0.5 s for a reply) become ``min(wait,
    seconds)``. The ServerApp pushes a message's header before its arrays, so
    the SuperNode often asks for arrays not uploaded yet; Flower then backs off
    1, 2, 4, 8, 10 s (``flwr.supercore.constant.PULL_INITIAL_BACKOFF``,
    ``PULL_BACKOFF_CAP``) and reads an array that arrived after 7 s only after
    15 s. Here the backoff starts at 0.05 s and is capped at ``seconds``; the
    time limit of a pull (``PULL_MAX_TIME``) is unchanged.
    """
    import flwr.supernode.start_client_internal as supernode_loop  # pylint: disable=C0415

    def sleep(duration: float) -> None:
        time.sleep(min(duration, seconds))

    clock = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    supernode_loop.time = SimpleNamespace(**{**clock, "sleep": sleep})
    supernode_loop.pull_objects = functools.partial(
        pull_objects, max_tries_per_object=None, initial_backoff=0.05, backoff_cap=seconds)


def _runtime_address(supernode_args: list[str]) -> str:
    """``127.0.0.1:<--port>`` of the SuperNode's Runtime API (its ``--port`` is required)."""
    if "--port" not in supernode_args or supernode_args.index("--port") + 1 >= len(
            supernode_args):
        raise FlowerProcessError("site_node: the flower-supernode arguments need --port "
                                 "(the Runtime API port the site runner connects to)")
    return f"127.0.0.1:{supernode_args[supernode_args.index('--port') + 1]}"


def main(argv: list[str] | None = None) -> None:
    """Start the site runner thread, then run the SuperNode in this process until it exits."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, supernode_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description="a hospital's SuperNode + site runner")
    parser.add_argument("--policy", type=Path, default=None,
                        help="site policy TOML (its [apps] rules decide which bundles run); "
                             "none: the permissive development policy")
    parser.add_argument("--poll-interval", type=float, default=0.25,
                        help="cap of the SuperNode's poll waits, seconds (Flower: 3 s)")
    parser.add_argument("--max-workers", type=int, default=2,
                        help="warm workers kept at once (one per app bundle and task)")
    args = parser.parse_args(ours)
    if "--isolation" in supernode_args:
        raise FlowerProcessError("site_node sets --isolation process itself")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logging.getLogger("fedmed").addHandler(handler)
    logging.getLogger("fedmed").setLevel(logging.INFO)
    runner = SiteRunner(_runtime_address(supernode_args), args.policy,
                        max_workers=args.max_workers)
    stop = threading.Event()
    threading.Thread(target=runner.serve, args=(stop,), name="site-runner", daemon=True).start()
    cap_supernode_waits(args.poll_interval)
    from flwr.supercore.logger import update_console_handler  # pylint: disable=C0415
    from flwr.supernode.cli.flower_supernode import flower_supernode  # pylint: disable=C0415
    update_console_handler(timestamps=True, colored=False)  # a site's log needs the time
    sys.argv = ["flower-supernode", *supernode_args, "--isolation", "process"]
    try:
        flower_supernode()
    finally:
        stop.set()
        runner.pool.close()


if __name__ == "__main__":
    main()
