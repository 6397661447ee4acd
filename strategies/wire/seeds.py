"""Every seed the product derives, in one module: the site's training, the codecs, the data.

Two formulas, each kept to the values it has always given (checkpoints, logged
runs and benchmark figures depend on them):

* :func:`derive_seed` (and its narrower views :func:`round_seed`,
  :func:`hospital_seed`): ``numpy.random.SeedSequence`` over nonnegative
  integers, stable across numpy versions; 64 bits for the codecs, the low 31 or
  32 of the same state for ``torch.manual_seed`` / ``numpy.random.default_rng``
  (``generate_state(1, uint64)``'s low word is ``generate_state(1)``'s);
* :func:`site_seed`: a site's local training in a round, keyed by a string
  (the site's name), so the server and the site need share no index.

Pure python and numpy: the sites (:mod:`clients`), the strategy and the
benchmarks import it alike.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from numbers import Integral

import numpy as np

from strategies.wire.errors import ConfigError

__all__ = ["derive_seed", "hospital_seed", "round_seed", "site_seed"]

_LOW_31 = 0x7FFF_FFFF
_LOW_32 = 0xFFFF_FFFF


def derive_seed(base: int, *keys: int) -> int:
    """A 64-bit seed from a run seed and integer keys: ``SeedSequence([base, *keys])``.

    Both ends of a message compute it independently, e.g. the codec seed
    ``derive_seed(run_seed, server_round, node_id)``, so that ``randk`` picks
    fresh coordinates (and ``qsgd`` fresh rounding) every round and site.

    Parameters
    ----------
    base : int
        Nonnegative run seed.
    *keys : int
        Nonnegative integers (round number, node id, ...).

    Returns
    -------
    int
        A seed in ``[0, 2**64)``.

    Raises
    ------
    ConfigError
        If a part is not a nonnegative int.
    """
    parts = [base, *keys]
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, Integral) or int(part) < 0:
            raise ConfigError(f"derive_seed expects nonnegative ints, got {part!r}")
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(1, np.uint64)
    return int(state[0])


def round_seed(seed: int, round_index: int, site: int, *salt: int) -> int:
    """Seed in ``[0, 2**31)`` of site ``site``'s local training in round ``round_index``.

    The low 31 bits of ``derive_seed(seed, round_index, site, *salt)``: a
    function of (seed, round, site) only, so every method or codec a benchmark
    compares draws the same mini-batches.
    """
    return derive_seed(seed, round_index, site, *salt) & _LOW_31


def hospital_seed(seed: int, index: int, salt: Sequence[int] = ()) -> int:
    """Seed of synthetic hospital ``index`` of a federation seeded with ``seed`` (32 bits).

    The low 32 bits of ``derive_seed(seed, index, *salt)``, i.e.
    ``SeedSequence([seed, index, *salt]).generate_state(1)[0]``.
    """
    return derive_seed(seed, index, *salt) & _LOW_32


def site_seed(run_seed: int, server_round: int, key: str) -> int:
    """``(run_seed * 1_000_003 + server_round * 7_919 + crc32(key)) mod 2**31``.

    The seed of a site's local training in a round (``key`` = its name) and of
    its personalisation's adaptation steps (``key`` = ``adapt:<name>``, which
    ``make predict PERSONAL=...`` repeats to get the same model).
    """
    return (run_seed * 1_000_003 + server_round * 7_919 + zlib.crc32(key.encode())) % 2**31
