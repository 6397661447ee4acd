"""``bench/compression_fedavg.py`` through the in-process engine on two tiny PE hospitals.

Dense, top-k 1% with and without error feedback, 2 rounds of 2 steps: the
bytes are the round reports' (top-k 1% under a fiftieth... of dense's reply,
with and without EF the same size), the summary's ratios are those bytes,
and error feedback changes the model the federation reaches from round 2 on.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

import compression_fedavg
from tests.bench.conftest import run_on_small_hospitals, stored_and_rebuilt

CONFIGS = ["none", "topk:0.01+ef", "topk:0.01"]


@pytest.fixture(scope="module")
def result(tmp_path_factory, mlflow_store):
    out = run_on_small_hospitals(tmp_path_factory, mlflow_store, "compression-fedavg", 4,
                                 compression_fedavg.main, [
                                     "--sets", "pe", "--configs", *CONFIGS, "--rounds", "2",
                                     "--tail", "1", "--pe-steps", "2", "--pe-batch-size", "4"])
    return json.loads(out.read_text())


def test_topk_one_percent_sends_a_fraction_of_dense(result):
    task = result["tasks"]["pe"]
    assert result["engine"] == "in-process" and task["setup"]["sites"] == 2
    configs = task["summary"]["configs"]
    dense = configs["none"]["uplink_bytes_per_site_round"]
    for name in ("topk:0.01+ef", "topk:0.01"):
        assert configs[name]["uplink_bytes_per_site_round"] < dense / 50
        assert configs[name]["uplink_ratio_vs_dense"] == pytest.approx(
            dense / configs[name]["uplink_bytes_per_site_round"])
    # same k: EF and no EF send (nearly) the same bytes
    assert configs["topk:0.01+ef"]["uplink_bytes_per_site_round"] == pytest.approx(
        configs["topk:0.01"]["uplink_bytes_per_site_round"], rel=0.02)


def test_error_feedback_changes_the_federation(result):
    curves = result["tasks"]["pe"]["curves"]
    # round 1 from the same model and seeds: the same local training, no residual yet
    assert curves["topk:0.01+ef"]["train_loss"][0] == pytest.approx(
        curves["topk:0.01"]["train_loss"][0])
    # round 1's residual is zero with both, so the same model; only error feedback
    # keeps a residual, and round 2 sends it: the models after round 2 differ
    assert curves["topk:0.01+ef"]["residual_norm"][-1] > 0
    assert curves["topk:0.01"]["residual_norm"][-1] == 0
    ef, no_ef = curves["topk:0.01+ef"]["curves"]["loss"], curves["topk:0.01"]["curves"]["loss"]
    assert ef[0] == no_ef[0] and ef[1] != no_ef[1]
    assert "b_ef_beats_no_ef" in result["tasks"]["pe"]["summary"]["targets"]


def test_main_skips_the_xray_set_without_the_data(tmp_path):
    out = tmp_path / "out.json"
    assert compression_fedavg.main(["--sets", "cxr", "--shared-data", str(tmp_path / "none"),
                                    "--output", str(out)]) == 0
    assert "skipped" in json.loads(out.read_text())["tasks"]["cxr"]


def test_the_runner_builds_the_stored_run_configs(fake_shared):
    """Every run of bench/results/compression_fedavg.json: the runner, given the stored
    commands, hands the engine the run config the old script did (site folders aside)."""
    stored = json.loads((Path(compression_fedavg.BENCH) / "results" / "compression_fedavg.json")
                        .read_text())
    rows = [r for task in stored["tasks"].values() for r in task["curves"].values()]
    commands = [shlex.split(c)[1:] for c in stored["commands"]]
    stored_configs, built = stored_and_rebuilt(compression_fedavg.STUDY, commands, rows,
                                               fake_shared)
    assert len(built) == 13 and built == stored_configs
