"""Bounded wait for sites to connect.

Flower's ``sample_nodes`` loops forever until ``min_available_nodes`` SuperNodes
are connected; a federation whose hospital never comes up would hang silently.
Here the wait has a deadline and fails with a clear error.
"""

from __future__ import annotations

import time
from logging import INFO

from flwr.serverapp import Grid
from flwr.supercore import log
from strategies.errors import FederationError

__all__ = ["NodeWaitTimeout", "wait_for_nodes"]


class NodeWaitTimeout(FederationError, TimeoutError):
    """Fewer sites than required connected before the deadline."""


def wait_for_nodes(
    grid: Grid, min_nodes: int, timeout: float, poll_interval: float = 1.0
) -> list[int]:
    """Return the connected node ids once at least ``min_nodes`` are connected.

    Raises
    ------
    NodeWaitTimeout
        If fewer than ``min_nodes`` are connected after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last_logged = -1
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= min_nodes:
            return nodes
        if time.monotonic() >= deadline:
            raise NodeWaitTimeout(
                f"only {len(nodes)} of the required {min_nodes} sites connected "
                f"within {timeout:.0f} s; check that the SuperNodes are running and "
                "can reach the SuperLink, or lower min-nodes"
            )
        if len(nodes) != last_logged:
            log(INFO, "Waiting for sites: %d of %d connected", len(nodes), min_nodes)
            last_logged = len(nodes)
        time.sleep(poll_interval)
