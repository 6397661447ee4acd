"""The ServerApp's wait for a reply's arrays: a short backoff instead of Flower's 1, 2, 4 s.

A SuperNode sends a reply's header to the SuperLink before its arrays
(``flwr/supernode/start_client_internal.py``, ``_push_messages``, Flower 1.42),
and the SuperLink hands the header to the ServerApp as soon as it is stored.
The ServerApp's grid (``flwr.superlink.grid.http_grid.HttpGrid.pull_messages``)
then pulls the arrays with Flower's ``pull_objects``, which backs off 1, 2, 4,
8, 10 s (``flwr.supercore.constant.PULL_INITIAL_BACKOFF``,
``PULL_BACKOFF_CAP``) on an array that is not uploaded yet: a reply whose
arrays arrive 50 ms after its header is read after about 1 s, one that takes
1.1 s after 3 s. :func:`cap_grid_waits` makes that backoff start at
:data:`REPLY_PULL_BACKOFF` ``[0]`` and stay below ``[1]`` (as
:func:`app.site_runtime.site_node.cap_supernode_waits` does on the site's side).

An upload still in progress is waited for as before; the wait stays bounded:
the SuperLink drops an object-push session that received nothing for
``OBJECT_PUSH_SESSION_TTL_SECONDS`` (180 s, Flower 1.42), after which the pull
ends with an error reply (``MESSAGE_UNAVAILABLE``) that the round records as the
site's failure, and Flower's overall limit ``PULL_MAX_TIME`` is unchanged.
Flower's count limit (500 tries per object) is lifted, since 500 short tries
would end a slow but progressing upload after about 2 minutes.
"""

from __future__ import annotations

import functools

import flwr.superlink.grid.http_grid as http_grid
from flwr.supercore.inflatable.inflatable_utils import pull_objects

__all__ = ["REPLY_PULL_BACKOFF", "cap_grid_waits"]

#: (first, largest) seconds between two pulls of a reply's array that is not uploaded yet.
REPLY_PULL_BACKOFF = (0.05, 0.25)


def cap_grid_waits(initial: float = REPLY_PULL_BACKOFF[0],
                   cap: float = REPLY_PULL_BACKOFF[1]) -> None:
    """Make the ServerApp's grid pull a reply's arrays with backoff ``initial`` .. ``cap`` s.

    Replaces the ``pull_objects`` that ``HttpGrid.pull_messages`` calls (the
    ServerApp process's grid in a deployment) by Flower's own with these
    backoff settings and no count limit; calling it again replaces the settings.
    Simulation's in-memory grid pulls no objects and is unaffected.

    Raises
    ------
    ValueError
        If ``initial`` is not positive or ``cap`` is below ``initial``.
    """
    if not 0 < initial <= cap:
        raise ValueError(f"cap_grid_waits: need 0 < initial <= cap, got {initial}, {cap}")
    http_grid.pull_objects = functools.partial(
        pull_objects, max_tries_per_object=None, initial_backoff=initial, backoff_cap=cap)
