"""How many loss queries a federation has had answered at this site, and the policy's cap.

A loss query (Power-of-Choice) releases a function of the site's training data
without noise; each answer draws a fresh random subset
(:meth:`~clients.training.site_task.SiteTask.training_loss`), so that two answers
cannot be differenced to one patient, and the site answers at most the policy's
``max-queries`` per federation. The count is kept in the site's state store
(``<state-dir>/<federation>/queries-answered.npy``), so a restart does not reset it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clients.site.policy import PolicyRefusal
from clients.site.state_store import SiteStateStore

__all__ = ["COUNT_NAME", "take_query"]

#: The count's name in the site's state store.
COUNT_NAME = "queries-answered"


def take_query(state_dir: Path, federation: str, max_queries: float) -> int:
    """Count one more query of ``federation``; returns how many it has had answered, this one in.

    Called before any data is read; the query is counted even if its answer fails.

    Raises
    ------
    PolicyRefusal
        Rule ``max-queries``, when the federation has had ``max_queries`` answered.
    """
    store = SiteStateStore(state_dir)
    saved = store.load(federation, COUNT_NAME)
    answered = 0 if saved is None else int(saved)
    if answered >= max_queries:
        raise PolicyRefusal("max-queries", f"this federation has had {answered} loss queries "
                                           f"answered, the site's cap is {max_queries:g}")
    store.save(federation, COUNT_NAME, np.asarray(answered + 1, dtype=np.int64))
    return answered + 1
