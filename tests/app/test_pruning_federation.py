"""Adaptive pruning (PruneFL) through the in-process engine: the real ServerApp and ClientApp on two
small synthetic hospitals. Pruned coordinates are neither sent nor changed, the sites' squared
gradients re-prune the model, and the mask survives a resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.engine import partition_sites, run_federation
from strategies.plugins.pruning.pruning_round import PruningRound
from strategies.wire.pruning_mask import kept_count
from strategies.wire.model_layout import dense_bytes
from tests.app.restored_strategy import restored_strategy
from tests.integration.conftest import write_small_hospitals

PRUNED = {"num-server-rounds": 2, "local-steps": 2, "image-size": 32, "batch-size": 4,
          "node-wait-timeout": 5, "final-evaluation": False, "strategy.pruning": "prunefl",
          "pruning.initial-density": 0.2, "pruning.interval": 2, "pruning.time-constant": 0.0,
          "pruning.max-density": 0.25}


def _checkpoint(folder: Path, overrides: dict):
    """The federation's last checkpoint and the pruning plug-in restored from it."""
    checkpoint, strategy = restored_strategy(folder, overrides)
    return checkpoint, strategy.train.feature(PruningRound).pruning


@pytest.fixture(scope="module")
def pruned_runs(tmp_path_factory, mlflow_store):
    tmp = tmp_path_factory.mktemp("pruning")
    write_small_hospitals(tmp / "data", seed=7)
    common = {**PRUNED, "data-root": str(tmp / "data"), "experiment": "pruning",
              "tracking-uri": mlflow_store(tmp / "mlflow"),
              "artifact-root": str(tmp / "artifacts"), "checkpoint-dir": str(tmp / "ckpt")}
    first = run_federation(common, partition_sites(2))
    after_two = _checkpoint(tmp / "ckpt", common)
    resumed = run_federation({**common, "num-server-rounds": 3, "resume": True},
                             partition_sites(2))
    after_three = _checkpoint(tmp / "ckpt", {**common, "num-server-rounds": 3})
    return first, after_two, resumed, after_three


def test_round_two_re_pruned_from_the_sites_squared_gradients(pruned_runs):
    first, (checkpoint, pruning), _, _ = pruned_runs
    assert pruning.version == 2  # initial pruning, then round 2's re-pruning changed the mask
    info = first.reports[2].strategy
    assert info["pruning-version"] == 2 and info["pruning-added"] + info["pruning-removed"] > 0
    assert 0 < info["pruning-density"] <= 0.25
    assert "pruning-version" not in first.reports[1].strategy or \
        first.reports[1].strategy["pruning-version"] == 1


def test_pruned_coordinates_are_neither_sent_nor_changed(pruned_runs):
    first, (checkpoint, pruning), resumed, _ = pruned_runs
    final = dict(zip(checkpoint.keys, checkpoint.arrays))
    for name, mask in pruning.masks.items():
        assert not final[name][~mask].any(), name  # pruned: exactly 0 in the global model
    dense = dense_bytes(list(final.values()))
    kept = kept_count(final, pruning.masks)
    total = sum(a.size for a in final.values())
    assert kept < 0.5 * total
    rounds = [first.reports[1], resumed.reports[3]]  # not re-pruning rounds (no squared gradients)
    for report in rounds:
        for site, traffic in report.traffic.items():
            # model and update travel compacted: far below the dense model
            assert traffic["bytes-up"] < 0.5 * dense, (site, traffic)
            assert traffic["bytes-down"] < 0.5 * dense, (site, traffic)
    # the re-pruning round's replies add the squared gradients (fp16: 2 bytes a coordinate)
    for site, traffic in first.reports[2].traffic.items():
        assert traffic["bytes-up"] > 0.4 * dense, (site, traffic)


def test_the_mask_survives_a_resume(pruned_runs):
    _, (_, before), resumed, (checkpoint, after) = pruned_runs
    assert sorted(resumed.reports) == [3]  # round 3 only: 1 and 2 came from the checkpoint
    assert after.version == before.version == 2  # round 3 does not re-prune (interval 2)
    assert sorted(after.masks) == sorted(before.masks)
    for name in before.masks:
        np.testing.assert_array_equal(after.masks[name], before.masks[name])
    trained = resumed.reports[3].train
    assert trained and all(m["pruning-version"] == 2 for m in trained.values())
    final = dict(zip(checkpoint.keys, checkpoint.arrays))
    for name, mask in after.masks.items():
        assert not final[name][~mask].any(), name
