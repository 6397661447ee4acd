"""pvFed at a site: aligned data, the local model and encoder, the redefined output layer."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from clients.manifests.load_report import LoadReport
from clients.site.policy import PolicyRefusal
from clients.training.classification import LabelledTensors
from clients.training.site_task import TaskSettings
from clients.vertical.alignment import save_alignment, save_refusal
from clients.vertical.pvfed_site import ENCODE, pvfed_local, pvfed_round
from clients.vertical.pvfed_state import ENCODER_FILE, HEAD_FILE, LOCAL_FILE, PvFedState
from clients.vertical.site_data import aligned_data
from clients.vertical.stages import VerticalRequest
from models.pvfed import IdEncoder, encoder_arrays, fit_id_encoder
from strategies.wire.errors import SiteError
from strategies.wire.vertical_options import VerticalOptions

FEATURES, WIDTH, PATIENTS = 5, 8, 60
SPLIT_OF = ["train"] * 36 + ["val"] * 12 + ["test"] * 12


class TinyTask:
    """A tabular-like classification task in memory: ``(1, 5)`` rows, one label, ids by split."""

    manifest_name = "table.csv"

    def __init__(self, site_dir: Path, signal: float = 1.0, noise_seed: int = 1) -> None:
        self.latent = np.random.default_rng(0).normal(size=PATIENTS)
        rng = np.random.default_rng(noise_seed)
        x = rng.normal(size=(PATIENTS, FEATURES))
        x[:, 0] = signal * self.latent + rng.normal(scale=0.5, size=PATIENTS)
        y = (self.latent > 0).astype(np.float32)[:, None]
        self.site_dir, self.report = site_dir, LoadReport()
        sets = {}
        for split in ("train", "val", "test"):
            rows = [i for i in range(PATIENTS) if SPLIT_OF[i] == split]
            self.report.loaded.extend(f"p{i}" for i in rows)
            sets[split] = LabelledTensors([x[i] for i in rows], [y[i] for i in rows])
        self.train_set, self.val_set, self.test_set = sets["train"], sets["val"], sets["test"]

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(FEATURES, WIDTH), nn.ReLU(),
                             nn.Linear(WIDTH, 1))

    @staticmethod
    def loss_fn() -> nn.Module:
        return nn.BCEWithLogitsLoss()


#: Aligned order: every patient but p3 and p7, reversed (not the task's order).
ALIGNED = [f"p{i}" for i in reversed(range(PATIENTS)) if i not in (3, 7)]
OPTIONS = VerticalOptions(local_epochs=30, encoder_epochs=150, head_epochs=40, hidden=16)


def site_of(tmp_path: Path, task: TinyTask, department: str = "clinic") -> SimpleNamespace:
    state = tmp_path / f"state-{department}"
    state.mkdir(exist_ok=True)
    return SimpleNamespace(
        name=f"{department}-site", department=department, task_name="cxr-cls", state_dir=state,
        settings=TaskSettings(batch_size=8), lr=0.01, optimizer="adam", momentum=0.9, seed=5,
        compute=SimpleNamespace(device=torch.device("cpu")), task=lambda: task)


def request(site, stage: str, arrays=None, config=None, server_round: int = 1) -> VerticalRequest:
    return VerticalRequest(stage=stage, federation="fed-a", server_round=server_round,
                           config=config or {}, arrays=arrays or {}, options=OPTIONS, site=site)


def test_aligned_data_is_in_the_alignment_order_with_each_split_positions(tmp_path):
    task = TinyTask(tmp_path)
    data = aligned_data(task, ALIGNED)
    assert data.ids == tuple(ALIGNED) and data.inputs.shape == (58, 1, FEATURES)
    for position in (0, 10, 57):
        index = int(ALIGNED[position][1:])
        assert float(data.labels[position, 0]) == float(task.latent[index] > 0)
    assert {split: len(p) for split, p in data.positions.items()} == {
        "train": 34, "val": 12, "test": 12}
    assert all(SPLIT_OF[int(ALIGNED[p][1:])] == "test" for p in data.positions["test"])


def test_aligned_data_refuses_an_id_the_task_did_not_load(tmp_path):
    with pytest.raises(SiteError, match="1 of the 3 aligned patients"):
        aligned_data(TinyTask(tmp_path), ["p1", "p2", "nobody"])


def test_local_stage_trains_the_local_model_and_sends_the_local_encoder(tmp_path):
    site = site_of(tmp_path, TinyTask(tmp_path))
    save_alignment(site.state_dir, ALIGNED)
    reply = pvfed_local(request(site, "pvfed-local"))
    assert {k: v.shape for k, v in reply.arrays.items()} == {
        "embedding.weight": (58, 16), "output.weight": (WIDTH, 16), "output.bias": (WIDTH,)}
    assert reply.metrics["patients"] == 58 and reply.metrics["feature-width"] == WIDTH
    assert 0.5 < reply.metrics["local-test-auc"] <= 1.0
    assert 0.0 <= reply.metrics["local-val-auc"] <= 1.0
    assert np.isfinite(reply.metrics["encoder-loss"]) and reply.info == {"department": "clinic"}
    assert (site.state_dir / LOCAL_FILE).is_file() and (site.state_dir / ENCODER_FILE).is_file()
    local = PvFedState(site.state_dir).load_local()
    assert local.features.shape == (58, WIDTH) and local.metrics["local-test-auc"] == pytest.approx(
        reply.metrics["local-test-auc"])


def test_round_retrains_the_output_layer_on_the_global_vectors_and_own_features(tmp_path):
    task = TinyTask(tmp_path, signal=0.0)  # the site's own features say nothing of its label
    site = site_of(tmp_path, task)
    save_alignment(site.state_dir, ALIGNED)
    local = pvfed_local(request(site, "pvfed-local")).metrics
    # a global encoder that knows the latent state of every aligned patient (3 dims)
    latent = np.array([task.latent[int(p[1:])] for p in ALIGNED], np.float32)
    targets = np.column_stack([latent, np.zeros_like(latent), -latent])
    encoder = IdEncoder(58, 16, 3, seed=0)
    fit_id_encoder(encoder, targets, epochs=300, lr=0.02)
    reply = pvfed_round(request(site, "pvfed-round", encoder_arrays(encoder)))
    assert reply.metrics["head-inputs"] == 3 + WIDTH
    assert reply.metrics["pvfed-test-auc"] > 0.9 > local["local-test-auc"]
    assert reply.metrics["local-test-auc"] == pytest.approx(local["local-test-auc"])
    assert reply.arrays == {} and (site.state_dir / HEAD_FILE).is_file()
    again = pvfed_round(request(site, "pvfed-round", encoder_arrays(encoder), {ENCODE: True}, 2))
    assert again.arrays["embedding.weight"].shape == (58, 16)
    assert np.isfinite(again.metrics["encoder-loss"]) and "pvfed-val-auc" in again.metrics


def test_round_refuses_a_global_encoder_of_other_patients(tmp_path):
    site = site_of(tmp_path, TinyTask(tmp_path))
    save_alignment(site.state_dir, ALIGNED)
    with pytest.raises(SiteError, match="pvfed-local"):  # no local step yet
        pvfed_round(request(site, "pvfed-round", encoder_arrays(IdEncoder(58, 4, 2))))
    pvfed_local(request(site, "pvfed-local"))
    with pytest.raises(SiteError, match="global encoder of 50 patients; this site aligned 58"):
        pvfed_round(request(site, "pvfed-round", encoder_arrays(IdEncoder(50, 4, 2))))
    with pytest.raises(SiteError, match="global encoder"):
        pvfed_round(request(site, "pvfed-round", {"embedding.weight": np.zeros((58, 4))}))


def test_a_refused_alignment_refuses_both_stages(tmp_path):
    site = site_of(tmp_path, TinyTask(tmp_path))
    save_refusal(site.state_dir, "2 shared patients, the minimum is 20")
    for stage, handler in (("pvfed-local", pvfed_local), ("pvfed-round", pvfed_round)):
        with pytest.raises(PolicyRefusal, match="vertical.min-intersection"):
            handler(request(site, stage))


def test_the_redefined_layer_starts_as_the_local_output_layer_so_val_auc_never_drops(tmp_path):
    site = site_of(tmp_path, TinyTask(tmp_path))
    save_alignment(site.state_dir, ALIGNED)
    pvfed_local(request(site, "pvfed-local"))
    noise = encoder_arrays(IdEncoder(58, 4, 3, seed=9))  # a global encoder that knows nothing
    reply = pvfed_round(request(site, "pvfed-round", noise))
    assert reply.metrics["pvfed-val-auc"] >= reply.metrics["local-val-auc"]


def test_a_task_whose_model_does_not_end_in_a_linear_is_refused_naming_it(tmp_path):
    task = TinyTask(tmp_path)
    task.build_model = lambda: nn.Sequential(nn.Flatten(), nn.Linear(FEATURES, 1), nn.Sigmoid())
    site = site_of(tmp_path, task)
    save_alignment(site.state_dir, ALIGNED)
    with pytest.raises(SiteError, match="clinic .task cxr-cls.: pvFed needs a model whose last"):
        pvfed_local(request(site, "pvfed-local"))
