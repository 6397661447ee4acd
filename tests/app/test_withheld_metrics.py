"""Issue 28, found 6 (fifth bullet): metrics a site withholds are reported as withheld, not NaN.

A whole federation through the in-process engine (the real ServerApp, MLflow) with
scripted sites whose policy keeps their metrics back: ``min-val-items`` (too few studies;
the evaluate reply carries counts and names the rule in its SITE record,
``keys.WITHHELD``), an older site that sends the counts alone (no rule named), and a
site that refuses the cross-site fine-tune (``share-finetuned-model``). The round line,
the end-of-run test line, the cross-site matrix (JSON and figure) and MLflow say
"withheld by site policy (<rule>)" where today they say NaN.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, Error, Message, MessageType
from mlflow.tracking import MlflowClient

from app.engine import VirtualSite, partition_sites, run_federation
from app.engine.federation import PROJECT_ROOT
from app.tooling.federation_summary import print_summary
from app.round_progress import metric_text, progress_line
from app.tracking.figures import matrix_figure
from strategies.rounds.round_report import RoundReport
from strategies.wire import message_keys as keys
from tests.fixtures.scripted_site import ScriptedSite
from tests.integration.conftest import write_small_hospitals

ROUNDS = 1
SHIPPED_POLICY = PROJECT_ROOT / "configs" / "site-policy.toml"
COUNTS_ONLY = {"val-studies": 1, "test-studies": 1}


def _released(weights) -> dict[str, float]:
    return {"val-loss": 0.5, "val-dice": 0.4, "test-loss": 0.5, "test-dice": 0.3,
            "val-studies": 3, "test-studies": 3}


def _refusing_finetune(site: ScriptedSite):
    """``site``, refusing the cross-site fine-tune (a train past the last round) by its policy."""
    def answer(message: Message, context: Context) -> Message:
        config = message.content[keys.CONFIG]
        if (message.metadata.message_type == MessageType.TRAIN
                and int(config[keys.SERVER_ROUND]) > ROUNDS):
            return Message(Error(code=keys.POLICY_REFUSAL_CODE, reason=(
                f"site {site.name}: {keys.POLICY_RULE_PREFIX}share-finetuned-model "
                "(refused)")), reply_to=message)
        return site(message, context)

    return answer


def _federate(tmp_path: Path, store: str, sites: list[VirtualSite], caplog):
    with caplog.at_level(logging.INFO):
        return run_federation({
            "num-server-rounds": ROUNDS, "image-size": 16, "node-wait-timeout": 5,
            "experiment": "withheld", "tracking-uri": store,
            "artifact-root": str(tmp_path / "artifacts"),
            "checkpoint-dir": str(tmp_path / "checkpoints"),
            "cross-site.finetune-steps": 1}, sites)


@pytest.fixture(scope="module")
def store_of(tmp_path_factory, mlflow_store):
    return lambda name: mlflow_store(tmp_path_factory.mktemp(name))


def test_no_site_released_a_metric_every_report_says_withheld(tmp_path, store_of, caplog):
    store = store_of("all-withheld")
    sites = [VirtualSite({}, ScriptedSite("site-a", evaluate=lambda w: dict(COUNTS_ONLY),
                                          withheld="min-val-items")),
             VirtualSite({}, ScriptedSite("site-b", evaluate=lambda w: dict(COUNTS_ONLY)))]
    outcome = _federate(tmp_path, store, sites, caplog)
    log = caplog.text
    assert "val-dice withheld by site policy (site-a: min-val-items; site-b: no metrics)" \
        in log, log
    assert "test test-dice: withheld by site policy (site-a: min-val-items; " \
        "site-b: no metrics)" in log, log
    assert "nan" not in log.lower()
    assert outcome.reports[1].evaluate_withheld == {"site-a": "min-val-items",
                                                    "site-b": "no metrics"}
    client = MlflowClient(store)
    run = client.get_run(outcome.mlflow_run_id)
    assert not [k for k, v in run.data.metrics.items() if math.isnan(v)]
    assert "eval/val-dice" not in run.data.metrics and "test/dice" not in run.data.metrics
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert json.loads((artifacts / "rounds/round-001-withheld.json").read_text()) == {
        "site-a": "withheld by site policy (min-val-items)",
        "site-b": "withheld by site policy (no metrics)"}
    table = json.loads((artifacts / "cross-site/matrix.json").read_text())
    cells = [row[1:] for row in table["data"]]
    assert cells[0] == ["withheld by site policy (min-val-items)",
                        "withheld by site policy (no metrics)"]
    assert run.data.tags["test/withheld"] == "site-a: min-val-items; site-b: no metrics"


def test_a_refused_finetune_is_withheld_under_its_rule(tmp_path, store_of, caplog):
    store = store_of("finetune-refused")
    sites = [VirtualSite({}, _refusing_finetune(ScriptedSite("site-a", evaluate=_released))),
             VirtualSite({}, ScriptedSite("site-b", evaluate=_released))]
    outcome = _federate(tmp_path, store, sites, caplog)
    result = outcome.cross_site
    assert result is not None
    assert result.withheld == {"finetune/site-a": "share-finetuned-model"}
    assert result.dropped == {}
    assert result.rows == ["global", "site-a-finetuned", "site-b-finetuned"]
    table = result.table()
    assert table["site-a"][1] == table["site-b"][1] == \
        "withheld by site policy (share-finetuned-model)"
    assert table["site-a"][0] == pytest.approx(0.3)
    assert "site-a-finetuned: withheld by site policy (share-finetuned-model)" in caplog.text


def test_the_round_line_names_the_site_that_withheld_beside_those_that_released():
    report = RoundReport(3, evaluate={"site-a": {"val-dice": 0.4, "num-examples": 5.0},
                                      "site-b": {"num-examples": 5.0, "val-studies": 1.0}},
                         evaluate_aggregate={"val-dice": 0.4, "num-examples": 10.0},
                         evaluate_withheld={"site-b": "min-val-items,evaluate-trains"})
    assert metric_text(report, "val-dice") == (
        "val-dice 0.4000 (site-a 0.400, site-b withheld by site policy "
        "(min-val-items,evaluate-trains))")
    assert "val-dice 0.4000" in progress_line(report, 5, "val-dice")


def test_the_round_line_shows_each_sites_epsilon_spent_and_left():
    report = RoundReport(2, train={"site-a": {keys.EPSILON: 5.62, keys.EPSILON_LEFT: 2.38},
                                   "site-b": {keys.STEPS: 3.0}})
    assert " | epsilon site-a 5.62 (left 2.38) | " in progress_line(report, 5, "val-dice")
    assert "epsilon" not in progress_line(RoundReport(2), 5, "val-dice")


def test_the_matrix_figure_writes_the_rule_in_a_withheld_cell():
    figure = matrix_figure(["global"], ["site-a", "site-b"], np.array([[0.3, np.nan]]),
                           "test-dice", {(0, 1): "min-val-items"})
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert texts == ["0.300", "withheld\n(min-val-items)"]


def test_real_sites_under_the_shipped_policy_report_withheld(tmp_path, store_of, caplog,
                                                             capsys):
    """The reproduction of found 6: real sites (the ClientApp), the shipped policy
    (``min-val-items = 2``, ``share-finetuned-model = false``), one val and one test study
    per site: the round line, the test line and MLflow said NaN with ``dropped: none``."""
    write_small_hospitals(tmp_path / "data", seed=3)
    store = store_of("real-sites")
    with caplog.at_level(logging.INFO):
        outcome = run_federation({
            "num-server-rounds": 1, "local-steps": 1, "image-size": 32, "batch-size": 4,
            "node-wait-timeout": 5, "experiment": "withheld-real", "tracking-uri": store,
            "data-root": str(tmp_path / "data"), "artifact-root": str(tmp_path / "artifacts"),
            "checkpoint-dir": str(tmp_path / "checkpoints"), "cross-site.finetune-steps": 1,
            "site-policy": str(SHIPPED_POLICY)}, partition_sites(2))
    sites = ("hospital-00", "hospital-01")
    assert outcome.reports[1].evaluate_withheld == dict.fromkeys(sites, "min-val-items")
    assert outcome.cross_site is not None and outcome.cross_site.withheld == {
        **{f"test/{s}": "min-val-items" for s in sites},
        **{f"finetune/{s}": "share-finetuned-model" for s in sites}}
    assert "val-dice withheld by site policy (hospital-00: min-val-items; " \
        "hospital-01: min-val-items)" in caplog.text
    assert "nan" not in caplog.text.lower()
    run = MlflowClient(store).get_run(outcome.mlflow_run_id)
    assert not [k for k, v in run.data.metrics.items() if math.isnan(v)]
    assert run.data.tags["test/withheld"] == "hospital-00: min-val-items; " \
        "hospital-01: min-val-items"
    print_summary(store, int(run.data.tags["flwr.run-id"]), 1.0, tmp_path / "artifacts")
    summary = capsys.readouterr().out
    assert "held-out test dice: withheld by site policy (hospital-00: min-val-items; " \
        "hospital-01: min-val-items)" in summary, summary
    assert "nan" not in summary.lower()
