"""PruneFL's initial and adaptive pruning, against hand computations of the paper's criterion."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.plugins.pruning.prunefl import PruneFL
from strategies.wire.pruning_mask import PruningError

# A tiny unstructured model: w1 (2x3) and w2 (3x1) are prunable, b1 (1-D) is no unit.
UNSTRUCTURED = {"mode": "unstructured", "groups": [{"name": "w1", "array": "w1"},
                                                   {"name": "w2", "array": "w2"}]}
# Its current global model: zeros at the pruned coordinates w1[0,1], w1[1,0], w2[1].
MODEL = {"w1": np.array([[0.9, 0.0, 0.5], [0.0, 0.8, -0.3]], np.float32),
         "b1": np.array([0.1, 0.2, 0.3], np.float32),
         "w2": np.array([[0.7], [0.0], [-0.2]], np.float32)}
MASK = {"w1": np.array([[1, 0, 1], [0, 1, 1]], bool), "w2": np.array([[1], [0], [1]], bool)}
SQGRAD = {"w1": np.array([[4.0, 3.0, 0.5], [1.0, 2.0, 0.2]]),
          "b1": np.array([0.3, 0.1, 0.1]),
          "w2": np.array([[1.0], [0.6], [0.05]])}


def _pruned(**options) -> PruneFL:
    """PruneFL at version 1 with MASK over the tiny model (as after an initial pruning)."""
    pruning = PruneFL(**{"time_constant": 1.0, "time_per_weight": 0.1, "decrease_fraction": 0.5,
                         "interval": 1, **options})
    pruning.initialise(MODEL, UNSTRUCTURED)
    pruning.masks = {name: mask.copy() for name, mask in MASK.items()}
    return pruning


def test_reprune_matches_the_hand_computation_of_the_criterion():
    # Units cost t = 0.1 each (one weight); v_u = g^2, ratio v_u / c_u = 10 g^2.
    # w1 keeps 4 units: floor(0.5 * 4) = 2 of smallest |w| are candidates: w1[1,2] (0.3),
    # w1[0,2] (0.5); w1[0,0] (0.9) and w1[1,1] (0.8) stay. w2 keeps 2: floor(0.5 * 2) = 1,
    # w2[2] (0.2) is a candidate, w2[0] stays. Pruned units w1[0,1], w1[1,0], w2[1] are candidates.
    # N = 4.0 + 2.0 + 1.0 (staying) + 0.5 (b1, in no unit) = 7.5
    # D = 1.0 (c) + 0.1 * 3 (staying) + 0.1 * 3 (b1) = 1.6           N / D = 4.6875
    # Candidates by ratio: w1[0,1] 30, w1[1,0] 10, w2[1] 6, w1[0,2] 5, w1[1,2] 2, w2[2] 0.5
    #   w1[0,1]: 30 > 4.6875 -> add; N = 10.5, D = 1.7, N / D = 6.17647
    #   w1[1,0]: 10 > 6.17647 -> add; N = 11.5, D = 1.8, N / D = 6.38889
    #   w2[1]:    6 < 6.38889 -> stop: it and every later candidate are pruned.
    pruning = _pruned()
    info = pruning.observe(1, MODEL, SQGRAD, seconds=0.0)
    np.testing.assert_array_equal(pruning.masks["w1"], [[1, 1, 0], [1, 1, 0]])
    np.testing.assert_array_equal(pruning.masks["w2"], [[1], [0], [0]])
    assert "b1" not in pruning.masks
    assert info["pruning-objective"] == pytest.approx(11.5 / 1.8)
    assert info["pruning-added"] == 2 and info["pruning-removed"] == 3
    assert info["pruning-version"] == 2 and pruning.version == 2
    assert info["pruning-params-kept"] == 4 + 1 + 3  # w1, w2 and the whole of b1
    assert info["pruning-density"] == pytest.approx(5 / 9)


def test_the_density_cap_stops_the_additions():
    # Cost of all units: 0.1 * 9 = 0.9; cap 0.5 -> 0.45; staying units cost 0.3, so 0.15 is
    # left: w1[0,1] (0.1) fits, w1[1,0] would bring the added cost to 0.2 > 0.15.
    pruning = _pruned(max_density=0.5)
    info = pruning.observe(1, MODEL, SQGRAD, seconds=0.0)
    np.testing.assert_array_equal(pruning.masks["w1"], [[1, 1, 0], [0, 1, 0]])
    np.testing.assert_array_equal(pruning.masks["w2"], [[1], [0], [0]])
    # N = 7.5 + 3.0 = 10.5, D = 1.6 + 0.1 = 1.7
    assert info["pruning-objective"] == pytest.approx(10.5 / 1.7)


# One structured group of 3 channels over two arrays: row k of conv.weight (3x2) and
# column k of next.weight (2x3): each unit has 4 coordinates.
STRUCTURED = {"mode": "structured", "groups": [{"name": "conv", "slices": [
    {"array": "conv.weight", "axis": 0, "indices": [0, 1, 2]},
    {"array": "next.weight", "axis": 1, "indices": [0, 1, 2]}]}]}


def test_structured_reprune_matches_the_hand_computation():
    model = {"conv.weight": np.array([[3.0, 1.0], [0.5, 0.5], [0.0, 0.0]]),
             "next.weight": np.array([[1.0, 0.5, 0.0], [1.0, 0.5, 0.0]])}
    sqgrad = {"conv.weight": np.array([[1.0, 1.0], [0.2, 0.1], [2.0, 1.0]]),
              "next.weight": np.array([[1.0, 0.1, 0.5], [1.0, 0.1, 0.5]])}
    pruning = PruneFL(mode="structured", initial_density=0.6, decrease_fraction=0.5,
                      time_per_weight=0.25, time_constant=2.0, interval=2)
    # Initial: RMS magnitudes ch0 sqrt(12 / 4) = 1.73, ch1 sqrt(1 / 4) = 0.5, ch2 0;
    # keep round(0.6 * 3) = 2: ch0 and ch1.
    pruning.initialise(model, STRUCTURED)
    np.testing.assert_array_equal(pruning.masks["conv.weight"], [[1, 1], [1, 1], [0, 0]])
    np.testing.assert_array_equal(pruning.masks["next.weight"], [[1, 1, 0], [1, 1, 0]])
    # Re-pruning: floor(0.5 * 2) = 1 candidate among the kept: ch1 (smallest RMS); ch0 stays.
    # v = ch0 1 + 1 + 1 + 1 = 4, ch1 0.2 + 0.1 + 0.1 + 0.1 = 0.5, ch2 2 + 1 + 0.5 + 0.5 = 4;
    # c_u = 0.25 * 4 = 1.  N = 4, D = 2 + 1 = 3, N / D = 1.333
    #   ch2: 4 / 1 = 4 > 1.333 -> add; N = 8, D = 4, N / D = 2
    #   ch1: 0.5 / 1 = 0.5 < 2 -> stop; ch1 is pruned.
    assert pruning.observe(1, model, sqgrad, 0.0)["pruning-version"] == 1  # not due (interval 2)
    info = pruning.observe(2, model, sqgrad, 0.0)
    np.testing.assert_array_equal(pruning.masks["conv.weight"], [[1, 1], [0, 0], [1, 1]])
    np.testing.assert_array_equal(pruning.masks["next.weight"], [[1, 0, 1], [1, 0, 1]])
    assert info["pruning-objective"] == pytest.approx(2.0)
    assert info["pruning-added"] == 1 and info["pruning-removed"] == 1 and pruning.version == 2


def test_initial_pruning_keeps_the_largest_magnitudes_and_one_unit_per_group_at_least():
    model = {"w1": np.array([[0.1, -0.9, 0.3], [0.5, -0.2, 0.05]]), "b1": np.ones(3),
             "w2": np.array([[0.2], [-0.4], [0.1]])}
    pruning = PruneFL(initial_density=0.4)  # w1: round(2.4) = 2 units, w2: round(1.2) = 1
    info = pruning.initialise(model, UNSTRUCTURED)
    np.testing.assert_array_equal(pruning.masks["w1"], [[0, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(pruning.masks["w2"], [[0], [1], [0]])
    assert pruning.version == 1 and info["pruning-params-kept"] == 2 + 1 + 3
    sparse = PruneFL(initial_density=0.1)  # w1: round(0.6) = 1, w2: round(0.3) = 0 -> 1
    sparse.initialise(model, UNSTRUCTURED)
    assert sparse.masks["w1"].sum() == 1 and sparse.masks["w2"].sum() == 1
    dense = PruneFL(initial_density=1.0)
    dense.initialise(model, UNSTRUCTURED)
    assert dense.version == 1 and all(m.all() for m in dense.masks.values())


def test_initialise_is_a_no_op_on_a_resumed_run():
    pruning = _pruned()
    pruning.observe(1, MODEL, SQGRAD, 0.0)
    masks, version = {n: m.copy() for n, m in pruning.masks.items()}, pruning.version
    pruning.initialise({n: np.ones_like(a) for n, a in MODEL.items()}, UNSTRUCTURED)
    assert pruning.version == version
    for name, mask in masks.items():
        np.testing.assert_array_equal(pruning.masks[name], mask)


def test_the_structure_must_fit_the_mode_and_the_model():
    with pytest.raises(PruningError, match="'pruning.mode' = 'structured'"):
        PruneFL(mode="structured").initialise(MODEL, UNSTRUCTURED)
    bad = {"mode": "structured", "groups": [{"name": "conv", "slices": [
        {"array": "conv.weight", "axis": 0, "indices": [0, 5]}]}]}
    with pytest.raises(PruningError, match="group 'conv'.*out of range of array 'conv.weight'"):
        PruneFL(mode="structured").initialise({"conv.weight": np.ones((3, 2))}, bad)
    with pytest.raises(PruningError, match="array 'w3' is not in the model"):
        PruneFL().initialise(MODEL, {"mode": "unstructured",
                                     "groups": [{"name": "w3", "array": "w3"}]})


@pytest.mark.parametrize(("interval", "stop", "due"), [
    (1, 0, [1, 2, 3, 4, 5, 6]), (2, 0, [2, 4, 6]), (2, 4, [2, 4]), (0, 0, [])])
def test_report_due_every_interval_up_to_the_stop_round(interval, stop, due):
    pruning = PruneFL(interval=interval, stop_round=stop)
    assert [r for r in range(1, 7) if pruning.report_due(r)] == due


def test_no_reprune_without_squared_gradients_nor_after_the_stop_round():
    pruning = _pruned(stop_round=1)
    assert "pruning-objective" not in pruning.observe(1, MODEL, None, 0.0)
    assert "pruning-objective" not in pruning.observe(2, MODEL, SQGRAD, 0.0)
    assert pruning.version == 1
    for name, mask in MASK.items():
        np.testing.assert_array_equal(pruning.masks[name], mask)


def test_the_version_grows_only_when_the_mask_changes():
    # No candidate for removal (fraction 0) and no gradient on the pruned units: nothing moves.
    pruning = _pruned(decrease_fraction=0.0)
    sqgrad = {n: np.where(MASK[n], g, 0.0) if n in MASK else g for n, g in SQGRAD.items()}
    info = pruning.observe(1, MODEL, sqgrad, 0.0)
    assert info["pruning-added"] == 0 and info["pruning-removed"] == 0
    assert pruning.version == 1
    pruning.observe(2, MODEL, SQGRAD, 0.0)  # w1[0,1] and w1[1,0] come back
    assert pruning.version == 2


def test_observe_before_initialise_and_a_wrong_sqgrad_shape_are_refused():
    with pytest.raises(PruningError, match="before initialise"):
        PruneFL().observe(1, MODEL, None, 0.0)
    with pytest.raises(PruningError, match="squared gradients of array 'w2'"):
        _pruned().observe(1, MODEL, {**SQGRAD, "w2": np.ones(3)}, 0.0)


def test_measured_time_fits_the_line_through_the_rounds():
    # seconds = 2 + 0.5 x kept: round 1 runs at MASK (9 kept: 4 + 2 + b1's 3), round 2 at
    # the re-pruned mask.
    pruning = _pruned(measure_time=True)
    first = pruning.observe(1, MODEL, SQGRAD, seconds=2.0 + 0.5 * 9)
    assert first["pruning-time-per-weight"] == 0.1  # one size seen: the stated costs
    kept = first["pruning-params-kept"]  # 8, after the re-pruning
    second = pruning.observe(2, MODEL, None, seconds=2.0 + 0.5 * kept)
    assert second["pruning-time-constant"] == pytest.approx(2.0)
    assert second["pruning-time-per-weight"] == pytest.approx(0.5)
    for r in range(3, 63):
        pruning.observe(r, MODEL, None, seconds=1.0)
    assert len(pruning.history) == 50  # bounded
    # Time falling with size: t clipped to 1e-12, c to >= 0.
    pruning.history = [[8.0, 1.0], [10.0, 0.5]]
    c, t = pruning.time_costs()
    assert t == 1e-12 and c >= 0.0
