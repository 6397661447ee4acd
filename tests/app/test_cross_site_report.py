"""The end-of-federation report: run-config keys, metric names, and what reaches MLflow."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import mlflow
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord
from mlflow.tracking import MlflowClient

from app.config.run_config import RunConfig, RunConfigError
from app.engine import InProcessGrid, VirtualSite
from app.cross_site_report import cross_site_metrics, report_federation_end, selected_arrays
from app.server_app import build_strategy
from app.tracking import BestRound, FederationTracker
from strategies.rounds.cross_site import CrossSiteResult
from strategies.rounds.round_report import RoundReport
from tests.fixtures.scripted_site import ScriptedSite


def test_run_config_keys_default_and_range():
    config = RunConfig.from_mapping({})
    assert config.final_evaluation is True and config.cross_site_finetune_steps == 2
    changed = RunConfig.from_mapping({"final-evaluation": False, "cross-site.finetune-steps": 0})
    assert not changed.final_evaluation and changed.cross_site_finetune_steps == 0
    assert changed.as_params()["cross-site.finetune-steps"] == 0
    with pytest.raises(RunConfigError, match="'cross-site.finetune-steps' must be >= 0"):
        RunConfig.from_mapping({"cross-site.finetune-steps": -1})


def test_metric_names_weighted_and_per_site():
    result = CrossSiteResult(
        metric="test-dice", weighted={"test-dice": 0.5, "num-examples": 30.0},
        sites={"a": {"test-dice": 0.4, "num-examples": 10.0, "test-studies": 2.0}})
    assert cross_site_metrics(result) == {
        "test/dice": 0.5, "test/num-examples": 30.0, "site/a/test-dice": 0.4,
        "site/a/test-num-examples": 10.0, "site/a/test-studies": 2.0}


def _sites() -> list[VirtualSite]:
    """Two sites; site-i scores ``(i + w[0]) / 10`` (a Dice in [0, 1]) on its test split and
    trains ``w += 1``."""
    def scorer(i: int):
        return lambda weights: {"test-studies": 4, "test-dice": (i + float(weights[0][0])) / 10}

    return [VirtualSite({}, ScriptedSite(f"site-{i}", evaluate=scorer(i), num_examples=4))
            for i in (1, 2)]


def _reports() -> dict[int, RoundReport]:
    return {1: RoundReport(1, train={"site-1": {"steps": 2.0}}, schedule_tau=2,
                           evaluate={"site-1": {"val-dice": 0.3}},
                           strategy={"bytes-up": 10.0, "bytes-down": 20.0})}


@pytest.mark.usefixtures("server_identity")
def test_report_logs_test_metrics_matrix_table_and_figures(tmp_path: Path, mlflow_store):
    store = mlflow_store(tmp_path)
    tracker = FederationTracker("pe-seg", tracking_uri=store,
                                artifact_root=str(tmp_path / "art"), experiment="end")
    try:
        run_id = tracker.start("r", {}, {})
        config = RunConfig.from_mapping({"cross-site.finetune-steps": 1, "num-server-rounds": 3})
        strategy = build_strategy(config, federation=run_id)
        strategy.reports = _reports()
        arrays = ArrayRecord({"w": Array(np.array([0.5], np.float32))})
        grid = InProcessGrid(_sites(), run_id=42)
        result = report_federation_end(grid, strategy, arrays, tracker, config, "dice")
    finally:
        mlflow.end_run()
    assert result is not None and result.rows == ["global", "site-1-finetuned",
                                                  "site-2-finetuned"]
    client = MlflowClient(store)
    run = client.get_run(run_id)
    assert run.data.metrics["test/dice"] == pytest.approx(0.2)  # (0.15 + 0.25) / 2
    assert run.data.metrics["site/site-2/test-dice"] == pytest.approx(0.25)
    assert client.get_metric_history(run_id, "test/dice")[0].step == 4
    paths = {a.path for folder in ("cross-site", "figures")
             for a in client.list_artifacts(run_id, folder)}
    assert paths == {"cross-site/matrix.json", "cross-site/matrix.png",
                     "figures/cross-site-matrix.png", "figures/tau.png",
                     "figures/selections.png", "figures/validation.png", "figures/bytes.png"}
    table = json.loads(Path(client.download_artifacts(run_id, "cross-site/matrix.json",
                                                      str(tmp_path))).read_text())
    assert table["columns"] == ["model", "site-1", "site-2"]
    assert table["data"][1] == ["site-1-finetuned", pytest.approx(0.25), pytest.approx(0.35)]


@pytest.mark.usefixtures("server_identity")
def test_without_final_evaluation_no_site_is_asked_and_mlflow_down_does_not_raise(tmp_path):
    sites = _sites()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = RunConfig.from_mapping({"final-evaluation": False})
    strategy = build_strategy(config)
    strategy.reports = _reports()
    tracker = FederationTracker.of_run("gone", down, "gone", tmp_path)
    grid = InProcessGrid(sites, run_id=42)
    assert report_federation_end(grid, strategy, ArrayRecord(), tracker, config, "dice") is None
    assert [site.context.state.config_records for site in sites] == [{}, {}]  # none answered
    assert [r.step for r in tracker.outbox.pending] == [config.num_server_rounds + 1]  # waits


def test_the_selected_model_is_the_best_rounds_else_the_final_one():
    final = ArrayRecord({"w": Array(np.array([9.0], np.float32))})
    best = BestRound("val-dice")
    assert selected_arrays(best, final) is final  # no round evaluated
    best.observe(2, {"val-dice": 0.7}, {"a": {"val-dice": 0.7}}, ["w"],
                 [np.array([2.0], np.float32)])
    chosen = selected_arrays(best, final)
    assert list(chosen.keys()) == ["w"] and chosen["w"].numpy().tolist() == [2.0]
