"""pvFed's coordinator: the global-encoder step against a hand PCA, and its rounds over sites."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.vertical.federation import VerticalContext
from app.vertical.messages import StageAnswer
from app.vertical.pvfed_flow import GLOBAL_PREFIX, global_step, run_pvfed
from clients.vertical.alignment import save_alignment
from clients.vertical.stages import VERTICAL_STAGES, VerticalRequest
from models.pvfed import IdEncoder, encoder_arrays, encoder_from_arrays, fit_id_encoder
from strategies.wire.errors import ReplyError
from strategies.wire.vertical_options import VerticalOptions
from tests.clients.test_pvfed_site import ALIGNED, OPTIONS, TinyTask, site_of


def local_encoder(outputs: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """A site's local encoder distilled to ``outputs`` (its vectors are then Z_k)."""
    encoder = IdEncoder(len(outputs), 16, outputs.shape[1], seed=seed)
    fit_id_encoder(encoder, outputs, epochs=50, lr=0.02)
    return encoder_arrays(encoder)


def test_global_step_with_pca_mimics_the_hand_computed_components():
    rng = np.random.default_rng(3)
    locals_ = {"clinic": local_encoder(rng.normal(size=(6, 2)), 0),
               "lab": local_encoder(rng.normal(size=(6, 2)) * 3, 1)}
    # by hand: Z = [Z_1 Z_2] from the encoders, standardised, eigh of its covariance
    z = np.concatenate([encoder_from_arrays(arrays).vectors().astype(np.float64)
                        for arrays in locals_.values()], axis=1)
    zs = (z - z.mean(axis=0)) / z.std(axis=0)
    values, vectors = np.linalg.eigh(zs.T @ zs / 5)
    top = vectors[:, np.argsort(values)[::-1][:2]]
    top *= np.sign(top[np.abs(top).argmax(axis=0), [0, 1]])  # the stated sign rule
    expected = zs @ top
    options = VerticalOptions(aggregation="pca", dim=2, hidden=32, global_epochs=600,
                              encoder_lr=0.02)
    step = global_step(locals_, options, seed=0, server_round=1)
    np.testing.assert_allclose(step.targets, expected, atol=1e-4)
    np.testing.assert_allclose(step.encoder.vectors(), expected, atol=0.02)
    assert step.loss < 1e-4
    again = global_step(locals_, options, seed=0, server_round=2, previous=step.encoder)
    assert again.encoder is step.encoder  # warm start: the same encoder trained on


def test_global_step_names_a_site_whose_encoder_is_malformed():
    bad = {"clinic": local_encoder(np.zeros((6, 2)), 0), "lab": {"embedding.weight": np.ones(3)}}
    with pytest.raises(ReplyError, match="local encoder of lab"):
        global_step(bad, VerticalOptions(dim=2), seed=0, server_round=1)


class RoutedContext:
    """A coordinator context whose stages go straight to the sites' registered handlers."""

    def __init__(self, sites: dict[int, object], options: VerticalOptions, rounds: int) -> None:
        self.sites, self.options, self.seed = sites, options, 0
        self.nodes = sorted(sites)
        self.departments = {node: site.department for node, site in sites.items()}
        self.config = type("Config", (), {"num_server_rounds": rounds})()
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.stages: list[str] = []
        self.checkpoint, self.intersection = None, 0

    def send(self, stage, requests, server_round, required=True):
        self.stages.append(stage)
        answers = {}
        for node, (config, arrays) in requests.items():
            reply = VERTICAL_STAGES.get(stage)(VerticalRequest(
                stage, "fed-a", server_round, dict(config), dict(arrays), self.options,
                self.sites[node]))
            answers[node] = StageAnswer(node, reply.arrays, reply.metrics, reply.info)
        return answers

    def log(self, step, metrics):
        self.logged.append((step, dict(metrics)))

    department = VerticalContext.department
    log_sites = VerticalContext.log_sites
    first_round = VerticalContext.first_round
    resumed_state = VerticalContext.resumed_state
    save_round = VerticalContext.save_round


def test_pvfed_rounds_give_a_site_the_information_another_holds(tmp_path):
    # the clinic's own features say nothing of its label; the lab's say much of the same latent
    sites = {1: site_of(tmp_path, TinyTask(tmp_path, signal=0.0, noise_seed=1), "clinic"),
             2: site_of(tmp_path, TinyTask(tmp_path, signal=2.0, noise_seed=2), "lab")}
    for site in sites.values():
        save_alignment(site.state_dir, ALIGNED)
    ctx = RoutedContext(sites, replace(OPTIONS, aggregation="pca", dim=4, global_epochs=300),
                        rounds=2)
    result = run_pvfed(ctx)
    assert ctx.stages == ["pvfed-local", "pvfed-round", "pvfed-round"]
    assert [step for step, _ in ctx.logged] == [0, 1, 2]
    clinic = result.site_metrics["clinic"]
    assert clinic["pvfed-test-auc"] > clinic["local-test-auc"] + 0.1
    final = ctx.logged[-1][1]
    assert final["clinic/pvfed-test-auc"] == clinic["pvfed-test-auc"]
    assert final["pvfed-test-auc"] == pytest.approx(
        (clinic["pvfed-test-auc"] + result.site_metrics["lab"]["pvfed-test-auc"]) / 2)
    assert final["clinic/head-inputs"] == 4 + 8 and np.isfinite(final["global-encoder-loss"])
    assert result.arrays[f"{GLOBAL_PREFIX}embedding.weight"].shape == (58, OPTIONS.hidden)
