"""The coordinator's site roster: which sites may take part, and how many examples each may count.

Sites report their own ``num-examples``; without a roster the server caps a
site at what it declared first (:class:`strategies.rounds.site_book.SiteBook`),
so a site that lies from its first reply keeps its weight. The roster is a TOML
file the coordinator writes (run config ``federation.roster``, an absolute path;
``configs/roster.example.toml``)::

    [sites.hospital-a]
    max-examples = 1200

One ``[sites.<name>]`` table per site, with ``max-examples`` (an integer >= 1):
the most examples the site may count in a train, evaluate or query reply.
:func:`load_roster` reads and checks it at ServerApp start and hands the
strategy a plain ``{site name: max-examples}`` mapping (``strategies`` reads no
files).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from strategies.wire.errors import ConfigError

__all__ = ["MAX_EXAMPLES", "RosterError", "load_roster"]

#: The one key of a ``[sites.<name>]`` table.
MAX_EXAMPLES = "max-examples"


class RosterError(ConfigError):
    """The roster file is missing, not TOML, or a key in it is missing or wrong."""


def _site_limit(path: Path, name: str, table: object) -> int:
    """The ``max-examples`` of ``[sites.<name>]``, checked."""
    where = f"sites.{name}"
    if not name.strip():
        raise RosterError(f"roster {path}: key 'sites' holds an empty site name")
    if not isinstance(table, dict):
        raise RosterError(f"roster {path}: '{where}' must be a table "
                          f"([{where}] with {MAX_EXAMPLES} = <n>), got {table!r}")
    unknown = sorted(set(table) - {MAX_EXAMPLES})
    if unknown:
        raise RosterError(f"roster {path}: unknown keys {unknown} in [{where}]; "
                          f"the only key is '{MAX_EXAMPLES}'")
    if MAX_EXAMPLES not in table:
        raise RosterError(f"roster {path}: key '{where}.{MAX_EXAMPLES}' is missing")
    value = table[MAX_EXAMPLES]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RosterError(f"roster {path}: key '{where}.{MAX_EXAMPLES}' must be an "
                          f"integer >= 1, got {value!r}")
    return value


def load_roster(path: str | Path) -> dict[str, int]:
    """``{site name: max-examples}`` of the roster file at ``path``.

    Raises
    ------
    RosterError
        Naming the file and the key: the file cannot be read or is not TOML,
        ``sites`` is missing, empty or not a table, a top-level key other than
        ``sites`` is present, or a site's table is malformed.
    """
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise RosterError(f"roster {path} (run config 'federation.roster') cannot be read: "
                          f"{exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise RosterError(f"roster {path}: not valid TOML ({exc})") from exc
    unknown = sorted(set(document) - {"sites"})
    if unknown:
        raise RosterError(f"roster {path}: unknown top-level keys {unknown}; "
                          "the only key is 'sites'")
    sites = document.get("sites")
    if not isinstance(sites, dict) or not sites:
        raise RosterError(f"roster {path}: key 'sites' is missing or empty: write one "
                          f"[sites.<name>] table with {MAX_EXAMPLES} = <n> per site")
    return {name: _site_limit(path, name, table) for name, table in sites.items()}
