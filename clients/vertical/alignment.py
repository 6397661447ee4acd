"""The outcome of a site's patient alignment (PSI), kept in its federation's state folder.

After the private set intersection (clients/vertical/psi_stages.py) a site holds the
ids of the patients it shares with every other site, in the order every site holds
them (their salted ids sorted), or the refusal of the policy rule
``vertical.min-intersection`` when too few are shared. Every per-patient stage of the
federation reads it through :func:`load_alignment`, so it works on the aligned
patients only, and not at all once the site refused.

The file (``psi-alignment.json``) is written atomically (clients/site/atomic_file.py)
and holds the site's own ids: it never leaves the site.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from clients.site.atomic_file import write_atomic
from clients.site.policy import PolicyRefusal
from strategies.wire.errors import SiteError

__all__ = ["ALIGNMENT_FILE", "MIN_INTERSECTION_RULE", "save_alignment", "save_refusal",
           "load_alignment"]

ALIGNMENT_FILE = "psi-alignment.json"
#: The policy rule a too small intersection breaks.
MIN_INTERSECTION_RULE = "vertical.min-intersection"


def save_alignment(state_dir: Path, ids: Sequence[str]) -> Path:
    """Keep the aligned ids (the site's own ids, in the common order) in ``state_dir``."""
    return _write(state_dir, {"ids": list(ids)})


def save_refusal(state_dir: Path, detail: str) -> PolicyRefusal:
    """Keep the refusal of ``vertical.min-intersection`` in ``state_dir``; return it to raise."""
    _write(state_dir, {"refused": detail})
    return PolicyRefusal(MIN_INTERSECTION_RULE, detail)


def load_alignment(state_dir: Path) -> list[str]:
    """The aligned ids of the federation whose state folder is ``state_dir``, in the common order.

    Raises
    ------
    PolicyRefusal
        Rule ``vertical.min-intersection`` if the site refused the intersection.
    SiteError
        If no PSI has completed in this federation (no ``psi-alignment.json``), or the
        file is unreadable.
    """
    path = Path(state_dir) / ALIGNMENT_FILE
    if not path.is_file():
        raise SiteError(f"{ALIGNMENT_FILE}: no patient alignment in this federation; "
                        f"the PSI (stage psi-request) must complete first")
    try:
        saved = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise SiteError(f"{ALIGNMENT_FILE}: unreadable: {error}") from error
    if "refused" in saved:
        raise PolicyRefusal(MIN_INTERSECTION_RULE, str(saved["refused"]))
    return [str(item) for item in saved["ids"]]


def _write(state_dir: Path, content: dict[str, object]) -> Path:
    """Write ``content`` as the alignment file of ``state_dir``."""
    data = json.dumps(content).encode()
    return write_atomic(Path(state_dir) / ALIGNMENT_FILE, lambda handle: handle.write(data))
