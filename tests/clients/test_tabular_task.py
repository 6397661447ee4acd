"""The tabular classification task: table.csv, missing values, the MLP, synthetic hospitals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from clients.errors import ManifestError
from clients.prediction.items import PredictionItem
from clients.registry import task_class
from clients.tabular.heart_variables import HEART_FEATURES
from clients.tabular.synthetic import generate_federation, patient_rows, site_profiles
from clients.tabular.task import TabularClsTask
from clients.training.trainer import select_device
from clients.training.site_task import SiteDataError, TaskSettings
from strategies.wire.errors import ConfigError

CPU = select_device("cpu")
SETTINGS = TaskSettings(batch_size=16)

TABLE = """patient_id,split,label,a,b
p1,train,1,1,
p2,train,0,3,5
p3,train,1,nan,7
p4,val,0,100,NaN
p5,val,1,x,1
p6,test,2,1,1
p7,test,1,2,inf
p8,test,0,2,2
"""


def _site(tmp_path: Path, text: str = TABLE) -> Path:
    (tmp_path / "table.csv").write_text(text)
    return tmp_path


def test_missing_values_take_the_train_median_and_an_indicator_then_train_statistics(tmp_path):
    task = TabularClsTask(_site(tmp_path), SETTINGS)
    assert task.features == ("a", "b") and task.input_width == 4
    # medians of the training rows only: a over (1, 3) = 2, b over (5, 7) = 6 (p4's 100 is val)
    assert task.scaling.medians.tolist() == [2.0, 6.0]
    train = torch.stack([x for x, _ in task.train_set]).reshape(3, 4).numpy()
    raw = np.array([[1, 6, 0, 1], [3, 5, 0, 0], [2, 7, 1, 0]], np.float64)  # imputed + indicators
    expected = (raw - raw.mean(0)) / raw.std(0)
    np.testing.assert_allclose(train, expected, rtol=1e-5)
    assert np.allclose(train.mean(0), 0.0, atol=1e-6)  # standardised on train
    val = task.val_set[0][0].reshape(4).numpy()  # p4: a = 100, b missing -> median 6
    np.testing.assert_allclose(val, (np.array([100, 6, 0, 1]) - raw.mean(0)) / raw.std(0), rtol=1e-5)


def test_bad_rows_are_skipped_and_counted_by_split_in_file_order(tmp_path, caplog):
    task = TabularClsTask(_site(tmp_path), SETTINGS)
    assert task.report.loaded == ["p1", "p2", "p3", "p4", "p8"]  # train, val, test order
    assert set(task.report.skipped) == {"p5", "p6", "p7"}
    assert "a = 'x' is not a number" in task.report.skipped["p5"]
    assert "label '2' is not 0 or 1" in task.report.skipped["p6"]
    assert "b = 'inf' is infinite" in task.report.skipped["p7"]
    assert "table.csv: line 6 (patient p5)" in caplog.text
    assert [len(task.train_set), len(task.val_set), len(task.test_set)] == [3, 1, 1]


@pytest.mark.parametrize("text, match", [
    ("patient_id,split,a,b\np1,train,1,2\n", r"table\.csv: bad header 'patient_id,split,a,b'"),
    ("patient_id,split,label\np1,train,1\n", r"at least one feature column"),
    ("patient_id,split,label,a,a\np1,train,1,2,3\n", r"each named once"),
    ("patient_id,split,label,a\np1,train,1\n", r"table\.csv: line 2: expected 4 fields, got 3"),
    ("patient_id,split,label,a\np1,train,1,2\np1,val,0,3\n", r"duplicate patient_id 'p1'"),
])
def test_a_malformed_table_is_a_manifest_error_naming_the_file(tmp_path, text, match):
    with pytest.raises(ManifestError, match=match):
        TabularClsTask(_site(tmp_path, text), SETTINGS)


def test_a_table_without_usable_rows_or_with_several_labels_is_refused(tmp_path):
    with pytest.raises(SiteDataError, match=r"table\.csv: no usable patient in any split"):
        TabularClsTask(_site(tmp_path, "patient_id,split,label,a\np1,train,7,1\n"), SETTINGS)
    with pytest.raises(ConfigError, match="'num-labels' must be 1 for task 'tabular-cls'"):
        TabularClsTask(_site(tmp_path), TaskSettings(num_labels=2))


def test_the_network_of_the_standard_columns_and_of_a_site_s_own():
    model = TabularClsTask.model_for(SETTINGS)
    assert isinstance(model[-1], nn.Linear) and model[-1].out_features == 1
    assert model[1].in_features == 2 * len(HEART_FEATURES) == 26
    assert TabularClsTask.example_input(SETTINGS).shape == (1, 26)
    assert model(torch.zeros(5, 1, 26)).shape == (5, 1)


@pytest.fixture(scope="module")
def synthetic_sites(tmp_path_factory) -> list[Path]:
    return generate_federation(tmp_path_factory.mktemp("tabular"), 2, seed=3)


def test_trains_through_the_site_task_and_reports_auc(synthetic_sites):
    torch.manual_seed(0)
    task = task_class("tabular-cls")(synthetic_sites[0], SETTINGS)
    assert task.features == HEART_FEATURES and task.report.skipped == {}
    model = task.build_model()
    before = task.evaluate(model, CPU).metrics["auc"]
    result = task.train(model, steps=60, lr=1e-2, momentum=0.9, compute=CPU, seed=0)
    assert result.steps_done == 60
    after = task.evaluate(model, CPU)
    assert set(after.metrics) == {"accuracy", "auc"} and after.num_examples == len(task.val_set)
    assert after.metrics["auc"] > 0.8 and after.metrics["auc"] > before


def test_a_site_with_other_columns_builds_its_own_width(tmp_path):
    task = TabularClsTask(_site(tmp_path), SETTINGS)
    model = task.build_model()
    assert model[1].in_features == 4 and isinstance(model[-1], nn.Linear)
    assert model(torch.stack([x for x, _ in task.train_set])).shape == (3, 1)


def test_predicts_each_row_as_in_training(synthetic_sites):
    site = synthetic_sites[1]
    task = TabularClsTask(site, SETTINGS)
    model = task.build_model().eval()
    items = TabularClsTask.manifest_items(site, "val", SETTINGS)
    assert [i.item_id for i in items] == task.report.loaded[len(task.train_set):][:len(items)]
    predictor = TabularClsTask.predictor(model, SETTINGS, CPU, site)
    with torch.no_grad():
        expected = torch.sigmoid(model(task.val_set[0][0][None])).item()
    row = predictor.predict(items[0])
    assert row.cells[0] == pytest.approx(expected, abs=1e-6)
    assert row.cells[1] == int(task.val_set[0][1].item())
    with pytest.raises(Exception, match="row not usable"):
        predictor.predict(PredictionItem("nobody", items[0].image))


def test_synthetic_hospitals_differ_are_reproducible_and_have_missing_cells(tmp_path):
    profiles = site_profiles(3, seed=1)
    assert len({p.num_patients for p in profiles}) == 3 and all(200 <= p.num_patients < 400
                                                                for p in profiles)
    values, labels = patient_rows(profiles[0], 7)
    assert values.shape == (profiles[0].num_patients, 13) and 0 < np.isnan(values).mean() < 0.2
    assert 0.1 < labels.mean() < 0.9
    first = generate_federation(tmp_path / "a", 2, seed=4)
    again = generate_federation(tmp_path / "b", 2, seed=4)
    assert [(s / "table.csv").read_bytes() for s in first] == [(s / "table.csv").read_bytes()
                                                              for s in again]
    generate_federation(tmp_path / "a", 2, seed=5)  # an earlier synthetic hospital is replaced
    (tmp_path / "real" / "hospital-00").mkdir(parents=True)
    (tmp_path / "real" / "hospital-00" / "table.csv").write_text("patient_id,split,label,a\n")
    with pytest.raises(FileExistsError, match="not a synthetic hospital"):
        generate_federation(tmp_path / "real", 1, seed=0)
