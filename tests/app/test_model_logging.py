"""The models a federation leaves in MLflow are weights plus metadata (issue 28, item 4), load
as plain modules and as MLflow pyfuncs at any batch size, and are registered with where they
come from (issue 15, items 1 and 2)."""

from __future__ import annotations

import math
from dataclasses import replace

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from torch import nn

from app.model_source import load_logged_model
from app.tracking import BestRound, FederationTracker, RoundScore, log_federation_models
from app.tracking.model_logging import log_task_model, model_metadata, register_version
from clients.registry import task_class
from clients.training.site_task import TaskSettings

TINY = TaskSettings(image_size=16, volume_depth=4, batch_size=2)


@pytest.fixture(scope="module")
def tracker(tmp_path_factory, mlflow_store):
    """One sqlite MLflow store (with a Model Registry) and one open run for the module."""
    folder = tmp_path_factory.mktemp("mlflow")
    tracker = FederationTracker("pe-seg", mlflow_store(folder),
                                str(folder / "artifacts"), experiment="fedmed-test")
    tracker.start("test", params={}, tags={})
    yield tracker
    mlflow.end_run()


def _logged(task_name: str, name: str) -> tuple[str, nn.Module]:
    task = task_class(task_name)
    model = task.model_for_run(TINY)
    metadata = model_metadata(task_name, TINY, False, task.main_metric)
    return log_task_model(model, name, task.example_input(TINY), metadata), model


@pytest.mark.parametrize("task_name", ["pe-seg", "cxr-cls", "ct3d-cls"])
def test_a_logged_model_loads_as_a_module_and_predicts_batches_of_one_and_three(tracker, task_name):
    """Found (issue 15): the logged model was a torch.export GraphModule specialised to batch 1.
    Found (issue 28, 4): it was a pickled module; now weights (safetensors) plus metadata,
    loaded by the product's code (make predict) and by MLflow's pyfunc (models-from-code)."""
    uri, model = _logged(task_name, f"model-{task_name}")
    loaded = load_logged_model(uri).model
    assert type(loaded) is type(model) and not loaded.training
    pyfunc = mlflow.pyfunc.load_model(uri)
    for size in (1, 3):
        batch = np.repeat(task_class(task_name).example_input(TINY), size, axis=0)
        batch += np.random.default_rng(size).random(batch.shape, dtype=np.float32)
        with torch.no_grad():
            expected = model.eval()(torch.from_numpy(batch)).numpy()
            np.testing.assert_allclose(loaded(torch.from_numpy(batch)).numpy(), expected,
                                       rtol=1e-5, atol=1e-6)
        predicted = np.asarray(pyfunc.predict(batch))
        assert predicted.shape[0] == size
        np.testing.assert_allclose(predicted, expected, rtol=1e-5, atol=1e-6)
    info = mlflow.models.get_model_info(uri)
    assert info.signature.inputs.inputs[0].shape == (-1, *batch.shape[1:])
    assert info.saved_input_example_info is not None
    assert "python_function" in info.flavors and "pytorch" not in info.flavors
    fedmed = info.metadata["fedmed"]
    assert fedmed["task"] == task_name and fedmed["private"] is False
    assert fedmed["main-metric"] == task_class(task_name).main_metric
    assert fedmed["weights"] == "safetensors" and fedmed["version"] == "0.1.0"
    assert TaskSettings(**fedmed["task-settings"]) == TINY
    assert str(TINY.image_size) in fedmed["preprocessing"]


def test_a_private_model_is_rebuilt_dp_compatible_from_its_metadata(tracker):
    task = task_class("cxr-cls")
    model = task.model_for_run(TINY, private=True)
    uri = log_task_model(model, "private-model", task.example_input(TINY),
                         model_metadata("cxr-cls", TINY, True, task.main_metric))
    logged = load_logged_model(uri)
    assert logged.private and logged.run_id == tracker.run_id
    assert list(logged.model.state_dict()) == list(model.state_dict())
    assert not any(isinstance(m, nn.BatchNorm2d) for m in logged.model.modules())


def test_the_best_and_the_final_model_are_registered_with_their_origin(tracker):
    """Found: only the final model was logged; no best round, no registry entry."""
    task = task_class("pe-seg")
    model = task.model_for_run(TINY)
    keys = list(model.state_dict())
    final = [v.numpy().copy() for v in model.state_dict().values()]
    best = BestRound("val-dice")
    best.observe(2, {"val-dice": 0.8}, {"site-b": {}, "site-a": {}}, keys,
                 [np.full_like(a, 0.5) if a.dtype.kind == "f" else a for a in final])
    best.observe(3, {"val-dice": 0.6}, {"site-a": {}}, keys, final)
    mlflow.log_metrics({"site/site-a/epsilon": 1.5, "site/site-b/epsilon": 2.25})
    metadata = model_metadata("pe-seg", TINY, False, "dice")
    last = RoundScore(3, "val-dice", 0.6, ["site-a"])
    logged = log_federation_models(tracker.run_id, tracker.experiment_name, model,
                                   (keys, final), last, best, task.example_input(TINY),
                                   metadata, "topk:0.1")
    assert logged.best_version == "models:/fedmed-test-best/1"
    assert logged.final_version == "models:/fedmed-test-final/1"
    client = MlflowClient()
    tags = client.get_model_version("fedmed-test-best", "1").tags
    assert tags == {"run-id": tracker.run_id, "round": "2", "metric": "val-dice",
                    "val-dice": "0.8", "sites": "site-a,site-b", "codec": "topk:0.1",
                    "dp-epsilon": "2.25"}
    assert client.get_model_version("fedmed-test-final", "1").tags["round"] == "3"
    best_model = load_logged_model(logged.best_version).model
    assert all(torch.all(p == 0.5) for p in best_model.parameters())
    final_model = load_logged_model(logged.final_version).model
    assert all(np.array_equal(a.numpy(), b) for a, b in zip(final_model.state_dict().values(),
                                                            final))
    run = client.get_run(tracker.run_id)
    assert run.data.tags["best-round"] == "2" and run.data.metrics["best-val-dice"] == 0.8


def test_without_an_evaluated_round_no_best_model_is_logged_with_a_warning(tracker, caplog):
    """Issue 29, found 8 (a): the final model, unscored, was registered as the best one too."""
    task = task_class("cxr-cls")
    settings = replace(TINY, num_labels=2)
    model = task.model_for_run(settings)
    keys = list(model.state_dict())
    final = [v.numpy() for v in model.state_dict().values()]
    best_versions = len(MlflowClient().search_model_versions("name='fedmed-test-best'"))
    logged = log_federation_models(
        tracker.run_id, tracker.experiment_name, model, (keys, final),
        RoundScore(4, "val-auc", math.nan, []), BestRound("val-auc"),
        task.example_input(settings), model_metadata("cxr-cls", settings, True, "auc"), "none")
    assert "no round was evaluated" in caplog.text
    assert (logged.best_round, logged.best_uri, logged.best_version) == (0, "", "")
    assert len(MlflowClient().search_model_versions("name='fedmed-test-best'")) == best_versions
    name, version = logged.final_version.removeprefix("models:/").split("/")
    tags = MlflowClient().get_model_version(name, version).tags
    assert tags["round"] == "4" and "val-auc" not in tags and tags["sites"] == ""
    assert register_version("models:/m-missing", "fedmed-test-best", {}) == ""
