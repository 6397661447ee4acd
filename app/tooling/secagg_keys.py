"""``make secagg-key``, ``secagg-roster-add``, ``secagg-roster-list``: the SecAgg+ PKI's files.

Bell et al. (CCS 2020) assume a PKI: every site can check that a round key came from
the site it names. Ours is one Ed25519 key per hospital and one roster of their public
halves (:mod:`strategies.wire.secure_aggregation.signing`):

1. each hospital runs ``python -m app.tooling.secagg_keys keygen --site NAME --out
   /abs/secagg.key`` (mode 0600, never overwritten) and sends the printed public line to
   the coordinator;
2. the coordinator adds each line to the federation's roster (``add --roster
   /abs/secagg-roster.json --site NAME --public TEXT``) and sends the roster file to every
   hospital;
3. each hospital runs ``list --roster ...``, compares the fingerprint with the other
   hospitals by telephone or signed mail (never through the coordinator alone: a roster
   the coordinator altered would let it substitute keys), and names both files in its
   policy: ``[secure-aggregation] roster = ...``, ``signing-key = ...``.

Example::

    $ python -m app.tooling.secagg_keys keygen --site hospital-a --out /srv/fedmed/secagg.key
    hospital-a 3q2+7w...=
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from strategies.wire.secure_aggregation.errors import SecAggConfigError
from strategies.wire.secure_aggregation.signing import (generate_key, load_key, load_roster,
                                                        public_text, roster_fingerprint,
                                                        write_roster)
from strategies.rounds.site_book import site_name_problem

__all__ = ["main"]


def _absolute(parser: argparse.ArgumentParser, path: Path, flag: str) -> Path:
    if not path.is_absolute():
        parser.error(f"{flag} must be an absolute path (the site policy names it so)")
    return path


def _keygen(args: argparse.Namespace) -> int:
    if args.out.exists():
        key = load_key(args.out)
        print(f"secagg-key: {args.out} exists; left as it is", file=sys.stderr)
    else:
        key = generate_key(args.out)
        print(f"secagg-key: wrote {args.out} (mode 0600); send the line below to the "
              "coordinator for the federation's roster", file=sys.stderr)
    print(f"{args.site} {public_text(key)}")
    return 0


def _add(args: argparse.Namespace) -> int:
    text = args.public.strip()
    if Path(text).is_file():  # the keygen's printed line, saved to a file
        text = Path(text).read_text(encoding="utf-8").split()[-1]
    sites = {}
    if args.roster.exists():
        load_roster(args.roster)  # refuses a damaged roster before it is rewritten
        sites = json.loads(args.roster.read_text(encoding="utf-8"))["sites"]
    if sites.get(args.site, text) != text and not args.replace:
        raise SecAggConfigError(f"secure-aggregation.roster {args.roster}: site {args.site!r} "
                                "is there with another key (--replace to change it)")
    candidate = args.roster.with_name(args.roster.name + ".new")
    write_roster(candidate, {**sites, args.site: text})
    try:
        load_roster(candidate)  # a malformed key or one two sites share: the roster is kept
    except SecAggConfigError:
        candidate.unlink()
        raise
    candidate.replace(args.roster)
    print(f"roster: {args.site} added to {args.roster}; fingerprint "
          f"{roster_fingerprint(load_roster(args.roster))}")
    return 0


def _list(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    for name, key in sorted(roster.items()):
        print(f"{name} {public_text(key)}")
    print(f"fingerprint {roster_fingerprint(roster)} ({len(roster)} sites): compare it with "
          "every other hospital out of band")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``keygen``, ``add`` or ``list``; 2 with the reason on a bad file or argument."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    keygen = commands.add_parser("keygen", help="this hospital's signing key")
    keygen.add_argument("--site", required=True, help="the site's name (node_config site-name)")
    keygen.add_argument("--out", required=True, type=Path, help="absolute path of the key file")
    add = commands.add_parser("add", help="add a site's public key to the roster")
    add.add_argument("--roster", required=True, type=Path)
    add.add_argument("--site", required=True)
    add.add_argument("--public", required=True,
                     help="the public key text keygen printed, or a file holding that line")
    add.add_argument("--replace", action="store_true", help="change a site's key")
    listing = commands.add_parser("list", help="the roster's sites and its fingerprint")
    listing.add_argument("--roster", required=True, type=Path)
    args = parser.parse_args(argv)
    for flag in ("out", "roster"):
        if getattr(args, flag, None) is not None:
            _absolute(parser, getattr(args, flag), f"--{flag}")
    if getattr(args, "site", None) is not None and site_name_problem(args.site):
        parser.error(f"--site: {site_name_problem(args.site)}")
    try:
        return {"keygen": _keygen, "add": _add, "list": _list}[args.command](args)
    except SecAggConfigError as exc:
        print(f"secagg-keys: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
