"""A logged model is weights plus metadata and is applied at a hospital without the
coordinator's store (issue 28: found 4, found 6 second and third bullets).

Each test reproduces a finding on the product's own logged model: a crafted pickle in a
model folder ran at ``make predict``; a copied model folder could not be applied offline;
``make predict`` created an empty store and its errors did not name it; a model of an
older store loaded as a pickle.
"""

from __future__ import annotations

import csv
import pickle
import shutil
from pathlib import Path

import mlflow
import pytest
import torch

import app.predict as predict_cli
from app.model_source import METADATA_KEY, ModelSourceError, load_logged_model
from app.tracking.model_logging import log_task_model, model_metadata, register_version
from clients.registry import task_class
from clients.training.site_task import TaskSettings
from tests.clients.small_sites import small_cxr_site

SETTINGS = TaskSettings(image_size=32)


class _Payload:
    """A pickle that touches ``marker`` when it is loaded: the attacker's code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, mlflow_store):
    """The coordinator's store: a registered cxr-cls model logged by the product, and a pickled
    one as an older version of the product logged it."""
    root = tmp_path_factory.mktemp("coordinator")
    previous = mlflow.get_tracking_uri()
    uri = mlflow_store(root)
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("handover", artifact_location=(root / "art").as_uri())
    torch.manual_seed(0)
    task = task_class("cxr-cls")
    model = task.model_for_run(SETTINGS)
    metadata = model_metadata("cxr-cls", SETTINGS, False, task.main_metric)
    with mlflow.start_run(experiment_id=experiment):
        model_uri = log_task_model(model, "best-model", task.example_input(SETTINGS), metadata)
        version = register_version(model_uri, "handover-best", {})
        old_uri = mlflow.pytorch.log_model(model, name="old-model", metadata=metadata,
                                           serialization_format="pickle",
                                           pip_requirements=["torch"]).model_uri
    yield {"uri": uri, "version": version, "old": old_uri, "model": model,
           "folder": Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=str(root / "dl")))}
    mlflow.set_tracking_uri(previous)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_cxr_site(tmp_path_factory.mktemp("hospital") / "site", 4, seed=2, num_test=2)


def _predict(model: str, site: Path, out: Path, tracking_uri: str) -> int:
    """``make predict`` against the store ``tracking_uri``; the process's store is kept."""
    previous = mlflow.get_tracking_uri()
    try:
        return predict_cli.main(["--model", model, "--data", str(site), "--out", str(out),
                                 "--device", "cpu", "--tracking-uri", tracking_uri])
    finally:
        mlflow.set_tracking_uri(previous)


def _probabilities(out: Path) -> list[str]:
    with (out / "predictions.csv").open(newline="") as handle:
        return [row["probability"] for row in csv.DictReader(handle)]


def test_a_model_folder_holding_a_crafted_pickle_is_refused_and_runs_nothing(
        store, site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found 4: replacing the weights of a model folder with a pickle ran its code."""
    folder = shutil.copytree(store["folder"], tmp_path / "model")
    weights = max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    marker = tmp_path / "attacker-ran"
    weights.write_bytes(pickle.dumps(_Payload(marker), protocol=4))
    assert _predict(str(folder), site, tmp_path / "out", store["uri"]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert weights.relative_to(folder).as_posix() in err and "pickle" in err
    assert not (tmp_path / "out").exists()


def test_a_pickle_beside_the_weights_is_refused_by_its_name(store, tmp_path: Path) -> None:
    folder = shutil.copytree(store["folder"], tmp_path / "model")
    (folder / "artifacts" / "extra.bin").write_bytes(b"\x00\x01")
    with pytest.raises(ModelSourceError, match=r"artifacts/extra\.bin.*pickle"):
        load_logged_model(str(folder))


def test_a_copied_model_folder_predicts_without_the_coordinators_store(
        store, site: Path, tmp_path: Path) -> None:
    """Found 6: ``make predict MODEL=/copied/folder`` looked its id up in the coordinator's store."""
    folder = shutil.copytree(store["folder"], tmp_path / "elsewhere" / "best-model")
    absent = tmp_path / "no-store" / "mlflow.db"
    absent.parent.mkdir()
    assert _predict(str(folder), site, tmp_path / "offline", f"sqlite:///{absent}") == 0
    assert not absent.exists()
    assert _predict(store["version"], site, tmp_path / "online", store["uri"]) == 0
    assert _probabilities(tmp_path / "offline") == _probabilities(tmp_path / "online")
    assert len(_probabilities(tmp_path / "offline")) == 6


def test_predict_never_creates_a_store_and_names_the_one_it_searched(
        store, site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found 6: ``make predict`` silently created an empty mlflow.db and failed without naming it."""
    absent = tmp_path / "mlflow.db"
    assert _predict(store["version"], site, tmp_path / "out", f"sqlite:///{absent}") == 2
    err = capsys.readouterr().err
    assert not absent.exists()
    assert f"sqlite:///{absent}" in err and "does not exist" in err
    assert _predict("models:/no-such-model/1", site, tmp_path / "out", store["uri"]) == 2
    assert store["uri"] in capsys.readouterr().err


def test_a_pickled_model_of_an_older_store_is_refused_with_what_to_do(store) -> None:
    """Found 4: older stores hold pickled modules; they are refused, not unpickled."""
    with pytest.raises(ModelSourceError) as caught:
        load_logged_model(store["old"])
    message = str(caught.value)
    assert "model.pth" in message and "pickle" in message and "re-run" in message


def test_the_logged_folder_is_weights_and_metadata(store) -> None:
    folder: Path = store["folder"]
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert "artifacts/model.safetensors" in names
    assert not [n for n in names if n.endswith((".pkl", ".pickle", ".pth", ".pt", ".bin"))]
    logged = load_logged_model(str(folder))
    entry = mlflow.models.Model.load(str(folder)).metadata[METADATA_KEY]
    assert entry["weights"] == "safetensors" and entry["version"]
    assert (logged.task, logged.settings, logged.run_id) == ("cxr-cls", SETTINGS,
                                                             mlflow.models.Model.load(str(folder)).run_id)
    for key, value in store["model"].state_dict().items():
        assert torch.equal(logged.model.state_dict()[key], value)
