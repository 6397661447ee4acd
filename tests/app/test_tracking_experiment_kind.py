"""The experiments the product creates open on their training runs in MLflow's UI
(issue 29, found 9): MLflow 3 opens an experiment without ``mlflow.experimentKind`` in
its GenAI mode, on an empty traces overview."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from app.tracking import FederationTracker

KIND = "mlflow.experimentKind"


def test_a_new_experiment_is_a_model_training_one(tmp_path, mlflow_store):
    store = mlflow_store(tmp_path)
    tracker = FederationTracker("pe-seg", store, str(tmp_path / "artifacts"), experiment="kind")
    tags = MlflowClient(store).get_experiment(tracker.experiment_id).tags
    assert tags[KIND] == "custom_model_development"


def test_an_existing_experiment_without_the_kind_gets_it(tmp_path, mlflow_store):
    store = mlflow_store(tmp_path)
    client = MlflowClient(store)
    older = client.create_experiment("older", artifact_location=(tmp_path / "a").as_uri(),
                                     tags={"team": "radiology"})
    assert KIND not in client.get_experiment(older).tags
    tracker = FederationTracker("pe-seg", store, experiment="older")
    assert tracker.experiment_id == older
    tags = client.get_experiment(older).tags
    assert tags[KIND] == "custom_model_development" and tags["team"] == "radiology"
