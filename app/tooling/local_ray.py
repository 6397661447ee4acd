"""The local Ray of ``make simulate``: started here, retried when its start times out.

Flower's simulation engine (``flwr-simulation``, started by the simulation
SuperLink) calls ``ray.init()`` itself. Ray gives a new node's raylet a fixed
30 s to register with its GCS (``raylet_start_wait_time_s = 30`` in
``ray/_private/node.py``, ``Node.__init__``; no setting changes it). On a
loaded machine it sometimes takes longer, and the engine crashes before round 1
("The current node timed out during startup"), after the ServerApp has already
created its MLflow run — seen in CI and in ``bench/scale.py`` on 2 busy cores.

So ``simulate`` starts Ray first, in its own process, before the SuperLink:
a start that times out is shut down and tried again while nothing of the
federation exists yet. The engine then attaches to this Ray through
``RAY_ADDRESS`` in the SuperLink's environment, as it does to a cluster given
with ``--ray-address`` (:mod:`app.tooling.ray_cluster`). Ray's workers (the
virtual sites) inherit the environment of the process that started Ray, so
the Flower environment is set here before ``ray.init``. Ray stops when the
``with`` block ends.

Why it times out: the raylet registers with the GCS only once its dashboard
agent (a Python process that tries to import every dashboard module) has
written its port; that takes 3.5 s of the 4 s start on an idle 2-core machine,
and more than 30 s when two real-process tests start their daemons beside it
(official CI: four timed-out starts in a row). Two limits hit: the raylet
aborts when the agent's port is late (``agent_register_timeout_ms``, raised in
:func:`app.tooling.environment.flower_env`), and Ray's own loop gives up on
the registration after 30 s. For the second, the node lookup that loop calls
(``ray._private.services.get_node``) is made patient during the start
(:func:`patient_node_lookup`): it polls up to ``startup_wait`` seconds before
it gives Ray its error. Measured under 16 busy processes on 2 cores (load
14): the start failed without these two, and took 83 s with them.
The retries remain for a start that fails all the same.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from app.tooling.errors import FlowerProcessError

__all__ = ["STARTUP_TIMEOUT", "local_ray", "patient_node_lookup", "start_with_retries"]

#: What Ray says when a node's raylet did not register in time.
STARTUP_TIMEOUT = "timed out during startup"


def start_with_retries(init: Callable[[], str], shutdown: Callable[[], None], attempts: int,
                       echo: Callable[[str], None] = print, pause: float = 10.0,
                       sleep: Callable[[float], None] = time.sleep) -> str:
    """``init()`` (returns the address), retried after ``shutdown()`` on Ray's start-up timeout.

    Between attempts it waits ``pause`` seconds, then twice that, and so on:
    a load peak (other processes starting at the same moment) passes.
    Any other error, or the last attempt's timeout, raises
    :class:`FlowerProcessError` naming the number of attempts.
    """
    if attempts < 1:
        raise FlowerProcessError(f"local Ray: attempts must be >= 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        try:
            return init()
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
            shutdown()
            if STARTUP_TIMEOUT not in str(exc) or attempt == attempts:
                raise FlowerProcessError(
                    f"local Ray did not start (attempt {attempt} of {attempts}): {exc}") from exc
            wait = pause * 2 ** (attempt - 1)
            echo(f"local Ray: its node {STARTUP_TIMEOUT} (attempt {attempt} of {attempts}, "
                 f"a loaded machine?); starting it again in {wait:.0f} s")
            sleep(wait)
    raise AssertionError("unreachable")


@contextmanager
def patient_node_lookup(module: Any, wait: float, interval: float = 0.5,
                        clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], None] = time.sleep) -> Iterator[None]:
    """Within the block, ``module.get_node`` retries its ``RuntimeError`` for ``wait`` seconds.

    ``module`` is ``ray._private.services``; Ray's own loop around it gives up
    after 30 s (see the module docstring). The original is restored on exit.
    """
    original = module.get_node

    def get_node(*args: Any, **kwargs: Any) -> Any:
        deadline = clock() + wait
        while True:
            try:
                return original(*args, **kwargs)
            except RuntimeError:  # "not available yet": the raylet has not registered
                if clock() >= deadline:
                    raise
                sleep(interval)

    module.get_node = get_node
    try:
        yield
    finally:
        module.get_node = original


@contextmanager
def local_ray(env: dict[str, str], attempts: int = 4,
              startup_wait: float = 240.0) -> Iterator[str]:
    """A Ray head on this machine for the duration of the block; yields its address.

    ``env`` is set in this process first: Ray's workers inherit it. Each start
    waits up to ``startup_wait`` seconds for the raylet to register.
    """
    import ray  # noqa: PLC0415 - only the simulation needs Ray
    import ray._private.services  # noqa: PLC0415

    os.environ.update(env)

    def init() -> str:
        with patient_node_lookup(ray._private.services, startup_wait):
            ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        return str(ray.get_runtime_context().gcs_address)

    address = start_with_retries(init, ray.shutdown, attempts)
    try:
        yield address
    finally:
        ray.shutdown()
