"""The run's ``secagg.*`` settings and one round's plan as each site is told it.

The modulus: each site sends ``b``-bit integers (stochastic rounding of a coordinate
clipped to ``[-clip, clip]``); the sum of ``n`` of them needs
``ceil(log2(n (2^b - 1) + 1))`` bits, so arithmetic is in ``Z_m`` with ``m`` that power
of two and the unmasked sum is exact (no wrap-around).

The threshold: a site splits each secret into ``k + 1`` Shamir shares, one for each of
its ``k`` neighbours and one it keeps (as Flower's SecAgg+ does), any ``t`` of which
rebuild it. ``t > (k + 1) / 2`` always: a coordinator that tells some holders "it
dropped" and the others "it survived" then never gets ``t`` shares of both the
self-mask seed and the mask key of one site (Bell et al. 2020, section 3.2). The
share a site keeps lets three sites survive one drop-out after the masked inputs
(``k = 2``, ``t = 2`` of 3 holders).

Example
-------
>>> plan = RoundPlan(server_round=1, index=1, participants=10, neighbours=8,
...                  threshold=5, bits=20, clip=1.0)
>>> plan.modulus_bits
24
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strategies.wire import message_keys as keys
from strategies.wire.secure_aggregation.errors import SecAggConfigError, SecAggError

__all__ = ["MAX_BITS", "RoundPlan", "SecAggSettings", "modulus_bits", "neighbour_count",
           "threshold_of"]

#: The largest ``secagg.bits``: quantised values are int32 before the sum.
MAX_BITS = 30


def modulus_bits(participants: int, bits: int) -> int:
    """``ceil(log2(n (2^b - 1) + 1))``: the bits of ``m`` for a sum of ``n`` ``b``-bit values."""
    return max(1, (participants * ((1 << bits) - 1)).bit_length())


def neighbour_count(participants: int, requested: int = 0) -> int:
    """The degree ``k`` of the neighbour graph over ``participants`` sites.

    ``requested`` (``secagg.neighbours``) when > 0, else ``6 ceil(log2 n)`` (of order
    ``log n``, Bell et al. 2020, Theorem 3.6; the constant keeps ``t`` holders of a
    site's shares alive when 30% of the sites drop out), rounded up to even (a
    circulant graph); never more than ``n - 1`` (then: every other site).
    """
    if participants < 2:
        return 0
    k = requested if requested > 0 else 6 * math.ceil(math.log2(participants))
    k += k % 2
    return min(k, participants - 1)


def threshold_of(neighbours: int, fraction: float) -> int:
    """``t = max(floor(h / 2) + 1, ceil(fraction h))`` of the ``h = k + 1`` holders of a
    site's shares (its ``k`` neighbours and itself), never above ``h``."""
    holders = neighbours + 1
    return min(holders, max(holders // 2 + 1, math.ceil(fraction * holders - 1e-9)))


@dataclass(frozen=True)
class SecAggSettings:
    """The run config's ``secagg.*`` section.

    Attributes
    ----------
    clip : float
        ``secagg.clip``: each coordinate of a site's weighted update is clipped to
        ``[-clip, clip]`` at the site (what one malicious site can add, at most).
    bits : int
        ``secagg.bits``: ``b``, the precision of one coordinate (2..30).
    neighbours : int
        ``secagg.neighbours``: ``k``; 0: :func:`neighbour_count`'s ``6 ceil(log2 n)``.
    threshold : float
        ``secagg.threshold``: ``t`` as a fraction of the ``k + 1`` holders of a site's
        shares (:func:`threshold_of`).
    min_participants : int
        ``secagg.min-participants``: the coordinator unmasks no sum of fewer inputs.
    """

    clip: float = 1.0
    bits: int = 20
    neighbours: int = 0
    threshold: float = 0.5
    min_participants: int = 2

    def check(self) -> SecAggSettings:
        """Return ``self``; raise :class:`SecAggConfigError` naming a key out of range."""
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise SecAggConfigError(f"secagg.clip must be finite and > 0, got {self.clip!r}")
        if not 2 <= self.bits <= MAX_BITS:
            raise SecAggConfigError(f"secagg.bits must be in [2, {MAX_BITS}], got {self.bits!r}")
        if self.neighbours < 0 or self.neighbours == 1:
            raise SecAggConfigError(
                f"secagg.neighbours must be 0 (auto) or >= 2, got {self.neighbours!r}")
        if not 0.5 <= self.threshold <= 1.0:
            raise SecAggConfigError(
                f"secagg.threshold must be in [0.5, 1], got {self.threshold!r}")
        if self.min_participants < 2:
            raise SecAggConfigError(
                f"secagg.min-participants must be >= 2, got {self.min_participants!r}")
        return self

    def plan(self, server_round: int, index: int, participants: int) -> RoundPlan:
        """Site ``index``'s plan of a round among ``participants`` sites."""
        k = neighbour_count(participants, self.neighbours)
        return RoundPlan(server_round, index, participants, k,
                         threshold_of(k, self.threshold), self.bits, self.clip)


def _entry(config: Mapping[str, Any], key: str, kind: type) -> Any:
    if key not in config:
        raise SecAggError(f"secure aggregation entry {key!r} is missing")
    value = config[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise SecAggError(f"secure aggregation entry {key!r} = {value!r} is not an int")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise SecAggError(f"secure aggregation entry {key!r} = {value!r} is not a number")
    return kind(value)


@dataclass(frozen=True)
class RoundPlan:
    """One round's protocol parameters as one site is told them (every stage's config).

    Attributes
    ----------
    server_round, index, participants : int
        The round, the site's index ``1..n``, ``n``.
    neighbours, threshold : int
        ``k`` and ``t`` of the round (``t`` of the ``k + 1`` holders of a site's shares).
    bits : int
        ``b``.
    clip : float
        The coordinate bound.
    """

    server_round: int
    index: int
    participants: int
    neighbours: int
    threshold: int
    bits: int
    clip: float

    def __post_init__(self) -> None:
        if not 1 <= self.index <= self.participants:
            raise SecAggError(f"{keys.SECAGG_INDEX} {self.index} is not in "
                              f"1..{keys.SECAGG_PARTICIPANTS} ({self.participants})")
        if not 1 <= self.neighbours < self.participants:
            raise SecAggError(f"{keys.SECAGG_NEIGHBOURS} {self.neighbours} is not in "
                              f"1..{self.participants - 1}")
        holders = self.neighbours + 1
        if not (2 * self.threshold > holders and self.threshold <= holders):
            raise SecAggError(f"{keys.SECAGG_THRESHOLD} {self.threshold} is not in "
                              f"({holders / 2:g}, {holders}]: more than half of the holders "
                              "of a site's shares (its neighbours and itself) must be needed "
                              "to rebuild a secret")
        if not 2 <= self.bits <= MAX_BITS:
            raise SecAggError(f"{keys.SECAGG_BITS} {self.bits} is not in [2, {MAX_BITS}]")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise SecAggError(f"{keys.SECAGG_CLIP} {self.clip!r} is not finite and > 0")

    @property
    def modulus_bits(self) -> int:
        """Bits of the modulus ``m`` (:func:`modulus_bits`)."""
        return modulus_bits(self.participants, self.bits)

    def entries(self) -> dict[str, int | float]:
        """The plan as config entries (:mod:`strategies.wire.message_keys`)."""
        return {keys.SERVER_ROUND: self.server_round, keys.SECAGG_INDEX: self.index,
                keys.SECAGG_PARTICIPANTS: self.participants,
                keys.SECAGG_NEIGHBOURS: self.neighbours,
                keys.SECAGG_THRESHOLD: self.threshold, keys.SECAGG_BITS: self.bits,
                keys.SECAGG_CLIP: float(self.clip)}

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> RoundPlan:
        """The plan in a stage's ``config``; :class:`SecAggError` names a missing or bad entry."""
        return cls(_entry(config, keys.SERVER_ROUND, int), _entry(config, keys.SECAGG_INDEX, int),
                   _entry(config, keys.SECAGG_PARTICIPANTS, int),
                   _entry(config, keys.SECAGG_NEIGHBOURS, int),
                   _entry(config, keys.SECAGG_THRESHOLD, int), _entry(config, keys.SECAGG_BITS, int),
                   _entry(config, keys.SECAGG_CLIP, float))
