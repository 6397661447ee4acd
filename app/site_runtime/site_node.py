"""A hospital's node process: Flower's SuperNode and the hospital's site runner, together.

``python -m app.site_runtime.site_node --policy /abs/policy.toml [--poll-interval S]
[--max-workers N] [--transfer-lanes N] [--console-port PORT] [--worker-uid UID]
[--worker-memory-gb G] [--worker-processes N] [--worker-timeout-hours H] --
<flower-supernode arguments>`` runs, in one process the hospital starts:

* ``flower-supernode`` with ``--isolation process`` (it serves its Runtime API on
  loopback and starts nothing itself), and
* the :class:`~app.site_runtime.site_runner.SiteRunner` in a thread: it acquires
  each ClientApp task, checks the app bundle against the site policy, checks every
  message against the policy's data rules and charges the privacy ledger itself, and runs
  approved apps in warm workers inside the sandbox (:mod:`app.site_runtime.sandbox`:
  ``--worker-uid`` when the node runs as root, ``--worker-memory-gb``,
  ``--worker-processes``, ``--worker-timeout-hours``), filtering every reply, and
* with a PACS cohort as its dataset (node config ``cohort``), the first sync of it, before
  the runner answers anything (:mod:`app.site_runtime.pacs_sync`; a ``[pacs]`` rule that
  refuses it stops the node with one line), and
* with ``--console-port PORT`` (``make supernode CONSOLE=1``), the hospital's console
  (:mod:`app.site_runtime.console`) on ``127.0.0.1:PORT`` in another thread.

``--policy`` is required and must be the file the node config's ``policy-path``
names (:mod:`app.site_runtime.one_policy`): the node refuses to start otherwise.

Flower's SuperNode waits a fixed 3 s between two polls of the SuperLink when
it has no message, and 0.5 s between two looks for a finished reply (both
hard-coded in ``flwr/supernode/start_client_internal.py``, Flower 1.42), and
backs off up to 10 s while a message's arrays are still being uploaded:
seconds of every message are spent waiting. ``--poll-interval`` caps all these
waits (default 0.25 s, :func:`cap_supernode_waits`), at the price of more idle
requests to the SuperLink (4 per second per site instead of one every 3 s).
Between the SuperNode and the runner nothing is polled on a message's path:
the SuperNode wakes the runner when it created a task and when it stored the
message's objects, and the runner wakes the SuperNode when it stored the reply
(:class:`~app.site_runtime.node_signals.NodeSignals`). ``--transfer-lanes`` (default
4) is how many objects of a message go up or down at once (Flower: 2 on a
two-core machine; :func:`widen_transfers`).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from flwr.supercore.inflatable.inflatable_utils import pull_objects
from flwr.supercore.run import RunNotRunningException

from app.config.site_config import SiteConfig
from app.tooling.errors import FlowerProcessError
from app.site_runtime.node_signals import NodeSignals
from app.site_runtime.one_policy import node_config_of, policy_mismatch
from app.site_runtime.pacs_sync import cohort_file, start_sync
from app.site_runtime.sandbox import DEFAULT_WORKER_UID, SandboxLimits
from app.site_runtime.site_runner import SiteRunner, expire_state
from clients.site.policy import load_policy

__all__ = ["main", "cap_supernode_waits", "widen_transfers", "pull_objects_of_running_run",
           "RunStoppedDuringPull"]


def cap_supernode_waits(seconds: float, signals: NodeSignals | None = None) -> None:
    """Make the SuperNode's waits at most ``seconds``, and let it drop messages of stopped runs.

    The fixed poll waits (3 s idle, 0.5 s for a reply) become ``min(wait,
    seconds)``. The ServerApp pushes a message's header before its arrays, so
    the SuperNode often asks for arrays not uploaded yet; Flower then backs off
    1, 2, 4, 8, 10 s (``flwr.supercore.constant.PULL_INITIAL_BACKOFF``,
    ``PULL_BACKOFF_CAP``) and reads an array that arrived after 7 s only after
    15 s. Here the backoff starts at 0.05 s and is capped at ``seconds``; the
    time limit of a pull (``PULL_MAX_TIME``) is unchanged.

    With ``signals`` (:class:`~app.site_runtime.node_signals.NodeSignals`, shared
    with the site runner of this process) the SuperNode also tells the runner
    when it created a message's task (its object pull starts right after
    ``state.create_task`` and ``state.store_message`` in Flower 1.42's
    ``_pull_and_store_message``) and when every object of the message is
    stored (just before its ``confirm_message_received``), and its waits end as
    soon as the runner stored a reply (:meth:`NodeSignals.nap`).

    The object pull is also :func:`pull_objects_of_running_run`: see there.
    """
    import flwr.supernode.start_client_internal as supernode_loop  # pylint: disable=C0415

    def sleep(duration: float) -> None:
        if signals is None:
            time.sleep(min(duration, seconds))
        else:
            signals.nap(min(duration, seconds))

    clock = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    supernode_loop.time = SimpleNamespace(**{**clock, "sleep": sleep})
    supernode_loop.pull_objects = functools.partial(
        pull_objects_of_running_run, max_tries_per_object=None, initial_backoff=0.05,
        backoff_cap=seconds, on_start=signals.task_created.set if signals else None)
    if signals is not None:
        flower_pull_and_store = supernode_loop._pull_and_store_message  # pylint: disable=W0212
        supernode_loop._pull_and_store_message = functools.partial(  # pylint: disable=W0212
            _pull_and_store_telling, flower_pull_and_store, signals)


def _pull_and_store_telling(flower_pull_and_store: Callable[..., int | None],
                            signals: NodeSignals, **kwargs: Any) -> int | None:
    """Flower's ``_pull_and_store_message`` (1.42, keyword arguments only, as its loop calls
    it), whose ``confirm_message_received`` first tells ``signals`` that the message's
    objects are stored."""
    confirm = kwargs["confirm_message_received"]

    def confirm_and_tell(run_id: int, message_id: str) -> None:
        signals.message_received(message_id)
        confirm(run_id, message_id)

    return flower_pull_and_store(**{**kwargs, "confirm_message_received": confirm_and_tell})


def widen_transfers(lanes: int) -> None:
    """Let every object transfer of this process use ``lanes`` concurrent requests.

    Flower 1.42 pulls and pushes a message's objects with
    ``min(FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PULLS or _PUSHES (2), CPU cores)``
    threads (``flwr.supercore.inflatable.inflatable_utils.get_num_workers``):
    two on a two-core machine, although each thread mostly waits for the
    SuperLink's answer. A reply's ~7 objects then go up in four rounds of
    requests. This replaces ``get_num_workers`` in the node process (the
    SuperNode's transfers with the SuperLink and the runner's with the
    SuperNode).
    """
    if lanes < 1:
        raise FlowerProcessError(f"--transfer-lanes must be >= 1, got {lanes}")
    from flwr.supercore.inflatable import inflatable_utils  # pylint: disable=C0415

    def get_num_workers(max_concurrent: int) -> int:  # pylint: disable=unused-argument
        return lanes

    inflatable_utils.get_num_workers = get_num_workers


class RunStoppedDuringPull(FlowerProcessError):
    """The SuperLink refused a message's arrays because the message's run is over."""


def pull_objects_of_running_run(object_ids: list[str], pull_object_fn: Callable[[str], bytes],
                                on_start: Callable[[], Any] | None = None,
                                **options: Any) -> dict[str, bytes]:
    """Flower's ``pull_objects``, where a run that stopped meanwhile is an ordinary error.

    When the SuperLink answers that the run is over (HTTP 403, e.g. a SuperLink
    restarted after its ServerApp died), Flower raises ``RunNotRunningException``,
    a ``BaseException``, which ``_pull_and_store_message`` (Flower 1.42) logs and
    ignores: the task it created for the message stays open with arrays that never
    come, and the site runner that acquired it waits for them forever, so the site
    answers no later message. As :class:`RunStoppedDuringPull`, Flower's own
    error branch runs instead: it deletes the message and finishes its task.

    ``on_start``, if given, is called first (the message's task exists by then:
    see :func:`cap_supernode_waits`).
    """
    if on_start is not None:
        on_start()
    try:
        return pull_objects(object_ids, pull_object_fn, **options)
    except RunNotRunningException:
        raise RunStoppedDuringPull("the run of this message stopped while its arrays were "
                                   "being received; the message is dropped") from None


def _runtime_address(supernode_args: list[str]) -> str:
    """``127.0.0.1:<--port>`` of the SuperNode's Runtime API (its ``--port`` is required)."""
    if "--port" not in supernode_args or supernode_args.index("--port") + 1 >= len(
            supernode_args):
        raise FlowerProcessError("site_node: the flower-supernode arguments need --port "
                                 "(the Runtime API port the site runner connects to)")
    return f"127.0.0.1:{supernode_args[supernode_args.index('--port') + 1]}"


def _memory_limit(gib: float | None) -> int:
    """Bytes of one worker's address space: ``gib`` GiB, default 3/4 of physical memory."""
    if gib is None:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4)
    if not gib > 0:
        raise FlowerProcessError(f"--worker-memory-gb must be > 0, got {gib}")
    return int(gib * 2**30)


def _start_console(node: SiteConfig, policy: Path, port: int, stop: threading.Event) -> None:
    """The hospital's console on loopback in this process (fastapi is imported only then)."""
    from app.site_runtime.console import start_console_thread  # pylint: disable=C0415
    from app.site_runtime.console_access import ConsoleSettings  # pylint: disable=C0415
    from clients.site.privacy_ledger import dataset_id  # pylint: disable=C0415
    node.state_dir.mkdir(parents=True, exist_ok=True)
    named = ((dataset_id(node.data_path), node.dataset_name),)
    start_console_thread(ConsoleSettings(node.name, node.state_dir, policy, port=port,
                                         datasets=named), stop)


def main(argv: list[str] | None = None) -> None:
    """Start the site runner thread, then run the SuperNode in this process until it exits."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, supernode_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description="a hospital's SuperNode + site runner")
    parser.add_argument("--policy", type=Path, default=None,
                        help="the site policy TOML (required): its [apps] rules decide which "
                             "bundles run, its data rules what they compute; the node config's "
                             "policy-path must name the same file")
    parser.add_argument("--poll-interval", type=float, default=0.25,
                        help="cap of the SuperNode's poll waits, seconds (Flower: 3 s)")
    parser.add_argument("--max-workers", type=int, default=2,
                        help="warm workers kept at once (one per app bundle and task)")
    parser.add_argument("--transfer-lanes", type=int, default=4,
                        help="concurrent requests per message transfer (Flower: 2 or the "
                             "CPU cores, the fewer)")
    parser.add_argument("--console-port", type=int, default=None,
                        help="also serve the hospital's console on 127.0.0.1:PORT")
    parser.add_argument("--worker-uid", type=int, default=DEFAULT_WORKER_UID,
                        help="the uid (and gid) of the sandboxed workers when the node runs "
                             f"as root (default {DEFAULT_WORKER_UID}; give a dedicated one)")
    parser.add_argument("--worker-memory-gb", type=float, default=None,
                        help="address space of one worker, GiB (default: 3/4 of the "
                             "machine's memory; not applied on a host with NVIDIA devices)")
    parser.add_argument("--worker-processes", type=int, default=512,
                        help="processes and threads of the worker uid")
    parser.add_argument("--worker-timeout-hours", type=float, default=24.0,
                        help="the longest one message may run in a worker before it is killed")
    args = parser.parse_args(ours)
    if args.policy is None:
        print("site_node: --policy /abs/policy.toml is required (the one site policy file, "
              "also the node config's policy-path)", file=sys.stderr)
        raise SystemExit(2)
    if "--isolation" in supernode_args:
        raise FlowerProcessError("site_node sets --isolation process itself")
    load_policy(args.policy)  # a bad file fails here, not at the first message
    node_config = node_config_of(supernode_args)
    mismatch = policy_mismatch(args.policy, node_config)
    if mismatch is not None:
        raise FlowerProcessError(f"site_node: {mismatch}")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logging.getLogger("fedmed").addHandler(handler)
    logging.getLogger("fedmed").setLevel(logging.INFO)
    expire_state(node_config)  # the state-retention rule, at start (the runner: before each run)
    widen_transfers(args.transfer_lanes)
    signals = NodeSignals()
    node = SiteConfig.from_node_config(node_config, data_root="")
    limits = SandboxLimits(max_processes=args.worker_processes,
                           max_memory=_memory_limit(args.worker_memory_gb),
                           worker_uid=args.worker_uid)
    runner = SiteRunner(_runtime_address(supernode_args), args.policy, poll_interval=1.0,
                        max_workers=args.max_workers, signals=signals, node=node,
                        limits=limits, job_timeout=args.worker_timeout_hours * 3600)
    if cohort_file(node_config) is not None:  # a PACS cohort: its first sync, before any message
        try:
            start_sync(node_config, node.state_dir, load_policy(args.policy), runner.node_audit,
                       limits)
        except FlowerProcessError:
            runner.close()
            raise
    stop = threading.Event()
    threading.Thread(target=runner.serve, args=(stop,), name="site-runner", daemon=True).start()
    if args.console_port:
        _start_console(node, args.policy, args.console_port, stop)
    cap_supernode_waits(args.poll_interval, signals)
    from flwr.supercore.logger import update_console_handler  # pylint: disable=C0415
    from flwr.supernode.cli.flower_supernode import flower_supernode  # pylint: disable=C0415
    update_console_handler(timestamps=True, colored=False)  # a site's log needs the time
    sys.argv = ["flower-supernode", *supernode_args, "--isolation", "process"]
    try:
        flower_supernode()
    finally:
        stop.set()
        runner.close()


if __name__ == "__main__":
    main()
