"""A horizontal tabular-cls federation through the in-process engine: the server builds the MLP
of the 13 standard columns without data, the synthetic tabular hospitals train and evaluate it,
and ``make predict`` applies the logged model to a site's table, one row per item."""

from __future__ import annotations

import csv

from app.engine import partition_sites, run_federation
from app.predict import main as predict_main
from clients.tabular.synthetic import generate_federation
from clients.tabular.table import read_table


def test_two_tabular_hospitals_train_evaluate_and_predict_rows(tmp_path, mlflow_store, capsys):
    generate_federation(tmp_path / "data", 2, seed=1)
    store = mlflow_store(tmp_path / "mlflow")
    outcome = run_federation({
        "task": "tabular-cls", "num-server-rounds": 2, "local-steps": 20, "batch-size": 16,
        "lr": 0.01, "node-wait-timeout": 5, "experiment": "tabular",
        "data-root": str(tmp_path / "data"), "tracking-uri": store,
        "artifact-root": str(tmp_path / "artifacts"),
        "checkpoint-dir": str(tmp_path / "checkpoints")}, partition_sites(2))
    assert sorted(outcome.reports) == [1, 2]
    for report in outcome.reports.values():
        assert sorted(report.train) == ["hospital-00", "hospital-01"] and not report.train_dropped
        assert all(m["steps"] == 20 for m in report.train.values())
    last = outcome.reports[2].evaluate
    assert all(0.7 < m["val-auc"] <= 1.0 for m in last.values()), last

    site = tmp_path / "data" / "hospital-00"
    assert predict_main(["--model", outcome.models.final_uri, "--data", str(site), "--out",
                         str(tmp_path / "out"), "--split", "test", "--tracking-uri", store]) == 0
    with (tmp_path / "out" / "predictions.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    expected = [(r.patient_id, r.label) for r in read_table(site).rows if r.split == "test"]
    assert [(r["id"], r["label"]) for r in rows] == expected
    assert all(0.0 <= float(r["probability"]) <= 1.0 for r in rows)
    assert rows[0]["image"] == "table.csv"
