"""In-process wake-ups between a hospital's SuperNode and its site runner.

The site runner (:mod:`app.site_runtime.site_runner`) and Flower's SuperNode run in
one process (:mod:`app.site_runtime.site_node`) but talk over the SuperNode's
Runtime API, HTTP on loopback, which has no notifications: Flower's executor
learns everything by asking again. Three such waits lie on every message's
path (Flower 1.42, ``flwr/supernode/start_client_internal.py``):

1. the runner asks for a new task (``AcquireTask``) at a fixed interval;
2. the SuperNode creates the message's task *before* it has received the
   message's objects from the SuperLink, so the runner's pull of those objects
   fails and backs off, and reads them up to one backoff (0.5 s) after they came;
3. the SuperNode looks for the runner's reply every 0.5 s (``_push_messages``).

:class:`NodeSignals` carries one wake-up for each. The SuperNode side is hooked
by :func:`app.site_runtime.site_node.cap_supernode_waits`; the runner waits on the
signals instead of its fixed intervals, which remain as fallbacks (a signal
that never comes costs what the poll cost before, never more).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable

__all__ = ["NodeSignals"]


class NodeSignals:
    """Events between the SuperNode thread and the site runner thread of one process.

    Parameters
    ----------
    remembered : int
        How many received message ids are kept (oldest dropped first); a runner
        asks about the message it just acquired, so a few suffice.
    """

    def __init__(self, remembered: int = 64) -> None:
        if remembered < 1:
            raise ValueError(f"remembered must be >= 1, got {remembered}")
        self.remembered = remembered
        self.task_created = threading.Event()
        self.reply_stored = threading.Event()
        self._arrivals: OrderedDict[str, float] = OrderedDict()
        self._changed = threading.Condition()

    def message_received(self, message_id: str) -> None:
        """SuperNode: every object of ``message_id`` is in its object store."""
        with self._changed:
            self._arrivals[message_id] = time.monotonic()
            while len(self._arrivals) > self.remembered:
                self._arrivals.popitem(last=False)
            self._changed.notify_all()

    def received_at(self, message_id: str) -> float | None:
        """``time.monotonic()`` of the SuperNode's receipt of ``message_id`` (None: not seen)."""
        with self._changed:
            return self._arrivals.get(message_id)

    def wait_received(self, message_id: str, timeout: float) -> bool:
        """Runner: wait at most ``timeout`` s for the SuperNode's receipt of ``message_id``."""
        with self._changed:
            return self._changed.wait_for(lambda: message_id in self._arrivals, timeout)

    def after_receipt(self, message_id: str, pull_object: Callable[[str], bytes],
                      timeout: float) -> Callable[[str], bytes]:
        """``pull_object`` that first waits (at most ``timeout`` s) for the message's receipt.

        Flower's ``pull_objects`` calls it again after its own backoff when an
        object is still missing; with a short backoff the receipt, not the
        backoff, decides when the runner's pulls succeed.
        """
        def pull(object_id: str) -> bytes:
            self.wait_received(message_id, timeout)
            return pull_object(object_id)

        return pull

    def nap(self, seconds: float) -> None:
        """SuperNode: sleep at most ``seconds``, waking as soon as the runner stored a reply."""
        if self.reply_stored.wait(seconds):
            self.reply_stored.clear()
