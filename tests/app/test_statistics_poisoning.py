"""A site cannot poison the global model's normalisation statistics or its counters (issue #29,
found 3), through the product's own strategy (``build_strategy``, the default run config: FedAvg
behind norm-bound) on the in-process engine, with a real BatchNorm network's state-dict names.

The honest sites' update: every float array ``-0.01`` (``x_local = x_global + 0.01``), each
``running_var`` lowered by 0.1 and each ``num_batches_tracked`` advanced by tau, the planned
local steps (an honest update is ``-tau`` there).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from app.config.run_config import RunConfig
from app.engine import InProcessGrid, VirtualSite
from app.server_app import build_strategy
from models.small_cnn import SmallCNN
from tests.fixtures.scripted_site import ScriptedSite

pytestmark = pytest.mark.usefixtures("server_identity")  # run 42, the SuperLink's node 1

TAU = 5
INT64_MIN = np.iinfo(np.int64).min


def _model() -> SmallCNN:
    torch.manual_seed(0)
    return SmallCNN((4, 8), norm="bn", image_size=8)


def _names() -> list[str]:
    return list(_model().state_dict())


def _honest(weights: list[np.ndarray]) -> list[np.ndarray]:
    delta = []
    for name, array in zip(_names(), weights):
        if name.endswith("running_var"):
            delta.append(np.full_like(array, 0.1))
        elif name.endswith("num_batches_tracked"):
            delta.append(np.array(-TAU, array.dtype))
        else:
            delta.append(np.full_like(array, -0.01))
    return delta


def _poisoned_var(weights: list[np.ndarray]) -> list[np.ndarray]:
    """Honest but for the first ``running_var``'s entry 0, lowered by 4 (a small update:
    the norm bound does not clip it); with two sites the mean takes it to 1 - 2.05 < 0."""
    delta = _honest(weights)
    first = next(j for j, name in enumerate(_names()) if name.endswith("running_var"))
    delta[first] = delta[first].copy()
    delta[first][0] = 4.0
    return delta


def _min_counter(weights: list[np.ndarray]) -> list[np.ndarray]:
    """Honest but every ``num_batches_tracked`` update is int64's minimum."""
    return [np.array(INT64_MIN, np.int64) if name.endswith("num_batches_tracked") else array
            for name, array in zip(_names(), _honest(weights))]


def _round(attack, sites: int = 2, updates=(), **run_config):
    """One round of the default strategy (``run_config`` overrides), site-0 replying with
    ``attack``'s update, or site ``i`` with ``updates[i]``, the others honest."""
    updates = list(updates) or [attack] + [_honest] * (sites - 1)
    handlers = [ScriptedSite(f"site-{i}", delta=update, num_examples=10)
                for i, update in enumerate(updates)]
    grid = InProcessGrid([VirtualSite({"site-name": h.name}, h) for h in handlers], run_id=42)
    config = RunConfig.from_mapping({"min-nodes": len(updates), "node-wait-timeout": 5,
                                     "local-steps": TAU, **run_config})
    strategy = build_strategy(config)
    initial = ArrayRecord(_model().state_dict())
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=1)
    return (dict(zip(_names(), initial.to_numpy_ndarrays())),
            dict(zip(_names(), result.arrays.to_numpy_ndarrays())), strategy.reports[1])


def _eval_output(arrays: dict[str, np.ndarray]) -> torch.Tensor:
    model = _model()
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})
    model.eval()
    with torch.no_grad():
        return model(torch.linspace(-1, 1, 64).reshape(1, 1, 8, 8))


def test_a_poisoned_running_var_is_refused_with_two_sites():
    """The poisoned reply would make its own variance -3: no honest site sends that, so it is
    refused whole (the mean of two used to take the global entry below 0 and the model to NaN)."""
    before, after, report = _round(_poisoned_var)
    var = after["features.1.running_var"]
    assert (var >= 0).all()
    assert "normalisation statistics rule" in report.train_dropped["site-0"]
    assert "'features.1.running_var' negative" in report.train_dropped["site-0"]
    np.testing.assert_allclose(var, before["features.1.running_var"] - 0.1, rtol=1e-6)
    assert torch.isfinite(_eval_output(after)).all()
    assert (after["features.0.weight"] > before["features.0.weight"]).all()  # the honest update


def test_no_defence_also_refuses_a_reply_that_makes_a_variance_negative():
    _, after, report = _round(_poisoned_var, **{"strategy.defence": "none"})
    assert "normalisation statistics rule" in report.train_dropped["site-0"]
    assert (after["features.1.running_var"] >= 0).all()


def test_statistics_are_the_sites_median_when_a_defence_is_on():
    before, after, report = _round(_poisoned_var, sites=3)
    name = "features.1.running_var"
    np.testing.assert_allclose(after[name], before[name] - 0.1, rtol=1e-6)
    assert report.strategy["statistics-repaired"] == 0.0


def _shifted(shift: float):
    """An update whose weights are ``shift`` from the honest ones' and whose variances
    are all lowered by 0.5 (a Krum outlier by its weights)."""
    def delta(weights: list[np.ndarray]) -> list[np.ndarray]:
        out = []
        for name, array in zip(_names(), _honest(weights)):
            if name.endswith("running_var"):
                out.append(np.full_like(array, 0.5))
            elif array.dtype.kind == "f" and not name.endswith("running_mean"):
                out.append(array + np.float32(shift))
            else:
                out.append(array)
        return out
    return delta


def test_the_median_is_over_the_replies_the_defence_kept():
    """Multi-Krum (f = 1) keeps the three honest sites of six; three outliers' variances
    (0.5 lower) would make the median over all six 0.3 lower, not 0.1."""
    updates = [_honest] * 3 + [_shifted(1.0), _shifted(-1.0), _shifted(2.0)]
    before, after, report = _round(None, updates=updates, **{
        "strategy.defence": "multi-krum", "multi-krum.f": 1, "multi-krum.m": 3})
    assert [report.strategy[f"krum-selected/site-{i}"] for i in range(6)] == [1, 1, 1, 0, 0, 0]
    np.testing.assert_allclose(after["features.1.running_var"],
                               before["features.1.running_var"] - 0.1, rtol=1e-6)


def test_an_int64_min_counter_update_advances_the_counter_by_tau_at_most():
    before, after, report = _round(_min_counter)
    for name in _names():
        if name.endswith("num_batches_tracked"):
            assert after[name] == before[name] + TAU
    assert report.strategy["counters-bounded"] == 2.0
    assert torch.isfinite(_eval_output(after)).all()


def _large_statistics(weights: list[np.ndarray]) -> list[np.ndarray]:
    """Honest weights (-0.01) with a large variance update (-3 per entry: a fresh model's
    variances moving towards the data's), the norm that dominated the defence's bound."""
    return [np.full_like(array, -3.0) if name.endswith("running_var") else array
            for name, array in zip(_names(), _honest(weights))]


def _boosted(weights: list[np.ndarray]) -> list[np.ndarray]:
    """``_large_statistics`` with its learnt weights x1000 (the statistics as they are)."""
    return [array * 1000 if not name.endswith(("running_var", "running_mean",
                                                "num_batches_tracked")) else array
            for name, array in zip(_names(), _large_statistics(weights))]


def test_the_defence_bounds_the_learnt_weights_not_a_norm_the_statistics_inflate():
    """Counted in the norm, honest variance updates raised the bound 3 x median so far that a
    x1000 update's weights still moved 12x the honest ones at 3 sites (attack table, #29)."""
    before, after, report = _round(None, updates=[_boosted] + [_large_statistics] * 2)
    weight = next(name for name in _names() if name.endswith("weight"))
    moved = float(np.max(np.abs(after[weight] - before[weight])))
    assert report.strategy["clip-factor/site-0"] < 0.01
    assert moved <= 0.01 * (1 + 3 + 1) / 3 + 1e-6  # the bad update clipped to 3x an honest one
    var = next(name for name in _names() if name.endswith("running_var"))
    np.testing.assert_allclose(after[var], before[var] + 3.0, rtol=1e-6)  # the sites' median
