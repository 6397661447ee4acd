"""Seeds of local training per (round, site), the same for every method or codec compared.

A benchmark compares aggregation rules or codecs on the *same* local work:
site ``i`` in round ``r`` draws the same mini-batches whatever is compared, so
differences come from the rule, not from the batches. The seed is a function
of ``(seed, round, site)`` only (plus a benchmark's own salt), through
``numpy.random.SeedSequence`` (stable across numpy versions), kept to 31 bits
for ``torch.manual_seed`` and ``numpy.random.default_rng`` alike.
"""

from __future__ import annotations

import numpy as np

__all__ = ["round_seed"]


def round_seed(seed: int, round_index: int, site: int, *salt: int) -> int:
    """Seed in ``[0, 2**31)`` of site ``site``'s local training in round ``round_index``."""
    state = np.random.SeedSequence([seed, round_index, site, *salt]).generate_state(1)[0]
    return int(state & 0x7FFFFFFF)
