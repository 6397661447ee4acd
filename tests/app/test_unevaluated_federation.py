"""Issue 29, found 8 (a): a federation in which no round was evaluated registers no best model.

With ``fraction-evaluate = 0`` no round has a validation metric, so none can be the
best. The final model was logged and registered as ``<experiment>-best`` too,
unscored, and the summary offered it as the best model. Now nothing is registered
as best (a warning and the summary say so), the final model is registered as
``<experiment>-final`` and is the one the sites test at the end.
"""

from __future__ import annotations

import mlflow
from mlflow.tracking import MlflowClient

from app.engine import VirtualSite, run_federation
from app.tooling.federation_summary import print_summary
from tests.fixtures.scripted_site import ScriptedSite


def test_no_evaluated_round_registers_no_best_model_and_keeps_the_final_one(
        tmp_path, mlflow_store, caplog, capsys):
    store = mlflow_store(tmp_path / "store")
    outcome = run_federation({
        "num-server-rounds": 2, "image-size": 16, "node-wait-timeout": 5,
        "fraction-evaluate": 0.0, "experiment": "unevaluated", "tracking-uri": store,
        "artifact-root": str(tmp_path / "artifacts"),
        "checkpoint-dir": str(tmp_path / "checkpoints")},
        [VirtualSite({}, ScriptedSite(name)) for name in ("site-a", "site-b")])
    assert "no round was evaluated" in caplog.text
    assert outcome.best_round == 0
    assert (outcome.models.best_uri, outcome.models.best_version) == ("", "")
    assert outcome.models.final_version == "models:/unevaluated-final/1"
    client = MlflowClient(store)
    assert client.search_model_versions("name='unevaluated-best'") == []
    assert client.get_model_version("unevaluated-final", "1").tags["round"] == "2"
    run = client.get_run(outcome.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert "best-round" not in run.data.tags and "best-round" not in run.data.metrics
    logged = client.search_logged_models(experiment_ids=[run.info.experiment_id])
    assert [model.name for model in logged] == ["global-model"]
    previous = mlflow.get_tracking_uri()
    try:
        print_summary(store, int(run.data.tags["flwr.run-id"]), 1.0, tmp_path / "artifacts")
    finally:
        mlflow.set_tracking_uri(previous)
    lines = capsys.readouterr().out.splitlines()
    assert ("no best round (no round released val-dice: fraction-evaluate = 0?), none "
            "registered as unevaluated-best; final model models:/unevaluated-final/1") in lines
    assert any(line.startswith("apply it at a site: make predict "
                               "MODEL=models:/unevaluated-final/1 ") for line in lines)
