"""A vertical stage over the in-process grid and the real ClientApp: policy, names, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.engine.federation import full_run_config
from app.engine.grid import InProcessGrid
from app.engine.virtual_site import VirtualSite
from app.vertical.messages import Traffic, VerticalError, send_stage
from clients.site.policy import SitePolicy, VerticalRules, load_policy
from strategies.wire.errors import ConfigError
from strategies.wire.vertical_options import VerticalOptions, split_vertical

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
pytestmark = pytest.mark.usefixtures("server_identity")


def _grid(tmp_path: Path, policies: list[Path | None], site_files: list[str]) -> InProcessGrid:
    sites = []
    for i, (policy, text) in enumerate(zip(policies, site_files)):
        folder = tmp_path / f"site-{i}"
        folder.mkdir(parents=True)
        if text:
            (folder / "vertical-site.toml").write_text(text)
        sites.append(VirtualSite.folder(folder, site_name=f"hospital-{i}",
                                        state_dir=tmp_path / f"state-{i}", policy_path=policy))
    return InProcessGrid(sites, full_run_config({"federation.kind": "vertical"}), run_id=42)


def _describe(grid: InProcessGrid, traffic: Traffic | None = None):
    nodes = sorted(grid.get_node_ids())
    return nodes, send_stage(grid, "describe", {n: ({}, {}) for n in nodes}, federation="fed-1",
                             server_round=0, timeout=30.0, traffic=traffic or Traffic())


def test_describe_names_each_sites_department_and_task(tmp_path):
    grid = _grid(tmp_path, [None, None], ['task = "cxr-cls"\ndepartment = "radiology"\n', ""])
    nodes, answers = _describe(grid)
    assert answers[nodes[0]].info == {"department": "radiology", "task": "cxr-cls"}
    assert answers[nodes[1]].info == {"department": "hospital-1", "task": "pe-seg"}


def test_a_policy_file_without_a_vertical_section_refuses_naming_the_rule(tmp_path):
    grid = _grid(tmp_path, [None, CONFIGS / "site-policy.toml"], ["", ""])
    with pytest.raises(VerticalError, match=r"hospital-1.*policy rule vertical\.allowed"):
        _describe(grid)


def test_unknown_stage_and_bad_site_file_are_error_replies(tmp_path):
    grid = _grid(tmp_path, [None], ['task = "no-such-task"\n'])
    with pytest.raises(VerticalError, match="ConfigError"):
        _describe(grid)
    grid = _grid(tmp_path / "b", [None], [""])
    node = next(iter(grid.get_node_ids()))
    with pytest.raises(VerticalError, match="'no-such-stage'.*ConfigError"):
        send_stage(grid, "no-such-stage", {node: ({}, {})}, federation="f", server_round=1,
                   timeout=30.0, traffic=Traffic())


def test_traffic_counts_the_arrays_each_way(tmp_path):
    grid = _grid(tmp_path, [None], [""])
    node = next(iter(grid.get_node_ids()))
    traffic = Traffic()
    send_stage(grid, "describe", {node: ({"x": 1}, {"a": np.zeros(10, np.float32)})},
               federation="f", server_round=1, timeout=30.0, traffic=traffic)
    assert (traffic.downlink_bytes, traffic.uplink_bytes, traffic.messages) == (40, 0, 1)
    assert traffic.by_stage["describe"]["downlink-bytes"] == 40


def test_vertical_rules_in_the_policy_files(tmp_path):
    assert load_policy(CONFIGS / "site-policy.toml").vertical == VerticalRules(
        allowed=False, min_intersection=20, share_labels=False)
    assert SitePolicy.permissive().vertical.allowed
    path = tmp_path / "p.toml"
    path.write_text("[vertical]\nallowed = true\nmin-intersection = 0\n")
    with pytest.raises(ConfigError, match="vertical.min-intersection"):
        load_policy(path)


def test_vertical_options_name_the_key():
    assert split_vertical({"vertical.dim": 3, "seed": 1}) == (VerticalOptions(dim=3), {"seed": 1})
    with pytest.raises(ConfigError, match="vertical.aggregation"):
        VerticalOptions(aggregation="max")
    with pytest.raises(ConfigError, match="federation.kind"):
        full_run_config({"federation.kind": "diagonal"})
