"""The coordinator's side of one SecAgg+ round (Bell et al., CCS 2020, Algorithm 2, server).

:class:`SecAggRound` holds, per stage, only what the protocol routes: public keys,
ciphertexts it cannot read, commitments, one running sum of the masked vectors
(mod ``m``), and the shares of the unmask stage. It never holds one site's unmasked
input: a masked vector is added to the sum the moment it arrives and dropped.

* ``U1`` (keys received) -> the neighbour graph: a circulant graph of degree ``k``
  over a random order of ``U1`` (k-regular; every site when ``k = |U1| - 1``).
* ``U2`` (shares received) -> each site in ``U2`` gets the ciphertexts of its
  neighbours in ``U2``; it masks with exactly those.
* ``U3`` (masked inputs received) -> the sum; each site in ``U3`` is shown the whole
  ``U3`` (indices and site names) and signs it (Bonawitz et al. 2017, section 4.4,
  ConsistencyCheck); the unmask stage shows every signer the signatures of all.
* ``U4`` (unmask replies) -> per site ``j`` of ``U3`` the ``b_j``-shares (its own
  included when it answered), per site of ``U2 - U3`` the key shares; each secret rebuilt from ``t`` of them and checked
  (``b_j`` against its commitment, the key against its published public key); when
  the first ``t`` shares do not rebuild it, other ``t``-subsets are tried and the
  holders whose shares do not fit are named (``SecureSum.bad_shares``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from strategies.wire import message_keys as keys
from strategies.wire.secure_aggregation.crypto import (
    KEY_BYTES, add_mask, commitment, mask_seed, public_of, rebuild_secret)
from strategies.wire.secure_aggregation.encoding import dequantised_sum, unpack
from strategies.wire.secure_aggregation.errors import SecAggError
from strategies.wire.secure_aggregation.participant import entry_list
from strategies.wire.secure_aggregation.settings import SecAggSettings

__all__ = ["SecAggRound", "SecureSum"]

#: t-subsets tried when rebuilding one secret whose shares do not all fit.
MAX_SUBSETS = 256


@dataclass(frozen=True)
class SecureSum:
    """What an unmasked round yields.

    Attributes
    ----------
    total : numpy.ndarray
        float64, the sum over ``summed`` of each site's clipped weighted vector.
    exact : numpy.ndarray
        uint64, the unmasked sum mod ``m``: the sum of the sites' quantised vectors.
    summed, dropped : list[int]
        Node ids whose input is in the sum; node ids that shared keys but sent no input.
    bad_shares : dict[int, str]
        Node ids whose unmask shares did not fit, and why (they are left out).
    """

    total: np.ndarray
    exact: np.ndarray
    summed: list[int]
    dropped: list[int]
    bad_shares: dict[int, str]


class SecAggRound:
    """One round's protocol state at the coordinator.

    Parameters
    ----------
    settings : SecAggSettings
        The run's ``secagg.*``.
    server_round : int
        The round.
    node_ids : list[int]
        The selected sites (the setup goes to them, indices ``1..n`` in this order).
    seed : int
        Seeds the order of the neighbour graph.
    length : int
        Values in each masked vector.
    """

    def __init__(self, settings: SecAggSettings, server_round: int, node_ids: list[int],
                 seed: int, length: int) -> None:
        if len(node_ids) < max(2, settings.min_participants):
            raise SecAggError(f"{len(node_ids)} sites selected, fewer than "
                              f"secagg.min-participants ({settings.min_participants})")
        self.settings, self.server_round, self.length = settings, server_round, length
        self.index = {node: i for i, node in enumerate(node_ids, start=1)}
        self.node = {i: node for node, i in self.index.items()}
        self._rng = np.random.default_rng([seed, server_round])
        self.plans = {node: settings.plan(server_round, i, len(node_ids))
                      for node, i in self.index.items()}
        first = next(iter(self.plans.values()))
        self.threshold, self.modulus_bits = first.threshold, first.modulus_bits
        self.public: dict[int, tuple[bytes, bytes]] = {}      # U1: index -> (key c, key s)
        self.signed: dict[int, tuple[str, bytes]] = {}        # U1: index -> (site, signature)
        self.neighbours: dict[int, list[int]] = {}
        self.ciphertexts: dict[int, dict[int, bytes]] = {}    # U2: sender -> recipient -> ct
        self.commitments: dict[int, bytes] = {}
        self._sum = np.zeros(length, dtype=np.uint64)
        self.masked_from: list[int] = []                       # U3 (indices)
        self.survivor_signatures: dict[int, bytes] = {}        # U3 that signed U3
        self.seed_shares: dict[int, dict[int, bytes]] = {}     # owner -> holder -> share
        self.key_shares: dict[int, dict[int, bytes]] = {}
        self.answered: list[int] = []                          # U4

    def _stage(self, node_id: int, stage: str) -> dict[str, Any]:
        return {keys.SECAGG_STAGE: stage, **self.plans[node_id].entries()}

    def _known(self, node_id: int, members: Any, stage: str) -> int:
        index = self.index.get(node_id)
        if index is None or index not in members:
            raise SecAggError(f"a {stage} reply from a site not asked in this stage")
        return index

    # ------------------------------------------------------------------ setup
    def setup_entries(self, node_id: int) -> dict[str, Any]:
        """The setup instruction's entries for ``node_id``."""
        return self._stage(node_id, keys.SECAGG_SETUP)

    def take_keys(self, node_id: int, reply: Mapping[str, Any]) -> None:
        """``node_id``'s two public keys, its site name and its signature of them (a
        repeated or malformed key is refused; the signature is the sites' to check)."""
        index = self._known(node_id, self.node, keys.SECAGG_SETUP)
        pair = (reply.get(keys.SECAGG_KEY_C), reply.get(keys.SECAGG_KEY_S))
        name, signature = reply.get(keys.SITE_NAME), reply.get(keys.SECAGG_KEY_SIGNATURE)
        if not isinstance(name, str) or not name or not isinstance(signature, bytes):
            raise SecAggError(f"the setup reply needs the site's name and its "
                              f"{keys.SECAGG_KEY_SIGNATURE}")
        if not all(isinstance(k, bytes) and len(k) == KEY_BYTES for k in pair):
            raise SecAggError(f"the setup reply needs two {KEY_BYTES}-byte public keys "
                              f"({keys.SECAGG_KEY_C}, {keys.SECAGG_KEY_S})")
        used = {k for p in self.public.values() for k in p}
        if pair[0] == pair[1] or used & set(pair):
            raise SecAggError("the setup reply repeats a public key")
        if name in {n for n, _ in self.signed.values()}:
            raise SecAggError(f"the setup reply repeats site name {name!r}")
        self.public[index] = pair
        self.signed[index] = (name, signature)

    # ------------------------------------------------------------- share keys
    def _draw_graph(self) -> None:
        order = [int(i) for i in self._rng.permutation(sorted(self.public))]
        size = len(order)
        degree = min(self.plans[self.node[order[0]]].neighbours, size - 1) if size else 0
        if size < 2 or degree + 1 < self.threshold:
            raise SecAggError(f"{size} sites sent keys: too few for threshold {self.threshold}")
        if degree == size - 1:
            self.neighbours = {i: sorted(set(order) - {i}) for i in order}
            return
        half = degree // 2
        self.neighbours = {order[p]: sorted({order[(p + d) % size] for d in range(1, half + 1)}
                                            | {order[(p - d) % size] for d in range(1, half + 1)})
                           for p in range(size)}

    def share_keys_entries(self, node_id: int) -> dict[str, Any]:
        """The share-keys instruction: ``node_id``'s neighbours and their public keys."""
        if not self.neighbours:
            self._draw_graph()
        peers = self.neighbours[self.index[node_id]]
        return {**self._stage(node_id, keys.SECAGG_SHARE_KEYS), keys.SECAGG_PEERS: peers,
                keys.SECAGG_PEER_KEYS_C: [self.public[p][0] for p in peers],
                keys.SECAGG_PEER_KEYS_S: [self.public[p][1] for p in peers],
                keys.SECAGG_PEER_NAMES: [self.signed[p][0] for p in peers],
                keys.SECAGG_PEER_SIGNATURES: [self.signed[p][1] for p in peers]}

    def take_shares(self, node_id: int, reply: Mapping[str, Any]) -> None:
        """``node_id``'s ciphertexts (one per neighbour, no other) and commitment."""
        index = self._known(node_id, self.neighbours, keys.SECAGG_SHARE_KEYS)
        to = entry_list(reply, keys.SECAGG_SHARE_TO, int)
        texts = entry_list(reply, keys.SECAGG_CIPHERTEXTS, bytes)
        promise = reply.get(keys.SECAGG_COMMITMENT)
        if sorted(to) != self.neighbours[index] or len(to) != len(texts):
            raise SecAggError("the share-keys reply must hold one ciphertext per neighbour")
        if not isinstance(promise, bytes) or len(promise) != 32:
            raise SecAggError(f"the share-keys reply has no 32-byte {keys.SECAGG_COMMITMENT}")
        self.ciphertexts[index] = dict(zip(to, texts))
        self.commitments[index] = promise

    # ---------------------------------------------------------------- collect
    def _peers_in(self, index: int, members: Any) -> list[int]:
        return [p for p in self.neighbours[index] if p in members]

    def collect_entries(self, node_id: int) -> dict[str, Any]:
        """The collect stage's entries: the ciphertexts addressed to ``node_id``."""
        index = self.index[node_id]
        senders = self._peers_in(index, self.ciphertexts)
        return {**self._stage(node_id, keys.SECAGG_COLLECT), keys.SECAGG_SHARES_FROM: senders,
                keys.SECAGG_SHARES: [self.ciphertexts[s][index] for s in senders]}

    def take_masked(self, node_id: int, packed: np.ndarray) -> None:
        """Add ``node_id``'s masked vector to the running sum (nothing else is kept)."""
        index = self._known(node_id, self.ciphertexts, keys.SECAGG_COLLECT)
        if index in self.masked_from:
            raise SecAggError("a second masked input from one site in one round")
        values = unpack(packed, self.modulus_bits, self.length)
        self._sum += values
        self._sum &= np.uint64((1 << self.modulus_bits) - 1)
        self.masked_from.append(index)

    # ------------------------------------------------------------ consistency
    def _survivor_entries(self) -> dict[str, Any]:
        survivors = sorted(self.masked_from)
        return {keys.SECAGG_SURVIVORS: survivors,
                keys.SECAGG_SURVIVOR_NAMES: [self.signed[i][0] for i in survivors]}

    def consistency_entries(self, node_id: int) -> dict[str, Any]:
        """The consistency instruction: the whole survivor set ``U3``, the same for all."""
        return {**self._stage(node_id, keys.SECAGG_CONSISTENCY), **self._survivor_entries()}

    def take_consistency(self, node_id: int, reply: Mapping[str, Any]) -> None:
        """``node_id``'s signature of ``U3`` (checked by the sites, against their rosters)."""
        index = self._known(node_id, self.masked_from, keys.SECAGG_CONSISTENCY)
        signature = reply.get(keys.SECAGG_SURVIVOR_SIGNATURE)
        if not isinstance(signature, bytes):
            raise SecAggError(f"the consistency reply has no {keys.SECAGG_SURVIVOR_SIGNATURE}")
        self.survivor_signatures[index] = signature

    # ----------------------------------------------------------------- unmask
    def unmask_entries(self, node_id: int) -> dict[str, Any]:
        """The unmask instruction: ``U3``, every signature of it, the sum's size."""
        signers = sorted(self.survivor_signatures)
        return {**self._stage(node_id, keys.SECAGG_UNMASK), **self._survivor_entries(),
                keys.SECAGG_SIGNERS: signers,
                keys.SECAGG_SIGNATURES: [self.survivor_signatures[i] for i in signers],
                keys.SECAGG_SUMMED: len(self.masked_from)}

    def take_unmask(self, node_id: int, reply: Mapping[str, Any]) -> None:
        """``node_id``'s shares: of ``b`` for surviving neighbours, of the key for dropped ones."""
        index = self._known(node_id, self.survivor_signatures, keys.SECAGG_UNMASK)
        peers = self._peers_in(index, self.ciphertexts)
        alive = [p for p in peers if p in self.masked_from]
        seeds_of = entry_list(reply, keys.SECAGG_SEED_SHARES_OF, int)
        seeds = entry_list(reply, keys.SECAGG_SEED_SHARES, bytes)
        keys_of = entry_list(reply, keys.SECAGG_KEY_SHARES_OF, int)
        key_shares = entry_list(reply, keys.SECAGG_KEY_SHARES, bytes)
        if (sorted(seeds_of) != sorted([*alive, index]) or len(seeds) != len(seeds_of)
                or sorted(keys_of) != sorted(set(peers) - set(alive))
                or len(key_shares) != len(keys_of)):
            raise SecAggError("the unmask reply must hold a seed share per surviving neighbour "
                              "and its own, and a key share per dropped neighbour, no more")
        for owner, share in zip(seeds_of, seeds):
            self.seed_shares.setdefault(owner, {})[index] = share
        for owner, share in zip(keys_of, key_shares):
            self.key_shares.setdefault(owner, {})[index] = share
        self.answered.append(index)

    def stage_nodes(self, stage: str) -> list[int]:
        """The node ids to ask in ``stage`` (who answered the stage before it)."""
        members = {keys.SECAGG_SETUP: self.node, keys.SECAGG_SHARE_KEYS: self.public,
                   keys.SECAGG_COLLECT: self.ciphertexts,
                   keys.SECAGG_CONSISTENCY: self.masked_from,
                   keys.SECAGG_UNMASK: self.survivor_signatures}[stage]
        return [self.node[i] for i in sorted(members)]

    def _rebuild(self, owner: int, shares: dict[int, bytes], check: Any, what: str
                 ) -> tuple[bytes, list[int]]:
        """``owner``'s secret from its holders' ``shares``; the holders whose share did not fit."""
        holders = sorted(shares)
        if len(holders) < self.threshold:
            raise SecAggError(f"{what} of site {self.node[owner]}: {len(holders)} shares, "
                              f"fewer than the threshold {self.threshold}")
        for tried, subset in enumerate(itertools.combinations(holders, self.threshold)):
            if tried >= MAX_SUBSETS:
                break
            try:
                secret = rebuild_secret([shares[h] for h in subset])
            except SecAggError:
                continue
            if not check(secret):
                continue
            if tried == 0:  # the first t shares fit: the usual case, no search
                return secret, []
            bad = []  # some share did not fit: name every holder whose share does not
            for holder in set(holders) - set(subset):
                try:
                    if not check(rebuild_secret([shares[h] for h in subset[1:]]
                                                + [shares[holder]])):
                        bad.append(holder)
                except SecAggError:
                    bad.append(holder)
            return secret, bad
        raise SecAggError(f"{what} of site {self.node[owner]}: no {self.threshold} of its "
                          f"{len(holders)} shares rebuild it (shares altered)")

    def finish(self) -> SecureSum:
        """Remove the masks; the sum of the inputs of ``U3``.

        Raises
        ------
        SecAggError
            When the sum would hold fewer than ``secagg.min-participants`` inputs, or a
            secret cannot be rebuilt (the message names the site).
        """
        if len(self.masked_from) < max(2, self.settings.min_participants):
            raise SecAggError(f"{len(self.masked_from)} masked inputs arrived, fewer than "
                              f"secagg.min-participants ({self.settings.min_participants})")
        total, bits, bad = self._sum.copy(), self.modulus_bits, {}
        for owner in self.masked_from:
            seed, wrong = self._rebuild(owner, self.seed_shares.get(owner, {}),
                                        lambda s, o=owner: commitment(s) == self.commitments[o],
                                        "the self-mask seed")
            bad.update({h: f"a wrong share of site {self.node[owner]}'s seed" for h in wrong})
            add_mask(total, seed, bits, sign=-1)
        dropped = [i for i in sorted(self.ciphertexts) if i not in self.masked_from]
        for owner in dropped:
            key, wrong = self._rebuild(owner, self.key_shares.get(owner, {}),
                                       lambda k, o=owner: public_of(k) == self.public[o][1],
                                       "the mask key")
            bad.update({h: f"a wrong share of site {self.node[owner]}'s key" for h in wrong})
            for peer in self._peers_in(owner, self.masked_from):
                # peer added sign(peer, owner) PRG(s_peer,owner): take it out.
                add_mask(total, mask_seed(key, self.public[peer][1]), bits,
                         sign=-1 if peer < owner else 1)
        summed = len(self.masked_from)
        return SecureSum(
            total=dequantised_sum(total, summed, self.settings.clip, self.settings.bits),
            exact=total, summed=[self.node[i] for i in sorted(self.masked_from)],
            dropped=[self.node[i] for i in dropped],
            bad_shares={self.node[h]: why for h, why in bad.items()})
