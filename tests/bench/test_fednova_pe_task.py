"""Wiring test of ``bench/fednova_pe_task.py``'s rounds (``bench/fednova_pe_rounds.py``) on tiny hospitals.

Two tiny synthetic hospitals (32 px, tau (1, 4), plain SGD), one round of
``run_round``. The deltas are recomputed independently (same seed, fresh
training from the global weights, ``x_global - x_local``) and the FedNova
update is checked against the hand formula
``x_new = x - tau_eff * sum_i p_i delta_i / a_i``, ``a_i = tau_i``,
``tau_eff = sum_i p_i a_i``, ``p_i = n_i / sum_j n_j`` on the actual arrays.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from clients.pe_seg.synthetic import SiteProfile, generate_site
from clients.pe_seg.task import PESegTask
from clients.training.site_task import TaskSettings
from model_arrays import state_arrays
from round_seeds import round_seed


TAUS = (1, 4)
LR = 0.1
SEED = 3
ROUND = 1


def _load():
    return importlib.import_module("fednova_pe_rounds")


bench = _load()


def _profile(name: str, num_studies: int) -> SiteProfile:
    return SiteProfile(name=name, num_studies=num_studies, noise_hu=20.0, contrast_hu=200.0,
                           slice_thickness_mm=(2.0, 3.0), num_slices=(10, 14))


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """One torch thread (the machine is shared), restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> list[PESegTask]:
    root = tmp_path_factory.mktemp("fednova-pe")
    settings = TaskSettings(image_size=32, slab_slices=9, batch_size=4)
    # Different study counts -> unequal n_i, so p_i is not uniform.
    sites = [generate_site(root / "h0", _profile("h0", 4), seed=7, image_size=32),
             generate_site(root / "h1", _profile("h1", 3), seed=8, image_size=32)]
    return [PESegTask(s, settings) for s in sites]


@pytest.fixture(scope="module")
def start(tasks) -> list[np.ndarray]:
    torch.manual_seed(SEED)
    return state_arrays(tasks[0].build_model())


def _local_delta(task: PESegTask, start: list[np.ndarray], tau: int, site: int) -> list[np.ndarray]:
    """x_global - x_local, computed without the bench's round function."""
    model = task.build_model()
    model.load_state_dict({k: torch.from_numpy(a.copy())
                           for k, a in zip(model.state_dict().keys(), start)})
    task.train(model, tau, LR, 0.0, bench.CPU, seed=round_seed(SEED, ROUND, site),
               optimizer="sgd")
    return [g - v.detach().numpy() for g, v in zip(start, model.state_dict().values())]


def _round(tasks, start, method):
    scratch = tasks[0].build_model()
    return bench.run_round(tasks, scratch, start, TAUS, method=method, lr=LR, momentum=0.0,
                           seed=SEED, round_index=ROUND)


def test_fednova_round_matches_hand_formula(tasks, start):
    n = np.array([len(t.train_set) for t in tasks], dtype=np.float64)
    assert n[0] != n[1]
    res = _round(tasks, start, "fednova")

    assert res.num_examples == [int(v) for v in n]
    assert res.steps_done == list(TAUS)
    assert res.a_norms == [float(t) for t in TAUS]  # plain SGD: ||a_i||_1 = tau_i

    # The deltas are x_global - x_local of real local training, reproducible by hand.
    for i, tau in enumerate(TAUS):
        expected = _local_delta(tasks[i], start, tau, i)
        assert len(res.deltas[i]) == len(start)
        for got, want in zip(res.deltas[i], expected):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        assert sum(float(np.abs(d).sum()) for d in res.deltas[i]) > 0.0

    p = n / n.sum()
    a = np.array(TAUS, dtype=np.float64)
    tau_eff = float(p @ a)
    assert tau_eff == pytest.approx((n[0] * 1 + n[1] * 4) / n.sum())
    for j, x in enumerate(start):
        agg = tau_eff * sum(p[i] * res.deltas[i][j].astype(np.float64) / a[i] for i in range(2))
        np.testing.assert_allclose(res.new_global[j], x.astype(np.float64) - agg,
                                   rtol=1e-5, atol=1e-6)


def test_fedavg_round_differs_from_fednova_under_heterogeneous_tau(tasks, start):
    avg = _round(tasks, start, "fedavg")
    nova = _round(tasks, start, "fednova")
    n = np.array(avg.num_examples, dtype=np.float64)
    p = n / n.sum()
    # Same seeds -> identical local updates for both methods.
    for da, dn in zip(avg.deltas, nova.deltas):
        for x, y in zip(da, dn):
            np.testing.assert_array_equal(x, y)
    for j, x in enumerate(start):
        agg = sum(p[i] * avg.deltas[i][j].astype(np.float64) for i in range(2))
        np.testing.assert_allclose(avg.new_global[j], x.astype(np.float64) - agg,
                                   rtol=1e-5, atol=1e-6)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(avg.new_global, nova.new_global))
    assert diff > 1e-6
