"""Issue 16: FedBN, a site's normalisation layers stay at the site (Li et al. 2021).

A hand-made FedBN round: two sites train, send 0 for their normalisation layers,
the server averages (FedAvg) and applies the update; each site gets the new global
model and its own layers back, unchanged by the aggregation, also after a restart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from clients.site.state_store import SiteStateStore
from clients.training.personalisation.local_layers import (LOCAL_LAYERS, LocalLayers,
                                                           LocalLayersError, local_state_names)
from strategies.aggregation import fedavg_delta


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 1))


def _state(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _local_train(model: nn.Module, seed: int) -> None:
    """A few forward/backward steps: changes weights, BN affine and running statistics."""
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    for _ in range(3):
        x = torch.randn(8, 2) * (seed + 1) + seed
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def test_norm_layers_are_found_with_their_statistics():
    assert local_state_names(_model()) == ["1.weight", "1.bias", "1.running_mean",
                                           "1.running_var", "1.num_batches_tracked"]
    assert local_state_names(nn.Sequential(nn.Linear(2, 2), nn.InstanceNorm1d(2))) == []


def test_a_fedbn_round_leaves_each_sites_layers_unchanged(tmp_path: Path):
    torch.manual_seed(0)
    global_model = _model()
    x_global = _state(global_model)
    names = list(x_global)
    local = set(local_state_names(global_model))
    kept, deltas = {}, []
    for site, seed in (("a", 1), ("b", 2)):
        model = _model()
        model.load_state_dict(global_model.state_dict())
        layers = LocalLayers(SiteStateStore(tmp_path / site), "fed-1")
        assert not layers.restore(model)  # nothing kept yet: the global layers
        _local_train(model, seed)
        layers.keep(model)
        kept[site] = _state(model)
        delta = [x_global[n] - kept[site][n] for n in names]
        deltas.append([np.zeros_like(d) if n in local else d for n, d in zip(names, delta)])
    aggregated = fedavg_delta(deltas, [10, 30])
    x_new = {n: x_global[n] - d for n, d in zip(names, aggregated)}
    assert not np.allclose(x_new["0.weight"], x_global["0.weight"])
    for site in ("a", "b"):
        restarted = _model()  # a new process: a fresh model and a fresh LocalLayers
        restarted.load_state_dict({n: torch.as_tensor(np.asarray(v)) for n, v in x_new.items()})
        assert LocalLayers(SiteStateStore(tmp_path / site), "fed-1").restore(restarted)
        after = _state(restarted)
        for name in names:
            expected = kept[site][name] if name in local else x_new[name]
            np.testing.assert_array_equal(after[name], expected, err_msg=name)
    assert not np.allclose(kept["a"]["1.running_mean"], kept["b"]["1.running_mean"])
    assert kept["a"]["1.num_batches_tracked"] == 3


def test_layers_are_keyed_by_federation_and_checked_against_the_model(tmp_path: Path):
    store = SiteStateStore(tmp_path)
    LocalLayers(store, "fed-1").keep(_model())
    assert not LocalLayers(store, "fed-2").restore(_model())
    store.save("fed-1", LOCAL_LAYERS, np.zeros(4))
    with pytest.raises(LocalLayersError, match="fedbn-local-layers.npy: 4 values saved, the "
                                               "model's normalisation layers have 13"):
        LocalLayers(store, "fed-1").restore(_model())
