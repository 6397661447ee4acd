"""The units of a structure: channel groups that share an array, their sums and their masks."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.plugins.pruning.units import Units, plain_structure
from strategies.wire.pruning_mask import PruningError

# Two convolutions as torch-pruning groups them: a's out-channels (a.weight axis 0, a.bias,
# b.weight's in-channels) and b's out-channels (b.weight axis 0, b.bias). b.weight is covered
# by both groups; head.weight (b's consumer, left out of the groups) by none.
SHAPES = {"a.weight": (3, 1, 2), "a.bias": (3,), "b.weight": (2, 3, 2), "b.bias": (2,),
          "head.weight": (1, 2)}
STRUCTURE = {"mode": "structured", "groups": [
    {"name": "a", "slices": [{"array": "a.weight", "axis": 0, "indices": [0, 1, 2]},
                             {"array": "a.bias", "axis": 0, "indices": [0, 1, 2]},
                             {"array": "b.weight", "axis": 1, "indices": [0, 1, 2]}]},
    {"name": "b", "slices": [{"array": "b.weight", "axis": 0, "indices": [0, 1]},
                             {"array": "b.bias", "axis": 0, "indices": [0, 1]}]}]}


def _units() -> Units:
    return Units(plain_structure(STRUCTURE, "structured"), SHAPES)


def test_units_count_their_coordinates_and_sum_an_array_family():
    units = _units()
    assert units.sizes() == [3, 2]
    assert units.arrays == ["a.weight", "a.bias", "b.weight", "b.bias"]  # model order
    # a's channel: 2 (a.weight) + 1 (a.bias) + 2 x 2 (b.weight's in-channel over b's 2 outs)
    # b's channel: 3 x 2 (b.weight) + 1 (b.bias)
    np.testing.assert_array_equal(units.coordinates()[0], [7, 7, 7])
    np.testing.assert_array_equal(units.coordinates()[1], [7, 7])
    b_weight = np.arange(12.0).reshape(2, 3, 2)
    values = {**{n: np.zeros(s) for n, s in SHAPES.items()}, "b.weight": b_weight}
    sums = units.sums(values)
    np.testing.assert_array_equal(sums[0], [0 + 1 + 6 + 7, 2 + 3 + 8 + 9, 4 + 5 + 10 + 11])
    np.testing.assert_array_equal(sums[1], [15, 51])
    assert set(units.covered()) == set(units.arrays) and all(c.all()
                                                             for c in units.covered().values())


def test_a_shared_coordinate_is_kept_only_when_every_unit_covering_it_is():
    units = _units()
    kept = [np.array([True, False, True]), np.array([False, True])]
    masks = units.masks(kept)
    assert set(masks) == {"a.weight", "a.bias", "b.weight", "b.bias"}
    np.testing.assert_array_equal(masks["a.bias"], [1, 0, 1])
    np.testing.assert_array_equal(masks["b.bias"], [0, 1])
    expected = np.zeros((2, 3, 2), bool)
    expected[1, [0, 2], :] = True  # b's out-channel 1 x a's in-channels 0 and 2
    np.testing.assert_array_equal(masks["b.weight"], expected)
    back = units.kept(masks)
    for got, want in zip(back, kept):
        np.testing.assert_array_equal(got, want)


def test_a_group_over_a_missing_array_or_of_uneven_slices_is_refused():
    with pytest.raises(PruningError, match="group 'a': array 'a.weight' is not in the model"):
        Units(plain_structure(STRUCTURE, "structured"), {"a.bias": (3,)})
    uneven = {"mode": "structured", "groups": [{"name": "a", "slices": [
        {"array": "a.weight", "axis": 0, "indices": [0, 1, 2]},
        {"array": "a.bias", "axis": 0, "indices": [0, 1]}]}]}
    with pytest.raises(PruningError, match="group 'a': needs slices with the same"):
        Units(plain_structure(uneven, "structured"), SHAPES)
    with pytest.raises(PruningError, match="group 'a': malformed"):
        plain_structure({"mode": "structured", "groups": [{"name": "a"}]}, "structured")
