"""FedYogi (strategy.server-opt = "yogi") through the in-process engine: the real ServerApp and
ClientApp on two tiny synthetic chest X-ray hospitals. The federation trains (the global
model's loss at the sites goes down), the optimizer's moments are checkpointed, and a run
interrupted after round 1 and resumed ends bit for bit where an uninterrupted run ends."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from app.engine import partition_sites, run_federation
from clients.cxr_cls.synthetic import generate_site, site_profiles
from strategies.plugins.server_opt.yogi import FedYogi
from tests.app.restored_strategy import restored_strategy

ROUNDS = 3
YOGI = {"task": "cxr-cls", "num-server-rounds": ROUNDS, "local-steps": 3, "image-size": 32,
        "batch-size": 4, "node-wait-timeout": 5, "final-evaluation": False,
        "optimizer": "sgd", "lr": 0.05, "momentum": 0.0,
        "strategy.server-opt": "yogi", "server-opt.eta": 0.01}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tiny_hospitals(root: Path) -> None:
    for profile in site_profiles(2, seed=5):
        generate_site(root / profile.name, dataclasses.replace(profile, num_images=12), seed=5,
                      image_size=32, val_fraction=0.25)


def _checkpoint(folder: Path, overrides: dict):
    """The federation's last checkpoint and the server optimizer restored from it."""
    checkpoint, strategy = restored_strategy(folder, overrides)
    return checkpoint, strategy.train.server_opt


@pytest.fixture(scope="module")
def yogi_runs(tmp_path_factory, mlflow_store):
    tmp = tmp_path_factory.mktemp("server-opt")
    _tiny_hospitals(tmp / "data")
    common = {**YOGI, "data-root": str(tmp / "data"), "experiment": "server-opt",
              "tracking-uri": mlflow_store(tmp / "mlflow"),
              "artifact-root": str(tmp / "artifacts")}
    uninterrupted = {**common, "checkpoint-dir": str(tmp / "whole")}
    whole = run_federation(uninterrupted, partition_sites(2))
    end = _checkpoint(tmp / "whole", uninterrupted)
    interrupted = {**common, "checkpoint-dir": str(tmp / "parts")}
    run_federation({**interrupted, "num-server-rounds": 1}, partition_sites(2))
    middle = _checkpoint(tmp / "parts", {**interrupted, "num-server-rounds": 1})
    resumed = run_federation({**interrupted, "resume": True}, partition_sites(2))
    return whole, end, middle, resumed, _checkpoint(tmp / "parts", interrupted)


def test_fedyogi_trains_the_federation(yogi_runs):
    whole, (_, optimizer), _, _, _ = yogi_runs
    assert sorted(whole.reports) == list(range(1, ROUNDS + 1))
    first, last = whole.reports[1], whole.reports[ROUNDS]
    assert not first.train_dropped and not last.train_dropped
    loss = [np.mean([m["initial-loss"] for m in whole.reports[r].train.values()])
            for r in (1, ROUNDS)]
    assert loss[1] < loss[0]  # the global model each site starts from fits its data better
    assert isinstance(optimizer, FedYogi) and optimizer.rounds == ROUNDS
    assert optimizer.v is not None and all((v >= 0).all() for v in optimizer.v)


def test_a_resumed_run_ends_bit_for_bit_where_an_uninterrupted_one_ends(yogi_runs):
    _, (end, optimizer), (middle, at_one), resumed, (after, restored) = yogi_runs
    assert middle.server_round == 1 and at_one.rounds == 1
    assert sorted(resumed.reports) == [2, 3]  # round 1 came from the checkpoint
    assert after.keys == end.keys
    for a, b in zip(after.arrays, end.arrays):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert restored.rounds == optimizer.rounds == ROUNDS
    for a, b in zip(restored.m + restored.v, optimizer.m + optimizer.v):
        assert a.tobytes() == b.tobytes()
