"""app.model_source: initial-model weights from a file or MLflow, checked; logged models with their task."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from app.model_source import (METADATA_KEY, ModelSourceError, is_mlflow_uri, load_logged_model,
                              load_state_dict_from)
from app.tracking.model_logging import log_task_model, model_metadata, register_version
from clients.registry import task_class
from clients.training.site_task import TaskSettings
from strategies.wire.errors import ConfigError

SETTINGS = TaskSettings(image_size=32, num_labels=2)


def _net(width: int = 16) -> nn.Module:
    """Conv, batch norm (a buffer of integers too), pooled linear head."""
    return nn.Sequential(nn.Conv2d(1, width, 3), nn.BatchNorm2d(width),
                         nn.AdaptiveAvgPool2d(1), nn.Linear(width, 1))


def test_a_shape_mismatch_names_the_source_and_the_first_tensor(tmp_path: Path) -> None:
    path = tmp_path / "pretrained.pt"
    torch.save(_net(width=8).state_dict(), path)
    with pytest.raises(ModelSourceError) as caught:
        load_state_dict_from(str(path), _net(width=16))
    message = str(caught.value)
    assert "'0.weight': (16, 1, 3, 3) here, (8, 1, 3, 3) in" in message
    assert str(path) in message
    assert isinstance(caught.value, ConfigError)


def test_missing_and_unexpected_tensors_are_named(tmp_path: Path) -> None:
    state = _net().state_dict()
    path = tmp_path / "partial.pt"
    torch.save({k: v for k, v in state.items() if k != "3.bias"}, path)
    with pytest.raises(ModelSourceError, match=r"missing, first '3.bias'"):
        load_state_dict_from(str(path), _net())
    torch.save({**state, "head.weight": torch.zeros(2)}, path)
    with pytest.raises(ModelSourceError, match=r"does not have, first 'head.weight'"):
        load_state_dict_from(str(path), _net())


def test_a_state_dict_file_loads_cast_to_the_templates_dtypes(tmp_path: Path) -> None:
    source = _net()
    path = tmp_path / "checkpoint.pth"
    torch.save({"epoch": 3, "state_dict": {k: v.double() if v.is_floating_point() else v
                                           for k, v in source.state_dict().items()}}, path)
    template = _net()
    state = load_state_dict_from(str(path), template)
    assert list(state) == list(template.state_dict())
    for key, value in source.state_dict().items():
        assert state[key].dtype == value.dtype
        assert torch.equal(state[key], value)
    template.load_state_dict(state)


def test_a_missing_or_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="no-such.pt: no such file"):
        load_state_dict_from(str(tmp_path / "no-such.pt"), _net())
    pickled = tmp_path / "module.pt"
    torch.save(_net(), pickled)  # a whole pickled module: refused by weights_only loading
    with pytest.raises(ModelSourceError, match="module.pt: not a readable state-dict file"):
        load_state_dict_from(str(pickled), _net())


def test_uris_are_told_from_paths() -> None:
    assert is_mlflow_uri("runs:/abc/best-model")
    assert is_mlflow_uri("models:/fedmed-pe-seg-best/3")
    assert is_mlflow_uri("models:/m-0123abcd")
    assert not is_mlflow_uri("/abs/pretrained.pt")
    assert not is_mlflow_uri("C:/models/pretrained.pt")
    assert not is_mlflow_uri("relative/model.pth")


@pytest.fixture(scope="module")
def mlflow_models(tmp_path_factory: pytest.TempPathFactory, mlflow_store):
    """A SQLite MLflow store with a cxr-cls model the product logged and registered, and its folder."""
    import mlflow

    root = tmp_path_factory.mktemp("mlflow")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_store(root))
    experiment = mlflow.create_experiment("models", artifact_location=(root / "art").as_uri())
    torch.manual_seed(0)
    model = task_class("cxr-cls").model_for(SETTINGS).eval()
    metadata = model_metadata("cxr-cls", SETTINGS, False, "auc")
    with mlflow.start_run(experiment_id=experiment) as run:
        uri = log_task_model(model, "best-model", task_class("cxr-cls").example_input(SETTINGS),
                             metadata)
        register_version(uri, "models-best", {})
    folder = Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(root / "folder")))
    yield model, run.info.run_id, folder
    mlflow.set_tracking_uri(previous)


def _edited(folder: Path, copy: Path, entry: dict | None) -> Path:
    """A copy of the model ``folder`` whose ``fedmed`` metadata is ``entry`` (None: no metadata)."""
    copy = Path(shutil.copytree(folder, copy))
    mlmodel = yaml.safe_load((copy / "MLmodel").read_text())
    if entry is None:
        mlmodel.pop("metadata")
    else:
        mlmodel["metadata"][METADATA_KEY] = entry
    (copy / "MLmodel").write_text(yaml.safe_dump(mlmodel))
    return copy


def test_an_mlflow_source_loads_by_run_and_by_registered_version(mlflow_models) -> None:
    model, run_id, _ = mlflow_models
    for uri in (f"runs:/{run_id}/best-model", "models:/models-best/1"):
        template = task_class("cxr-cls").model_for(SETTINGS)
        state = load_state_dict_from(uri, template)
        assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    wrong = task_class("cxr-cls").model_for(TaskSettings(image_size=32, num_labels=3))
    with pytest.raises(ModelSourceError, match=r"models:/models-best/1: '.*': \(3,? .*here"):
        load_state_dict_from("models:/models-best/1", wrong)


def test_a_local_model_folder_is_a_source_and_a_logged_model(mlflow_models, tmp_path: Path) -> None:
    model, _, folder = mlflow_models
    state = load_state_dict_from(str(folder), task_class("cxr-cls").model_for(SETTINGS))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    entry = {"task": "cxr-cls", "task-settings": {"num_labels": 2}}
    partial = _edited(folder, tmp_path / "partial", entry)
    assert load_logged_model(str(partial)).settings == TaskSettings(num_labels=2)  # defaults
    odd = _edited(folder, tmp_path / "odd", {"task": "cxr-cls", "task-settings": {"imagesize": 32}})
    with pytest.raises(ModelSourceError, match="unknown task setting 'imagesize'"):
        load_logged_model(str(odd))


def test_a_safetensors_file_is_an_initial_model(mlflow_models) -> None:
    model, _, folder = mlflow_models
    weights = folder / "artifacts" / "model.safetensors"
    state = load_state_dict_from(str(weights), task_class("cxr-cls").model_for(SETTINGS))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_a_logged_model_comes_with_its_task_and_settings(mlflow_models) -> None:
    model, run_id, _ = mlflow_models
    logged = load_logged_model("models:/models-best/1")
    assert (logged.task, logged.settings, logged.private) == ("cxr-cls", SETTINGS, False)
    assert logged.run_id == run_id
    batch = torch.from_numpy(np.random.default_rng(0).random((4, 1, 32, 32), np.float32))
    with torch.no_grad():
        assert torch.allclose(logged.model(batch), model(batch))


def test_a_model_without_the_metadata_is_refused(mlflow_models, tmp_path: Path) -> None:
    _, _, folder = mlflow_models
    plain = _edited(folder, tmp_path / "plain-model", None)
    with pytest.raises(ModelSourceError, match=f"plain-model: the model has no '{METADATA_KEY}'"):
        load_logged_model(str(plain))
    with pytest.raises(ModelSourceError,
                       match="runs:/no-such-run/best-model: not found in the tracking store"):
        load_logged_model("runs:/no-such-run/best-model")
