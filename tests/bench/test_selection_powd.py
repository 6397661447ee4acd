"""Tests of ``bench/selection_powd.py``: the label-skewed split and one selection round.

Synthetic random 28x28 images (no real data needed). The split must be a
partition of the indices into the requested number of sites; one round with
the shipped ``pow-d`` selector must query exactly ``d`` candidates (forward
passes = their data sizes), train exactly the ``m`` candidates with the highest
loss of the global model (losses recomputed here independently) and apply
``x - fedavg_delta`` of those sites' updates.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import selection_federation as bench
import selection_powd
from clients.datagen.partitions import dirichlet_label_partition
from model_arrays import load_arrays
from strategies.aggregation import fedavg_delta
from strategies.plugins.registries import SELECTORS

NUM_SITES, M, D = 8, 2, 4


def _labels(n: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, n)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_site_split_is_the_product_dirichlet_partition_of_the_seed(seed):
    labels = _labels(2428, seed)
    cfg = selection_powd.CONFIG
    split = selection_powd.site_split(labels, cfg, seed)
    assert len(split) == cfg["num_sites"]
    np.testing.assert_array_equal(np.sort(np.concatenate(split)), np.arange(labels.size))
    assert min(len(s) for s in split) >= cfg["min_site_examples"]
    want = dirichlet_label_partition(labels, cfg["num_sites"], cfg["alpha"],
                                     np.random.default_rng(seed), cfg["min_site_examples"])
    assert all(np.array_equal(a, b) for a, b in zip(split, want))
    # alpha = 0.3 gives unequal sizes and skewed labels
    assert len({len(s) for s in split}) > 1
    fractions = [labels[s].mean() for s in split]
    assert max(fractions) - min(fractions) > 0.5


def test_the_model_is_the_published_26k_parameter_cnn():
    model = bench.build_model()
    assert sum(p.numel() for p in model.parameters()) == 26_434
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 2)


def _federation(seed: int = 3):
    rng = np.random.default_rng(seed)
    n = 240
    x = rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 2, n).astype(np.int64)
    x[y == 1] += 0.3  # a learnable signal, so site losses differ with their label mix
    split = dirichlet_label_partition(y, NUM_SITES, 0.3, np.random.default_rng(seed), min_size=5)
    data = {"train_x": x, "train_y": y}
    cfg = {"lr": 0.1, "tau": 2, "batch_size": 8}
    return bench.make_federation(data, split, cfg, seed)


def _loss(model: nn.Module, weights, x, y) -> float:
    load_arrays(model, weights)
    model.eval()
    with torch.no_grad():
        return float(nn.functional.cross_entropy(model(x), y))


def test_one_powd_round_queries_d_and_trains_the_m_highest_loss_sites():
    fed = _federation()
    w0 = [w.copy() for w in fed.global_weights]
    check = bench.build_model()
    own = {s: _loss(check, w0, fed.site_x[s], fed.site_y[s]) for s in fed.node_ids}

    selector = SELECTORS.create("pow-d", m=M, d=D, num_rounds=5, seed=1)
    info = bench.run_round(fed, selector, 1)

    queried = info["queried"]
    assert len(queried) == D and len(set(queried)) == D
    assert info["query_forward_passes"] == sum(fed.sizes[c] for c in queried)
    for c in queried:
        assert info["query_losses"][c] == pytest.approx(own[c], rel=1e-5)
    top = sorted(queried, key=lambda c: -own[c])[:M]
    assert info["selected"] == sorted(top)
    assert sorted(fed.last_losses) == sorted(top)

    # The new global model is x0 - fedavg_delta of exactly those sites' updates.
    fed_check = _federation()
    deltas = [fed_check.local_train(s, 1)[0] for s in sorted(top)]
    expected = [w - u for w, u in
                zip(w0, fedavg_delta(deltas, [fed.sizes[s] for s in sorted(top)]))]
    for got, want in zip(fed.global_weights, expected):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_cpow_d_queries_a_fixed_subset_and_rpow_d_queries_nothing():
    fed = _federation()
    selector = SELECTORS.create("cpow-d", m=M, d=D, num_rounds=5, subset=6, seed=1)
    info = bench.run_round(fed, selector, 1)
    assert len(info["queried"]) == D
    assert info["query_forward_passes"] == sum(min(6, fed.sizes[c]) for c in info["queried"])
    first = {c: fed.subset_indices(c, 6).copy() for c in fed.node_ids}
    bench.run_round(fed, selector, 2)
    assert all(np.array_equal(first[c], fed.subset_indices(c, 6)) for c in fed.node_ids)

    fed = _federation()
    selector = SELECTORS.create("rpow-d", m=M, d=D, num_rounds=5, seed=1)
    for r in (1, 2):
        info = bench.run_round(fed, selector, r)
        assert info["queried"] == [] and info["query_forward_passes"] == 0
    assert len(fed.last_losses) == 2 * M  # never-selected sites go first in round 2


def test_missing_data_file_gives_a_clear_error(tmp_path, capsys):
    assert selection_powd.main(["--data", str(tmp_path / "absent.npz"),
                       "--output", str(tmp_path / "out.json")]) == 2
    assert "PneumoniaMNIST not found" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
