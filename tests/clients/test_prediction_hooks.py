"""The prediction hooks every task implements: items of a site or plain folder, the predictor,
the preprocessing text; app/ asks the task through them and names none (issue 27, point 7)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from clients.prediction.classifier import ClassifierPredictor
from clients.prediction.items import PredictionItem
from clients.prediction.predictor import OUTPUTS
from clients.registry import TASKS, task_class
from clients.training.trainer import select_device
from clients.training.site_task import TaskSettings
from strategies.wire.run_keys import RUN_KEYS

CPU = select_device("cpu")
APP = Path(__file__).resolve().parents[2] / "app"


class _MeanLogit(nn.Module):
    """Logits = the input's mean per label (a classifier whose scores the test knows)."""

    def __init__(self, num_labels: int) -> None:
        super().__init__()
        self.num_labels = num_labels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1).mean(1, keepdim=True).repeat(1, self.num_labels)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_describes_its_preprocessing_and_predicts_into_a_known_output(name, tmp_path):
    task = task_class(name)
    settings = TaskSettings(image_size=24, slab_slices=5, volume_depth=6, num_labels=2)
    text = task.preprocessing_text(settings)
    assert "{" not in text and ("24" in text or "{image_size}" not in task.preprocessing)
    predictor = task.predictor(task.model_for(settings).eval(), settings, CPU, tmp_path)
    assert predictor.table in OUTPUTS and predictor.columns
    assert predictor.metric() is None  # nothing predicted yet
    assert task.manifest_name.endswith(".csv")


def test_a_plain_radiograph_folder_holds_image_files_only(tmp_path: Path) -> None:
    (tmp_path / "ward-b").mkdir()
    for name in ("ward-b/b.DCM", "a.png", "notes.txt", "scan.nii.gz", "ward-b/c.jpeg", ".d.png"):
        (tmp_path / name).write_bytes(b"")
    items = task_class("cxr-cls").folder_items(tmp_path)
    assert [i.item_id for i in items] == ["a.png", "ward-b/b.DCM", "ward-b/c.jpeg"]
    assert all(i.split == "" and i.labels is None and i.reference is None for i in items)


def test_manifest_items_keep_rows_with_bad_labels_without_a_reference(tmp_path: Path, caplog) -> None:
    (tmp_path / "images.csv").write_text("image_id,split,image,labels\n"
                                         "a,train,images/a.png,1\nb,val,images/b.png,7\n"
                                         "c,val,images/c.png,\n")
    cxr = task_class("cxr-cls").manifest_items(tmp_path, None, TaskSettings())
    assert [(i.item_id, i.split) for i in cxr] == [("a", "train"), ("b", "val"), ("c", "val")]
    assert cxr[0].labels.tolist() == [1.0] and cxr[1].labels is None and cxr[2].labels is None
    assert "No reference labels for b" in caplog.text
    (tmp_path / "labels.csv").write_text("study_id,split,image,label\n"
                                         "s1,test,v/s1.npy,0\ns2,test,v/s2.npy,x\ns3,val,v/s3.npy,1\n")
    ct = task_class("ct3d-cls").manifest_items(tmp_path, "test", TaskSettings())
    assert [i.item_id for i in ct] == ["s1", "s2"] and ct[0].image == tmp_path.resolve() / "v/s1.npy"
    assert ct[0].labels.tolist() == [0.0] and ct[1].labels is None


def test_the_classifier_predictor_scores_rows_and_the_macro_auc() -> None:
    images = {f"i{k}": np.full((4, 4), k / 10, np.float32) for k in range(4)}
    predictor = ClassifierPredictor(_MeanLogit(2), lambda path: images[path.name], 2, CPU)
    assert predictor.columns == ("probability_0", "probability_1", "label_0", "label_1",
                                 "predicted_0", "predicted_1")
    labels = {"i0": [0, 0], "i1": [0, 1], "i2": [1, 0], "i3": [1, 1]}
    rows = [predictor.predict(PredictionItem(k, Path(k), labels=np.array(v, np.float32)))
            for k, v in labels.items()]
    assert rows[0].cells[:2] == pytest.approx([0.5, 0.5]) and rows[0].cells[2:4] == [0, 0]
    assert rows[0].cells[4:] == [1, 1]  # predicted: probability >= 0.5
    assert rows[3].cells[:2] == pytest.approx([1 / (1 + np.exp(-0.3))] * 2)
    assert rows[3].cells[2:] == [1, 1, 1, 1] and rows[3].note == "p = 0.574, 0.574"
    # label 0: positives i2, i3 score above negatives i0, i1 (AUC 1); label 1: i1, i3 vs i0, i2
    # (pairs i1>i0, i1<i2, i3>i0, i3>i2: AUC 3/4); macro = 7/8
    assert predictor.metric() == pytest.approx(0.875)
    unlabelled = predictor.predict(PredictionItem("i0", Path("i0")))
    assert unlabelled.cells[2:4] == [None, None] and predictor.metric() == pytest.approx(0.875)


def test_app_names_no_task() -> None:
    """No app/ code names a task (docstrings may show examples): the run config's default
    task is a row of the run-key table (strategies/wire/run_keys.py)."""
    names = set(TASKS)
    found = []
    for path in sorted(APP.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                           ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        found += [f"{path.relative_to(APP.parent)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in names
                  and id(node) not in docstrings]
    assert not found, found
    assert RUN_KEYS["task"].default in names
