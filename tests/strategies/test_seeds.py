"""The one seed module gives every seed the values its former copies gave.

The figures are the values of the formulas as they stood in app/site_seed.py,
strategies/wire/codecs/vectors.py (derive_seed), clients/datagen/federation.py
(hospital_seed) and bench/round_seeds.py before they became one module:
checkpoints, synthetic data and benchmark runs depend on them.
"""

from __future__ import annotations

import pytest

from strategies.compression import derive_seed as codec_seed
from strategies.wire.errors import ConfigError
from strategies.wire.seeds import derive_seed, hospital_seed, round_seed, site_seed


def test_each_formula_keeps_its_values():
    assert derive_seed(7, 3, 11) == 17205951393823839645
    assert round_seed(7, 3, 11) == 864146845
    assert hospital_seed(2026, 4) == 454587822
    assert hospital_seed(2026, 4, salt=(5,)) == 2882994217
    assert site_seed(0, 3, "hospital-01") == 556835070


def test_narrow_seeds_are_the_low_bits_of_the_wide_one():
    wide = derive_seed(2026, 4, 5)
    assert hospital_seed(2026, 4, (5,)) == wide & 0xFFFF_FFFF
    assert round_seed(2026, 4, 5) == wide & 0x7FFF_FFFF < 2**31


def test_the_codecs_use_the_same_function_and_refuse_negative_keys():
    assert codec_seed is derive_seed
    with pytest.raises(ConfigError, match="nonnegative ints"):
        derive_seed(1, -2)
    assert site_seed(1, 2, "a") != site_seed(1, 2, "adapt:a")
