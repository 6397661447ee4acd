"""Sites of a SecAgg+ round in memory: the five stages between Participants and a SecAggRound,
each site with its own Ed25519 signing key and one roster of them all."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from strategies.secure_aggregation.coordinator import SecAggRound, SecureSum
from strategies.wire import message_keys as keys
from strategies.wire.secure_aggregation.participant import Participant
from strategies.wire.secure_aggregation.settings import RoundPlan, SecAggSettings
from strategies.wire.secure_aggregation.signing import SiteIdentity

#: The federation the in-memory rounds run in.
FEDERATION = "fed-test"

#: ``tamper(stage, node_id, entries) -> entries``: what a test changes on the way.
Tamper = Callable[[str, int, dict], dict]


def identities(nodes: Iterable[int]) -> dict[int, SiteIdentity]:
    """Node id -> the identity of site ``site-<node>``, all under one shared roster."""
    private = {n: Ed25519PrivateKey.generate() for n in nodes}
    roster = {f"site-{n}": key.public_key() for n, key in private.items()}
    return {n: SiteIdentity(f"site-{n}", key, roster) for n, key in private.items()}


def setup_reply(site: Participant, identity: SiteIdentity) -> dict:
    """The setup reply's entries as the coordinator takes them (with the site's name)."""
    return {**site.public_keys(identity), keys.SITE_NAME: identity.name}


def run_round(levels: dict[int, np.ndarray], settings: SecAggSettings = SecAggSettings(),
              *, drop: dict[str, Iterable[int]] | None = None, tamper: Tamper | None = None,
              min_participants: int = 2) -> tuple[SecAggRound, SecureSum]:
    """One round of the sites ``levels`` (node id -> quantised vector); ``drop[stage]``: the
    nodes that do not answer that stage."""
    drop = {stage: set(nodes) for stage, nodes in (drop or {}).items()}
    tamper = tamper or (lambda stage, node, entries: entries)
    length = len(next(iter(levels.values())))
    coordinator = SecAggRound(settings, 1, sorted(levels), seed=7, length=length)
    sites: dict[int, Participant] = {}
    ids = identities(levels)
    for node in coordinator.stage_nodes(keys.SECAGG_SETUP):
        sites[node] = Participant.start(RoundPlan.parse(coordinator.setup_entries(node)),
                                        FEDERATION)
        if node not in drop.get(keys.SECAGG_SETUP, ()):
            coordinator.take_keys(node, tamper(keys.SECAGG_SETUP, node,
                                               setup_reply(sites[node], ids[node])))
    for node in coordinator.stage_nodes(keys.SECAGG_SHARE_KEYS):
        reply = sites[node].share_keys(coordinator.share_keys_entries(node), ids[node])
        if node not in drop.get(keys.SECAGG_SHARE_KEYS, ()):
            coordinator.take_shares(node, tamper(keys.SECAGG_SHARE_KEYS, node, reply))
    for node in coordinator.stage_nodes(keys.SECAGG_COLLECT):
        sites[node].receive_shares(tamper("deliver", node, coordinator.collect_entries(node)))
        packed = sites[node].mask_levels(levels[node])
        if node not in drop.get(keys.SECAGG_COLLECT, ()):
            coordinator.take_masked(node, packed)
    for node in coordinator.stage_nodes(keys.SECAGG_CONSISTENCY):
        reply = sites[node].consistency(coordinator.consistency_entries(node), ids[node])
        if node not in drop.get(keys.SECAGG_CONSISTENCY, ()):
            coordinator.take_consistency(node, reply)
    for node in coordinator.stage_nodes(keys.SECAGG_UNMASK):
        reply = sites[node].unmask(coordinator.unmask_entries(node), min_participants,
                                   ids[node])
        if node not in drop.get(keys.SECAGG_UNMASK, ()):
            coordinator.take_unmask(node, tamper(keys.SECAGG_UNMASK, node, reply))
    return coordinator, coordinator.finish()


def random_levels(nodes: Iterable[int], length: int, bits: int = 20, seed: int = 0
                  ) -> dict[int, np.ndarray]:
    """Random ``bits``-bit vectors per node."""
    rng = np.random.default_rng(seed)
    return {n: rng.integers(0, 1 << bits, length, dtype=np.uint64) for n in nodes}


def keyed_sites(nodes: list[int], length: int, settings: SecAggSettings = SecAggSettings(),
                server_round: int = 1
                ) -> tuple[SecAggRound, dict[int, Participant], dict[int, SiteIdentity]]:
    """A coordinator, its sites and their identities after setup (share-keys is next)."""
    coordinator = SecAggRound(settings, server_round, nodes, seed=0, length=length)
    ids = identities(nodes)
    sites = {n: Participant.start(RoundPlan.parse(coordinator.setup_entries(n)), FEDERATION)
             for n in nodes}
    for node, site in sites.items():
        coordinator.take_keys(node, setup_reply(site, ids[node]))
    return coordinator, sites, ids


def agreed_sites(nodes: list[int], length: int, settings: SecAggSettings = SecAggSettings(),
                 server_round: int = 1
                 ) -> tuple[SecAggRound, dict[int, Participant], dict[int, SiteIdentity]]:
    """A coordinator, its sites and their identities after setup and share-keys."""
    coordinator, sites, ids = keyed_sites(nodes, length, settings, server_round)
    for node, site in sites.items():
        coordinator.take_shares(node, site.share_keys(coordinator.share_keys_entries(node),
                                                      ids[node]))
    return coordinator, sites, ids
