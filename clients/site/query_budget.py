"""How many requests of a kind a dataset has had answered, all federations together, and the cap.

Some answers release a function of a site's data without noise: a loss query
(Power-of-Choice), a PSI request (which of the asked ids the site holds), a
split-learning evaluation (the site's labels scored against outputs the coordinator
chose). A cap per *federation* is no cap: a coordinator names a new federation and
asks again, and a full-set loss minus an (N-1)-subset loss is one patient's loss. So
each count belongs to the dataset, as the epsilon ledger does
(:func:`~clients.site.privacy_ledger.dataset_id`), and no federation id resets it.

The counts live in ``<folder>/<dataset id>/<counter>.json``, written atomically under
an exclusive lock that every process of the site takes (``fcntl.flock``), so two
workers cannot both take the last one. The hospital's runtime keeps its own in
``<state-dir>/runtime/queries/`` (:mod:`app.site_runtime.runtime_gate`), which the
sandboxed worker never sees; the site's round counts again in ``<state-dir>/request-counts/``.

Example::

    take_request(folder, data_path, LOSS_QUERIES, policy.max_queries, "max-queries")
"""

from __future__ import annotations

import fcntl
import json
import math
from pathlib import Path

import numpy as np

from clients.site.atomic_file import write_atomic
from clients.site.policy import PolicyRefusal
from clients.site.privacy_ledger import dataset_id

__all__ = ["COUNT_NAME", "EVALUATIONS", "QUERY_COUNTS", "LOSS_QUERIES", "PSI_REQUESTS", "BudgetError",
           "answered", "take_query", "take_request"]

#: Counters: loss queries, PSI requests served, split-learning evaluations scored.
LOSS_QUERIES = "loss-queries"
PSI_REQUESTS = "psi-requests"
EVALUATIONS = "split-evaluations"
#: What each counter counts, for the refusal's text.
_WHAT = {LOSS_QUERIES: "loss queries", PSI_REQUESTS: "PSI requests",
         EVALUATIONS: "split-learning evaluations"}
#: The folder of a site's own counts in its state dir (the worker's, without the runtime).
QUERY_COUNTS = "request-counts"
#: The per-federation loss-query count an earlier version kept (``<folder>/<federation>/``).
COUNT_NAME = "queries-answered"


class BudgetError(PolicyRefusal):
    """A count file is unreadable: the site refuses rather than start again from zero."""


def _path(folder: Path, data_path: Path, counter: str) -> Path:
    if counter not in _WHAT:
        raise ValueError(f"unknown request counter {counter!r}; known: {sorted(_WHAT)}")
    return Path(folder) / dataset_id(data_path) / f"{counter}.json"


def _legacy_queries(folder: Path) -> int:
    """The per-federation loss-query counts an earlier version kept in ``folder``, summed.

    They cannot be told apart by dataset, so all of them count against each dataset's
    first per-dataset count: the cap errs on the patients' side, and nothing is lost.
    """
    total = 0
    for saved in Path(folder).glob(f"*/{COUNT_NAME}.npy"):
        try:
            total += int(np.load(saved, allow_pickle=False))
        except (OSError, ValueError) as error:
            raise BudgetError("max-queries", f"an earlier loss-query count is unreadable "
                                             f"({type(error).__name__})") from None
    return total


def _read(path: Path, folder: Path, counter: str, rule: str) -> int:
    if not path.exists():
        return _legacy_queries(folder) if counter == LOSS_QUERIES else 0
    try:
        count = json.loads(path.read_text(encoding="utf-8"))["count"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise BudgetError(rule, f"the count of {_WHAT[counter]} is unreadable "
                                f"({type(error).__name__}); the site refuses") from None
    if not isinstance(count, int) or count < 0:
        raise BudgetError(rule, f"the count of {_WHAT[counter]} is malformed; the site refuses")
    return count


def answered(folder: Path, data_path: Path, counter: str) -> int:
    """How many ``counter`` requests the dataset in ``data_path`` has had answered."""
    path = _path(folder, data_path, counter)
    return _read(path, Path(folder), counter, counter)


def take_request(folder: Path, data_path: Path, counter: str, cap: float, rule: str) -> int:
    """Count one more ``counter`` request of the dataset; returns its count, this one in.

    Called before any data is read; the request is counted even if its answer fails.

    Parameters
    ----------
    folder : Path
        Where the counts are kept (the runtime's ``queries`` folder, or a state dir).
    data_path : Path
        The site's data folder: the dataset the count belongs to.
    counter : str
        :data:`LOSS_QUERIES`, :data:`PSI_REQUESTS` or :data:`EVALUATIONS`.
    cap : float
        The policy's cap (``math.inf``: none).
    rule : str
        The policy key the refusal names (``max-queries``, ``vertical.max-psi-requests``).

    Raises
    ------
    PolicyRefusal
        Naming ``rule``, when the dataset has had ``cap`` such requests answered.
    BudgetError
        The count is unreadable (the site refuses).
    """
    path = _path(folder, data_path, counter)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f"{counter}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            count = _read(path, Path(folder), counter, rule)
            if count >= cap:
                cap_text = "none" if math.isinf(cap) else f"{cap:g}"
                raise PolicyRefusal(rule, f"this dataset has had {count} {_WHAT[counter]} "
                                          f"answered (all federations together), the site's "
                                          f"cap is {cap_text}")
            write_atomic(path, lambda handle: handle.write(
                json.dumps({"count": count + 1}).encode("utf-8")))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return count + 1


def take_query(folder: Path, data_path: Path, max_queries: float) -> int:
    """Count one more loss query of the dataset (rule ``max-queries``): :func:`take_request`."""
    return take_request(folder, data_path, LOSS_QUERIES, max_queries, "max-queries")
