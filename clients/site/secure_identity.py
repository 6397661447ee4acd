"""Which signing key and roster a site's SecAgg+ round uses (the PKI of Bell et al. 2020).

A site's policy names both files (``[secure-aggregation] signing-key`` and ``roster``,
docs/DEPLOYMENT-REFERENCE.md, ``make secagg-key`` / ``make secagg-roster-add``): the round signs its keys and
survivor set with that key and checks every neighbour against that roster
(:class:`~strategies.wire.secure_aggregation.signing.SiteIdentity`). A policy file that
names neither refuses every SecAgg+ stage under ``secure-aggregation.roster``: keys relayed
unsigned can be substituted by the coordinator (issue #46, found item 2).

Simulation runs without a policy file (the permissive policy): its sites share one local
PKI beside their data folders, ``<data-root>/.fedmed-secagg-pki/`` (``make simulate`` and the
in-process engine put every synthetic hospital's folder in one data root): a key per site
name, made on first use, mode 0600, and one roster every simulated site adds itself to
under a lock,
so a simulated SecAgg+ round is authenticated and checked exactly as a deployed one.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

from clients.site.policy import PolicyRefusal, SitePolicy
from clients.site.site import Site
from strategies.wire.secure_aggregation.errors import SecAggConfigError
from strategies.wire.secure_aggregation.signing import (SiteIdentity, generate_key, load_key,
                                                        public_text, write_roster)

__all__ = ["SIMULATION_PKI", "site_identity"]

#: The simulation's shared PKI folder, beside the simulated sites' data folders.
SIMULATION_PKI = ".fedmed-secagg-pki"


#: The permissive policy (simulation's), made once.
_PERMISSIVE = SitePolicy.permissive()


def _simulation_identity(site: Site) -> SiteIdentity:
    folder = Path(site.data_path).resolve().parent / SIMULATION_PKI
    key_path, roster_path = folder / f"{site.name}.key", folder / "roster.json"
    if key_path.is_file() and roster_path.is_file():
        try:  # the common case: both made, the roster holds this site (no lock)
            return SiteIdentity.load(site.name, key_path, roster_path)
        except SecAggConfigError:
            pass  # not yet in the roster, or a roster being written: under the lock
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "roster.lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not key_path.exists():
            generate_key(key_path)
        roster = (json.loads(roster_path.read_text(encoding="utf-8"))["sites"]
                  if roster_path.exists() else {})
        key = load_key(key_path)
        if roster.get(site.name) != public_text(key):
            write_roster(roster_path, {**roster, site.name: public_text(key)})
        return SiteIdentity.load(site.name, key_path, roster_path)


def site_identity(site: Site) -> SiteIdentity:
    """The identity ``site``'s SecAgg+ round signs and verifies with.

    Raises
    ------
    PolicyRefusal
        ``secure-aggregation.roster`` or ``secure-aggregation.signing-key``: a policy
        file that names only one of the two, none, or files that do not load (the
        detail names the file's rule, never the path).
    """
    rules = site.policy.secure_aggregation
    if not rules.roster and not rules.signing_key:
        if site.policy == _PERMISSIVE:
            return _simulation_identity(site)
        raise PolicyRefusal("secure-aggregation.roster", "SecAgg+ needs the federation's "
                            "roster of site signing keys and this site's signing key "
                            "(unsigned round keys can be substituted)")
    if not rules.roster or not rules.signing_key:
        missing = "roster" if not rules.roster else "signing-key"
        raise PolicyRefusal(f"secure-aggregation.{missing}", "the policy names only one of "
                            "'roster' and 'signing-key'; SecAgg+ needs both")
    try:
        return SiteIdentity.load(site.name, rules.signing_key, rules.roster,
                                 site.read_policy_file)
    except SecAggConfigError as exc:
        rule = "signing-key" if "secure-aggregation.signing-key" in str(exc) else "roster"
        raise PolicyRefusal(f"secure-aggregation.{rule}", "the file does not load, or the "
                            "roster does not hold this site with this signing key") from None
