"""One site's side of a SecAgg+ round (Bell et al., CCS 2020, Algorithm 2, client side),
authenticated and with Bonawitz et al.'s (CCS 2017, section 4.4) ConsistencyCheck.

The five stages, each a method that takes the stage's config entries and returns the
reply's (:mod:`strategies.wire.message_keys`); between stages the site keeps
:meth:`Participant.to_bytes` in its state dir (a fresh process may serve the next one).

1. :meth:`Participant.start` -- two X25519 key pairs: ``c`` encrypts shares, ``s``
   agrees the pairwise masks; :meth:`public_keys` is the setup reply, both keys signed
   with the site's long-term key (:func:`~.signing.key_statement`).
2. :meth:`share_keys` -- every neighbour's keys are checked against the site's own
   roster first (names distinct, none its own, every signature valid: a substituted key
   is refused, naming the site, and nothing is shared); the self-mask seed ``b``; Shamir
   ``t``-of-``(k + 1)`` shares of ``b`` and of ``s``'s private key, one pair per neighbour, each encrypted for it, and
   one pair the site keeps; a commitment to ``b``.
3. :meth:`receive_shares` then :meth:`mask` -- the shares addressed to the site are
   decrypted (an altered one is refused before any training), then
   ``y = q + PRG(b) + sum_{j in N(i) cap U2} sign(i, j) PRG(s_ij) mod m`` with
   ``sign = +1`` for ``i < j``, ``-1`` otherwise. A site masks once per round: two
   masked vectors under the same masks would reveal their difference.
4. :meth:`consistency` -- the coordinator shows the whole survivor set ``U3``; the site
   signs it (:func:`~.signing.survivor_statement`), once per round.
5. :meth:`unmask` -- only when the coordinator shows at least ``max(t, floor(n / 2) + 1)``
   valid signatures by distinct members of ``U3`` on the very set this site signed: then,
   for each neighbour, the share of ``b_j`` when ``j`` is in ``U3``, of ``s_j``'s key when
   it is not, and its own share of its own ``b``, never of its own key. Every honest site
   signs one set, so no two sets both gather more than ``n / 2`` signatures: all honest
   sites that reveal anything reveal for the same ``U3``, and a coordinator that tells
   holders different stories about who survived (to get one site's seed and its
   neighbours' mask keys) gets nothing.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import numpy as np

from strategies.wire import message_keys as keys
from strategies.wire.secure_aggregation.crypto import (
    KEY_BYTES, KeyPair, add_mask, commitment, decrypt_shares, encrypt_shares, mask_seed,
    split_secret)
from strategies.wire.secure_aggregation.encoding import pack, quantise
from strategies.wire.secure_aggregation.errors import SecAggError
from strategies.wire.secure_aggregation.settings import RoundPlan
from strategies.wire.secure_aggregation.signing import (SiteIdentity, key_statement,
                                                        survivor_statement)

__all__ = ["Participant", "entry_list"]


def entry_list(config: Mapping[str, Any], key: str, kind: type) -> list:
    """``config[key]`` as a list of ``kind`` (int or bytes), naming the key when it is not."""
    if key not in config:
        raise SecAggError(f"secure aggregation entry {key!r} is missing")
    values = config[key]
    if not isinstance(values, list) or not all(
            isinstance(v, kind) and not isinstance(v, bool) for v in values):
        raise SecAggError(f"secure aggregation entry {key!r} is not a list of {kind.__name__}")
    return list(values)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Participant:
    """A site in one SecAgg+ round: its keys, its neighbours, the shares it holds."""

    def __init__(self, plan: RoundPlan, federation: str, key_c: bytes, key_s: bytes) -> None:
        self.plan, self.federation = plan, federation
        self._c, self._s = KeyPair(key_c), KeyPair(key_s)
        self.peers: dict[int, tuple[bytes, bytes]] = {}
        self.names: dict[int, str] = {}
        self.survivors: list[tuple[int, str]] = []
        self._seed = b""
        self._own: tuple[bytes, bytes] = (b"", b"")
        self.held: dict[int, tuple[bytes, bytes]] = {}
        self.masked = False

    @classmethod
    def start(cls, plan: RoundPlan, federation: str) -> Participant:
        """A participant with fresh key pairs (the setup stage)."""
        return cls(plan, federation, KeyPair().private, KeyPair().private)

    def public_keys(self, identity: SiteIdentity) -> dict[str, bytes]:
        """The setup reply: both public keys and the site's signature of them."""
        statement = key_statement(self.federation, self.plan.server_round, self.plan.index,
                                  identity.name, self._c.public, self._s.public)
        return {keys.SECAGG_KEY_C: self._c.public, keys.SECAGG_KEY_S: self._s.public,
                keys.SECAGG_KEY_SIGNATURE: identity.sign(statement)}

    def _verify_peers(self, config: Mapping[str, Any], identity: SiteIdentity,
                      peers: list[int], keys_c: list[bytes], keys_s: list[bytes]) -> None:
        """Every neighbour's keys signed by its roster key (found item 2: key substitution)."""
        names = entry_list(config, keys.SECAGG_PEER_NAMES, str)
        signatures = entry_list(config, keys.SECAGG_PEER_SIGNATURES, bytes)
        if not len(names) == len(signatures) == len(peers) or len(set(names)) != len(names) \
                or identity.name in names:
            raise SecAggError("the neighbours' site names are missing, repeated or this "
                              "site's own")
        for peer, name, key_c, key_s, signature in zip(peers, names, keys_c, keys_s,
                                                       signatures):
            identity.verify(name, key_statement(self.federation, self.plan.server_round, peer,
                                                name, key_c, key_s), signature)
        self.names = dict(zip(peers, names))

    def check_round(self, config: Mapping[str, Any]) -> None:
        """Refuse a stage whose plan is not the one this participant was set up with."""
        plan = RoundPlan.parse(config)
        if plan != self.plan:
            raise SecAggError(f"the stage is for round {plan.server_round} as participant "
                              f"{plan.index}, but this site was set up for round "
                              f"{self.plan.server_round} as participant {self.plan.index}")

    # ------------------------------------------------------------- share keys
    def share_keys(self, config: Mapping[str, Any], identity: SiteIdentity) -> dict[str, Any]:
        """The share-keys reply: one ciphertext per neighbour and the commitment to ``b``."""
        self.check_round(config)
        if self._seed:
            raise SecAggError("this site has already shared its keys in this round")
        peers = entry_list(config, keys.SECAGG_PEERS, int)
        keys_c = entry_list(config, keys.SECAGG_PEER_KEYS_C, bytes)
        keys_s = entry_list(config, keys.SECAGG_PEER_KEYS_S, bytes)
        plan = self.plan
        if not len(peers) == len(keys_c) == len(keys_s) or len(set(peers)) != len(peers):
            raise SecAggError("the neighbours and their keys do not match one to one")
        holders = len(peers) + 1
        if not (plan.threshold <= holders and 2 * plan.threshold > holders
                and len(peers) <= plan.neighbours):
            raise SecAggError(f"{len(peers)} neighbours for threshold {plan.threshold} (of at "
                              f"most {plan.neighbours}): more than half of the holders and "
                              "at least the threshold must be needed")
        if plan.index in peers or not all(1 <= p <= plan.participants for p in peers):
            raise SecAggError(f"a neighbour index is this site's own or not in "
                              f"1..{plan.participants}")
        own = (self._c.public, self._s.public)
        if any(len(k) != KEY_BYTES for k in keys_c + keys_s) or any(
                pair == own or pair[0] in own or pair[1] in own for pair in zip(keys_c, keys_s)):
            raise SecAggError("a neighbour's public key is malformed or this site's own")
        self._verify_peers(config, identity, peers, keys_c, keys_s)
        self.peers = {p: (c, s) for p, c, s in zip(peers, keys_c, keys_s)}
        self._seed = os.urandom(KEY_BYTES)
        seed_shares = split_secret(self._seed, plan.threshold, holders)
        key_shares = split_secret(self._s.private, plan.threshold, holders)
        self._own = (seed_shares[-1], key_shares[-1])
        ciphertexts = [encrypt_shares(self._c.private, self.peers[p][0], plan.index, p,
                                      seed_shares[i], key_shares[i])
                       for i, p in enumerate(peers)]
        return {keys.SECAGG_SHARE_TO: peers, keys.SECAGG_CIPHERTEXTS: ciphertexts,
                keys.SECAGG_COMMITMENT: commitment(self._seed)}

    # ---------------------------------------------------------------- collect
    def receive_shares(self, config: Mapping[str, Any]) -> None:
        """Decrypt the shares the collect stage carries; refuse an altered or foreign one."""
        self.check_round(config)
        if not self._seed:
            raise SecAggError("shares arrived before this site shared its keys")
        senders = entry_list(config, keys.SECAGG_SHARES_FROM, int)
        ciphertexts = entry_list(config, keys.SECAGG_SHARES, bytes)
        if len(senders) != len(ciphertexts) or len(set(senders)) != len(senders):
            raise SecAggError("the shares and their senders do not match one to one")
        unknown = sorted(set(senders) - set(self.peers))
        if unknown:
            raise SecAggError(f"shares from participants {unknown}, not neighbours of this site")
        if len(senders) + 1 < self.plan.threshold:
            raise SecAggError(f"shares from {len(senders)} neighbours and its own, fewer "
                              f"than the threshold {self.plan.threshold}")
        self.held = {src: decrypt_shares(self._c.private, self.peers[src][0], src,
                                         self.plan.index, ciphertext)
                     for src, ciphertext in zip(senders, ciphertexts)}

    def mask(self, values: np.ndarray) -> np.ndarray:
        """The packed masked vector of ``values`` (weighted at the site, clipped here)."""
        return self.mask_levels(quantise(values, self.plan.clip, self.plan.bits))

    def mask_levels(self, levels: np.ndarray) -> np.ndarray:
        """The packed masked vector of quantised ``levels`` (``uint64``, each ``< 2^bits``)."""
        if not self.held:
            raise SecAggError("no shares were received: the masks are not agreed")
        if self.masked:
            raise SecAggError("this site has already sent its masked input in this round")
        plan = self.plan
        total = np.array(levels, dtype=np.uint64)
        if total.ndim != 1 or np.any(total >> np.uint64(plan.bits)):
            raise SecAggError(f"masked levels must be a vector of {plan.bits}-bit values")
        add_mask(total, self._seed, plan.modulus_bits)
        for peer in sorted(self.held):
            add_mask(total, mask_seed(self._s.private, self.peers[peer][1]), plan.modulus_bits,
                     sign=1 if plan.index < peer else -1)
        self.masked = True
        return pack(total, plan.modulus_bits)

    # ------------------------------------------------------------ consistency
    def _survivor_set(self, config: Mapping[str, Any]) -> list[tuple[int, str]]:
        survivors = entry_list(config, keys.SECAGG_SURVIVORS, int)
        names = entry_list(config, keys.SECAGG_SURVIVOR_NAMES, str)
        if len(names) != len(survivors) or len(set(survivors)) != len(survivors) \
                or len(set(names)) != len(names):
            raise SecAggError("the survivors and their site names do not match one to one")
        return sorted(zip(survivors, names))

    def consistency(self, config: Mapping[str, Any], identity: SiteIdentity) -> dict[str, Any]:
        """The consistency reply: this site's signature of the survivor set ``U3`` it is shown."""
        self.check_round(config)
        if not self.masked:
            raise SecAggError("asked to sign the survivors of a round this site sent no "
                              "masked input in")
        if self.survivors:
            raise SecAggError("this site has already signed a survivor set in this round")
        survivors = self._survivor_set(config)
        named = dict(survivors)
        if named.get(self.plan.index) != identity.name:
            raise SecAggError("the survivor set does not hold this site under its own name")
        if not all(1 <= i <= self.plan.participants for i in named):
            raise SecAggError(f"a survivor index is not in 1..{self.plan.participants}")
        wrong = sorted(p for p in named if p in self.peers and
                       (p not in self.held or named[p] != self.names.get(p)))
        if wrong:
            raise SecAggError(f"survivors {wrong} did not mask with this site under those names")
        self.survivors = survivors
        statement = survivor_statement(self.federation, self.plan.server_round, survivors,
                                       self.plan.participants, self.plan.threshold)
        return {keys.SECAGG_SURVIVOR_SIGNATURE: identity.sign(statement)}

    # ----------------------------------------------------------------- unmask
    def needed_signatures(self) -> int:
        """``max(t, floor(n / 2) + 1)``: the fewest signatures of ``U3`` that unmask (no two
        sets can both have that many when every honest site signs one)."""
        return max(self.plan.threshold, self.plan.participants // 2 + 1)

    def _check_signatures(self, config: Mapping[str, Any], identity: SiteIdentity) -> None:
        signers = entry_list(config, keys.SECAGG_SIGNERS, int)
        signatures = entry_list(config, keys.SECAGG_SIGNATURES, bytes)
        named = dict(self.survivors)
        if len(signers) != len(signatures) or len(set(signers)) != len(signers) \
                or not set(signers) <= set(named):
            raise SecAggError("the survivor set's signers are repeated or not survivors")
        needed = self.needed_signatures()
        if len(signers) < needed:
            raise SecAggError(f"{len(signers)} signatures of the survivor set, fewer than "
                              f"{needed}: nothing is revealed")
        statement = survivor_statement(self.federation, self.plan.server_round, self.survivors,
                                       self.plan.participants, self.plan.threshold)
        for signer, signature in zip(signers, signatures):
            identity.verify(named[signer], statement, signature)

    def unmask(self, config: Mapping[str, Any], min_participants: int,
               identity: SiteIdentity) -> dict[str, Any]:
        """The unmask reply: ``b``-shares of the neighbours in ``U3``, key shares of the others.

        Only for the survivor set this site signed, and only when enough distinct members of
        it signed that same set (:meth:`needed_signatures`); otherwise nothing.
        """
        self.check_round(config)
        if not self.survivors:
            raise SecAggError("asked to unmask before this site signed the survivor set")
        if self._survivor_set(config) != self.survivors:
            raise SecAggError("the unmask stage shows another survivor set than the one this "
                              "site signed: nothing is revealed")
        summed = config.get(keys.SECAGG_SUMMED)
        if summed != len(self.survivors) or isinstance(summed, bool):
            raise SecAggError(f"secure aggregation entry {keys.SECAGG_SUMMED!r} is not the "
                              "size of the survivor set")
        if summed < max(2, min_participants):
            raise SecAggError(f"the sum would hold {summed} inputs, fewer than "
                              f"{max(2, min_participants)}")
        self._check_signatures(config, identity)
        alive = {i for i, _ in self.survivors}
        own = self.plan.index
        seeds_of = sorted([*(alive & set(self.held)), own])
        dropped = sorted(set(self.held) - alive)
        return {keys.SECAGG_SEED_SHARES_OF: seeds_of,
                keys.SECAGG_SEED_SHARES: [self._own[0] if j == own else self.held[j][0]
                                          for j in seeds_of],
                keys.SECAGG_KEY_SHARES_OF: dropped,
                keys.SECAGG_KEY_SHARES: [self.held[j][1] for j in dropped]}

    # ---------------------------------------------------------------- storage
    def to_bytes(self) -> bytes:
        """Everything the next stage needs, secrets included (the site's state dir only)."""
        return json.dumps({
            "plan": asdict(self.plan), "federation": self.federation,
            "key-c": _b64(self._c.private),
            "key-s": _b64(self._s.private), "seed": _b64(self._seed),
            "own": [_b64(self._own[0]), _b64(self._own[1])],
            "peers": {str(p): [_b64(c), _b64(s)] for p, (c, s) in self.peers.items()},
            "held": {str(p): [_b64(a), _b64(b)] for p, (a, b) in self.held.items()},
            "names": {str(p): name for p, name in self.names.items()},
            "survivors": [list(pair) for pair in self.survivors],
            "masked": self.masked}).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> Participant:
        """The participant :meth:`to_bytes` wrote (:class:`SecAggError` when unreadable)."""
        try:
            state = json.loads(data.decode("utf-8"))
            self = cls(RoundPlan(**state["plan"]), str(state["federation"]),
                       base64.b64decode(state["key-c"]),
                       base64.b64decode(state["key-s"]))
            self._seed = base64.b64decode(state["seed"])
            self._own = (base64.b64decode(state["own"][0]), base64.b64decode(state["own"][1]))
            self.peers = {int(p): (base64.b64decode(c), base64.b64decode(s))
                          for p, (c, s) in state["peers"].items()}
            self.held = {int(p): (base64.b64decode(a), base64.b64decode(b))
                         for p, (a, b) in state["held"].items()}
            self.names = {int(p): str(name) for p, name in state["names"].items()}
            self.survivors = [(int(i), str(name)) for i, name in state["survivors"]]
            self.masked = bool(state["masked"])
        except (ValueError, KeyError, TypeError) as error:
            raise SecAggError(f"the saved secure aggregation state is unreadable ({error})") \
                from None
        return self
