"""SCAFFOLD (strategy.control-variates = "scaffold") through the in-process engine: the real
ServerApp and ClientApp on tiny synthetic chest X-ray hospitals. The server's control variate
c equals the mean of the sites' c_i over every site of the federation after each round (full
participation: a run resumed round by round, with new site objects each time, so the sites
read their c_i back from their state dirs; partial participation: a site never selected
holds c_i = 0 and still counts in N; a site whose policy refuses training, e.g. an
evaluate-only node, does not count in N)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from app.engine import VirtualSite, partition_sites, run_federation
from clients.cxr_cls.synthetic import generate_site, site_profiles
from clients.site.site_scaffold import CONTROL_NAME
from strategies.plugins.control_variates.control_variate_round import ControlVariateRound
from tests.app.restored_strategy import restored_strategy

EVALUATE_ONLY = Path(__file__).resolve().parents[2] / "configs" / "site-policy-evaluate-only.toml"

SCAFFOLD = {"task": "cxr-cls", "local-steps": 3, "image-size": 32, "batch-size": 4,
            "node-wait-timeout": 5, "final-evaluation": False, "optimizer": "sgd",
            "lr": 0.05, "momentum": 0.0, "strategy.control-variates": "scaffold"}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tiny_hospitals(root: Path, count: int) -> None:
    for profile in site_profiles(count, seed=5):
        generate_site(root / profile.name, dataclasses.replace(profile, num_images=16), seed=5,
                      image_size=32, val_fraction=0.25)


def _server_c(folder: Path, overrides: dict) -> tuple[np.ndarray, int, str]:
    """The server's c restored from the federation's checkpoint, its N and the federation."""
    _, strategy = restored_strategy(folder, overrides)
    scaffold = strategy.train.feature(ControlVariateRound).control
    return scaffold.total / scaffold.sites, scaffold.sites, strategy.uplink.federation


def _site_controls(data: Path, federation: str, size: int) -> dict[str, np.ndarray]:
    """Each site's saved c_i (0 for a site that never trained), by site folder."""
    out = {}
    for site in sorted(p for p in data.iterdir() if p.is_dir()):
        path = site / ".fedmed-state" / federation / f"{CONTROL_NAME}.npy"
        out[site.name] = np.load(path) if path.is_file() else np.zeros(size, np.float32)
    return out


@pytest.fixture(scope="module")
def full_rounds(tmp_path_factory, mlflow_store):
    """Three rounds of two sites, one round per run (resumed), c and the c_i after each."""
    tmp = tmp_path_factory.mktemp("scaffold-full")
    _tiny_hospitals(tmp / "data", 2)
    common = {**SCAFFOLD, "data-root": str(tmp / "data"), "experiment": "scaffold",
              "tracking-uri": mlflow_store(tmp / "mlflow"),
              "artifact-root": str(tmp / "artifacts"), "checkpoint-dir": str(tmp / "ckpt")}
    after = []
    for rounds in (1, 2, 3):
        outcome = run_federation({**common, "num-server-rounds": rounds, "resume": rounds > 1},
                                 partition_sites(2))
        c, sites, federation = _server_c(tmp / "ckpt", {**common, "num-server-rounds": rounds})
        after.append((outcome, c, sites, _site_controls(tmp / "data", federation, c.size)))
    return after


def test_c_is_the_mean_of_the_sites_c_i_after_each_round(full_rounds):
    previous = None
    for rounds, (outcome, c, sites, controls) in enumerate(full_rounds, start=1):
        report = outcome.reports[rounds]
        assert sorted(report.train) == ["hospital-00", "hospital-01"], report.train_dropped
        assert sites == 2 and report.strategy["scaffold-replies"] == 2
        assert np.abs(c).max() > 0  # the sites moved: c is not trivially 0
        np.testing.assert_allclose(c, np.mean(list(controls.values()), axis=0), atol=1e-6)
        if previous is not None:  # the sites read their c_i back and moved on from it
            assert not np.allclose(c, previous)
        previous = c


def test_the_reply_carries_delta_c_next_to_the_update(full_rounds):
    outcome, c, _, _ = full_rounds[-1]
    traffic = outcome.reports[3].traffic
    for site, sent in traffic.items():
        # no codec: Delta c_i (float32 over the float arrays) about doubles what leaves
        assert sent["bytes-up"] > 1.8 * c.size * 4, (site, sent)


def test_partial_participation_counts_every_site_in_n(tmp_path, mlflow_store):
    _tiny_hospitals(tmp_path / "data", 3)
    overrides = {**SCAFFOLD, "num-server-rounds": 2, "selection.m": 1, "min-nodes": 3,
                 "data-root": str(tmp_path / "data"), "experiment": "scaffold-partial",
                 "tracking-uri": mlflow_store(tmp_path / "mlflow"),
                 "artifact-root": str(tmp_path / "artifacts"),
                 "checkpoint-dir": str(tmp_path / "ckpt")}
    outcome = run_federation(overrides, partition_sites(3))
    c, sites, federation = _server_c(tmp_path / "ckpt", overrides)
    controls = _site_controls(tmp_path / "data", federation, c.size)
    trained = {site for report in outcome.reports.values() for site in report.train}
    assert sites == 3 and 1 <= len(trained) <= 2
    assert np.abs(c).max() > 0
    np.testing.assert_allclose(c, sum(controls.values()) / 3, atol=1e-6)


def test_a_site_that_refuses_to_train_under_its_policy_is_not_counted_in_n(tmp_path,
                                                                          mlflow_store):
    _tiny_hospitals(tmp_path / "data", 3)
    folders = sorted(p for p in (tmp_path / "data").iterdir() if p.is_dir())
    sites = [VirtualSite.folder(f, site_name=f.name,
                                policy_path=EVALUATE_ONLY if f == folders[-1] else None)
             for f in folders]
    overrides = {**SCAFFOLD, "num-server-rounds": 2, "min-nodes": 3,
                 "data-root": str(tmp_path / "data"), "experiment": "scaffold-evaluate-only",
                 "tracking-uri": mlflow_store(tmp_path / "mlflow"),
                 "artifact-root": str(tmp_path / "artifacts"),
                 "checkpoint-dir": str(tmp_path / "ckpt")}
    outcome = run_federation(overrides, sites)
    assert sorted(outcome.reports[2].train) == [f.name for f in folders[:2]]
    assert "policy rule" in outcome.reports[2].train_dropped[folders[-1].name]
    c, n, federation = _server_c(tmp_path / "ckpt", overrides)
    controls = _site_controls(tmp_path / "data", federation, c.size)
    assert n == 2 and outcome.reports[2].strategy["scaffold-sites"] == 2
    assert not np.any(controls[folders[-1].name])  # it never trained: c_i = 0
    np.testing.assert_allclose(c, (controls[folders[0].name] + controls[folders[1].name]) / 2,
                               atol=1e-6)
