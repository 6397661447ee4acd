"""The seed of a site's local training in a round: one formula for every caller.

The round's training (:mod:`app.client_app`) and the personalisation's adaptation
steps (:mod:`app.personalisation`, and ``make predict`` repeating them) must derive
the same seed from the same run seed, round and key, so it lives here once.
"""

from __future__ import annotations

import zlib

__all__ = ["site_seed"]


def site_seed(run_seed: int, server_round: int, key: str) -> int:
    """``(run_seed * 1_000_003 + server_round * 7_919 + crc32(key)) mod 2**31``."""
    return (run_seed * 1_000_003 + server_round * 7_919 + zlib.crc32(key.encode())) % 2**31
