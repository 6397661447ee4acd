"""make predict PERSONAL=... (issue 16, item 2): a site's personalised model, at that site.

A tiny radiograph model (32 px, BatchNorm) on a small synthetic site: FedBN puts the
site's saved layers onto the logged model; the adapting methods adapt it on the site's
training data with the seed of the end-of-federation test evaluation; clear errors
name the file or the run's key.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import numpy as np
import pytest
import torch

import app.predict as predict_cli
from app.config.run_config import RunConfig
from app.config.site_config import SiteConfig
from app.model_source import LoggedModel, load_logged_model
from app.tracking.model_logging import log_task_model, model_metadata
from clients.site.instruction import SiteRunSettings
from clients.training.personalisation.site_personalisation import site_personalisation
from app.prediction.personalised import (federation_of, personalise, run_config_from_params,
                                         site_of)
from clients.registry import task_class
from clients.site.state_store import SiteStateStore
from clients.training.trainer import select_device
from clients.training.personalisation.local_layers import LocalLayers, local_state_names
from clients.training.site_task import TaskSettings
from strategies.wire.errors import ConfigError
from tests.clients.small_sites import small_cxr_site

SETTINGS = TaskSettings(image_size=32, batch_size=4)
CPU = select_device("cpu")
FINETUNE = {"task": "cxr-cls", "image-size": 32, "batch-size": 4, "optimizer": "sgd",
            "momentum": 0.0, "lr": 0.05, "num-server-rounds": 3, "seed": 5,
            "personalisation.method": "finetune", "personalisation.finetune-steps": 2}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic radiograph site: 9 train, 3 val and 2 test images of 32 px."""
    return small_cxr_site(tmp_path_factory.mktemp("personal") / "hospital-03", 12, seed=4, num_test=2)


def _logged() -> LoggedModel:
    torch.manual_seed(0)
    return LoggedModel(task_class("cxr-cls").model_for(SETTINGS).eval(), "cxr-cls", SETTINGS,
                       False, "test")


def _params(values: dict) -> dict[str, str]:
    """The MLflow params of a run with run config ``values`` (strings, as MLflow holds them)."""
    return {key: str(value) for key, value in RunConfig.from_mapping(values).as_params().items()}


def _no_params() -> dict[str, str]:
    raise AssertionError("the run's params are not needed")


def _state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def test_fedbn_puts_the_sites_layers_on_the_logged_model(site: Path, tmp_path: Path):
    logged = _logged()
    before = _state(logged.model)
    names = local_state_names(logged.model)
    trained = copy.deepcopy(logged.model)
    with torch.no_grad():
        for name in names:
            value = trained.state_dict()[name]
            value.copy_(value + 1 if value.is_floating_point() else value + 3)
    state_dir = tmp_path / "state"
    LocalLayers(SiteStateStore(state_dir), "run-abc").keep(trained)
    sited = SiteConfig("hospital-a", site, state_dir)
    personal = personalise(logged, sited, "run-abc", _no_params, CPU)
    assert personal.method == "fedbn" and "fedbn-local-layers.npy" in personal.note
    got, want = _state(personal.model), _state(trained)
    assert names and all(np.array_equal(got[n], want[n]) for n in names)
    assert all(np.array_equal(got[n], before[n]) for n in before if n not in names)
    assert all(np.array_equal(v, before[k]) for k, v in _state(logged.model).items())


def test_missing_state_or_no_personalisation_is_a_clear_error(site: Path, tmp_path: Path):
    sited = SiteConfig("hospital-a", site, tmp_path / "state")
    with pytest.raises(ConfigError, match=r"state/run-abc/fedbn-local-layers\.npy: no such file"):
        personalise(_logged(), sited, "run-abc",
                    lambda: _params({"personalisation.method": "fedbn"}), CPU)
    with pytest.raises(ConfigError, match="personalisation.method = 'none'"):
        personalise(_logged(), sited, "run-abc", lambda: _params({}), CPU)


def test_adapting_gives_the_model_the_site_evaluated_at_the_end(site: Path):
    logged = _logged()
    sited = site_of(site)  # a site folder: the simulation's name and state dir
    assert sited.name == "hospital-03" and sited.state_dir == site / ".fedmed-state"
    personal = personalise(logged, sited, "run-abc", lambda: _params(FINETUNE), CPU)
    assert personal.method == "finetune"
    assert "adapted 2 step(s) on 9 training example(s)" in personal.note

    config = RunConfig.from_mapping(FINETUNE)  # what the site did for personalised-test-<m>
    task = task_class("cxr-cls")(site, SETTINGS)
    at_site = site_personalisation(config.personalisation_options, None, "").personalised(
        task, _logged().model, CPU, SiteRunSettings.from_run_config(config.as_params()), "hospital-03", 4)
    got, want, start = _state(personal.model), _state(at_site), _state(logged.model)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert any(not np.array_equal(got[k], start[k]) for k in start)


def test_run_params_read_back_as_the_run_config():
    values = {**FINETUNE, "final-evaluation": False, "strategy.codec": "fp16"}
    assert run_config_from_params(_params(values)) == RunConfig.from_mapping(values)
    assert run_config_from_params({"site/a/policy": "f00"}) == RunConfig()
    with pytest.raises(ConfigError, match="run param 'lr' = 'fast' is not a float"):
        run_config_from_params({"lr": "fast"})


def test_personal_names_a_node_config_or_a_site_folder(site: Path, tmp_path: Path):
    node = tmp_path / "node.toml"
    node.write_text(f'data-path = "{site}"\nstate-dir = "{tmp_path / "s"}"\nsite-name = "b"\n')
    assert site_of(node) == SiteConfig("b", site, tmp_path / "s")
    with pytest.raises(ConfigError, match=r"PERSONAL .*nowhere: no such site folder"):
        site_of(tmp_path / "nowhere")
    (tmp_path / "bad.toml").write_text('state-dir = "/x"\n')
    with pytest.raises(ConfigError, match="bad.toml: the node config has no 'data-path'"):
        site_of(tmp_path / "bad.toml")


def test_cli_predicts_with_the_personalised_model(site: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(predict_cli, "load_logged_model", lambda uri: _logged())
    monkeypatch.setattr(predict_cli, "federation_of",
                        lambda logged: ("run-abc", lambda: _params(FINETUNE)))
    common = ["--model", "m", "--data", str(site), "--split", "test", "--device", "cpu"]
    assert predict_cli.main([*common, "--out", str(tmp_path / "global")]) == 0
    assert predict_cli.main([*common, "--out", str(tmp_path / "own"), "--personal", str(site)]) == 0
    rows = {name: list(csv.DictReader((tmp_path / name / "predictions.csv").open()))
            for name in ("global", "own")}
    assert len(rows["own"]) == len(rows["global"]) == 2
    assert [r["probability"] for r in rows["own"]] != [r["probability"] for r in rows["global"]]


def test_the_federation_is_the_run_that_logged_the_model(mlflow_store, tmp_path: Path):
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_store(tmp_path / "store"))
    try:
        with mlflow.start_run() as run:
            mlflow.log_params({"personalisation.method": "fedbn", "lr": "0.01"})
            uri = log_task_model(_logged().model, "best-model",
                                 task_class("cxr-cls").example_input(SETTINGS),
                                 model_metadata("cxr-cls", SETTINGS, False, "auc"))
        federation, params = federation_of(load_logged_model(uri))
        assert federation == run.info.run_id
        assert params()["personalisation.method"] == "fedbn"
        folder = mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "copy"))
        federation, params = federation_of(load_logged_model(folder))  # a copied folder records its run
        assert federation == run.info.run_id
        mlflow.set_tracking_uri(mlflow_store(tmp_path / "other"))
        with pytest.raises(ConfigError, match=f"run {federation} is not readable from the "
                                              "tracking store sqlite:///"):
            params()
        absent = tmp_path / "absent" / "mlflow.db"
        mlflow.set_tracking_uri(f"sqlite:///{absent}")
        with pytest.raises(ConfigError, match=f"tracking store sqlite:///{absent} does not exist"):
            params()
        assert not absent.parent.exists()
    finally:
        mlflow.set_tracking_uri(previous)
    with pytest.raises(ConfigError, match="MODEL test: the model records no MLflow run"):
        federation_of(_logged())
