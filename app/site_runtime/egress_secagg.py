"""A SecAgg+ stage reply's protocol entries: only the protocol's keys, of the protocol's sizes.

A stage reply's ``secagg`` record (:mod:`clients.site.secure_round`,
:class:`strategies.wire.secure_aggregation.participant.Participant`) holds bytes and lists
of bytes, which could carry anything. The runtime holds each stage to exactly what the
protocol sends (Bell et al., CCS 2020), every size computed with the product's own
cryptography (:mod:`strategies.wire.secure_aggregation.crypto`) for the round's plan:

* ``setup``: ``key-c`` and ``key-s``, two distinct X25519 public keys, and
  ``key-signature``, one Ed25519 signature;
* ``share-keys``: ``share-to`` exactly the instruction's ``secagg-peers``, one
  ``ciphertexts`` entry per peer of the size of a Fernet ciphertext of two Shamir shares
  of a 32-byte secret, and ``commitment`` a SHA-256 digest;
* ``consistency``: ``survivor-signature``, one Ed25519 signature;
* ``unmask``: ``seed-shares-of`` survivors of the instruction's survivor set, the site's own
  index among them, ``key-shares-of`` distinct participants that are not survivors (the
  neighbours whose input did not arrive), and one Shamir share of the plan's size for each;
* ``collect``: no entries (its masked vector is an array, :mod:`.egress_arrays`).

Anything else is refused under ``egress.text``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from flwr.app import ConfigRecord

from app.site_runtime.egress_refusal import EgressRefusal
from clients.site.instruction import Instruction
from strategies.wire import message_keys as keys
from strategies.wire.secure_aggregation.crypto import (KEY_BYTES, KeyPair, commitment,
                                                       encrypt_shares, split_secret)
from strategies.wire.secure_aggregation.settings import RoundPlan
from strategies.wire.secure_aggregation.signing import SIGNATURE_BYTES

__all__ = ["check_protocol", "protocol_bound"]

#: Bytes one int of a list takes on the wire at most (a ConfigRecord sint64).
INT_BYTES = 10


@lru_cache(maxsize=1)
def _public_key_bytes() -> int:
    return len(KeyPair().public)


@lru_cache(maxsize=1)
def _commitment_bytes() -> int:
    return len(commitment(bytes(KEY_BYTES)))


@lru_cache(maxsize=32)
def _share_bytes(threshold: int, holders: int) -> int:
    return len(split_secret(bytes(KEY_BYTES), threshold, holders)[0])


@lru_cache(maxsize=32)
def _ciphertext_bytes(share: int) -> int:
    one, other = KeyPair(), KeyPair()
    return len(encrypt_shares(one.private, other.public, 1, 2, bytes(share), bytes(share)))


def _ints(config: Mapping[str, Any], key: str) -> list[int]:
    values = config.get(key, [])
    return [v for v in values if isinstance(v, int)] if isinstance(values, list) else []


def _expected(instruction: Instruction) -> dict[str, tuple[type, int | None, int]]:
    """Per reply key: (kind, the size of each bytes entry or None for ints, the count)."""
    plan: RoundPlan | None = instruction.plan
    stage, config = instruction.secagg_stage, instruction.secagg
    if plan is None or stage == keys.SECAGG_COLLECT:
        return {}
    if stage == keys.SECAGG_SETUP:
        return {keys.SECAGG_KEY_C: (bytes, _public_key_bytes(), 1),
                keys.SECAGG_KEY_S: (bytes, _public_key_bytes(), 1),
                keys.SECAGG_KEY_SIGNATURE: (bytes, SIGNATURE_BYTES, 1)}
    if stage == keys.SECAGG_CONSISTENCY:
        return {keys.SECAGG_SURVIVOR_SIGNATURE: (bytes, SIGNATURE_BYTES, 1)}
    if stage == keys.SECAGG_SHARE_KEYS:
        peers = _ints(config, keys.SECAGG_PEERS)
        share = _share_bytes(plan.threshold, len(peers) + 1)
        return {keys.SECAGG_SHARE_TO: (int, None, len(peers)),
                keys.SECAGG_CIPHERTEXTS: (bytes, _ciphertext_bytes(share), len(peers)),
                keys.SECAGG_COMMITMENT: (bytes, _commitment_bytes(), 1)}
    share = _share_bytes(plan.threshold, plan.neighbours + 1)
    seeds = len(_ints(config, keys.SECAGG_SURVIVORS))
    return {keys.SECAGG_SEED_SHARES_OF: (int, None, seeds),
            keys.SECAGG_SEED_SHARES: (bytes, share, seeds),
            keys.SECAGG_KEY_SHARES_OF: (int, None, plan.neighbours),
            keys.SECAGG_KEY_SHARES: (bytes, share, plan.neighbours)}


def protocol_bound(instruction: Instruction) -> int:
    """The most bytes the stage's protocol entries hold (the egress filter's byte budget)."""
    return sum(count * (INT_BYTES if size is None else size)
               for _, size, count in _expected(instruction).values())


def _refuse(detail: str) -> EgressRefusal:
    return EgressRefusal("egress.text", f"secure aggregation entries: {detail}")


def _sized(record: ConfigRecord, key: str, size: int) -> list[bytes]:
    value = record[key]
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, bytes) and len(v) == size for v in values):
        raise _refuse(f"'{key}' must hold {size}-byte entries")
    return values


def _index_list(record: ConfigRecord, key: str) -> list[int]:
    value = record[key]
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                              for v in value):
        raise _refuse(f"'{key}' must be a list of participant indices")
    return list(value)


def check_protocol(record: ConfigRecord | None, instruction: Instruction) -> None:
    """Check a SecAgg+ stage reply's ``secagg`` record against the stage's instruction.

    Raises
    ------
    EgressRefusal
        ``egress.text``.
    """
    expected = _expected(instruction)
    if record is None:
        if expected:
            raise _refuse(f"the {instruction.secagg_stage} reply lacks them")
        return
    if set(record.keys()) != set(expected):
        raise _refuse(f"the {instruction.secagg_stage} reply must hold exactly "
                      f"{sorted(expected)}")
    for key, (kind, size, _) in expected.items():
        if kind is bytes:
            _sized(record, key, size or 0)
    stage, config, plan = instruction.secagg_stage, instruction.secagg, instruction.plan
    assert plan is not None  # a stage with expected entries has its plan (_expected)
    if stage == keys.SECAGG_SETUP:
        if record[keys.SECAGG_KEY_C] == record[keys.SECAGG_KEY_S]:
            raise _refuse("the two public keys are one")
    elif stage == keys.SECAGG_SHARE_KEYS:
        peers = _index_list(record, keys.SECAGG_SHARE_TO)
        if peers != _ints(config, keys.SECAGG_PEERS) or \
                len(_sized(record, keys.SECAGG_CIPHERTEXTS, expected[keys.SECAGG_CIPHERTEXTS][1]
                           or 0)) != len(peers):
            raise _refuse("one ciphertext for each of the instruction's peers, in its order")
    elif stage == keys.SECAGG_UNMASK:
        seeds = _index_list(record, keys.SECAGG_SEED_SHARES_OF)
        survivors = _ints(config, keys.SECAGG_SURVIVORS)
        dropped = _index_list(record, keys.SECAGG_KEY_SHARES_OF)
        if seeds != sorted(set(seeds)) or plan.index not in seeds or \
                not set(seeds) <= set(survivors):
            raise _refuse("seed shares of other participants than the survivors, or not of "
                          "itself")
        if dropped != sorted(set(dropped)) or set(dropped) & set(seeds) or \
                not all(1 <= j <= plan.participants for j in dropped):
            raise _refuse("key shares of survivors, of itself or of unknown participants")
        if len(record[keys.SECAGG_SEED_SHARES]) != len(seeds) or \
                len(record[keys.SECAGG_KEY_SHARES]) != len(dropped):
            raise _refuse("one share for each participant named")
