"""Where a site's policy comes from: node_config ``policy-path``, or in simulation the run config."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config.site_config import SiteConfig, SiteConfigError
from app.tooling.errors import FlowerProcessError
from app.site_runtime.supernode import node_config_string
from clients.site.policy import SitePolicy, load_policy


def test_deployment_reads_policy_path_and_ignores_the_run_config(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("min-batch-size = 8\n")
    node = {"data-path": str(tmp_path), "policy-path": str(policy)}
    site = SiteConfig.from_node_config(node, "", simulation_policy="/elsewhere/open.toml")
    assert site.policy_path == policy and site.policy() == load_policy(policy)
    bare = SiteConfig.from_node_config({"data-path": str(tmp_path)}, "", "/elsewhere/open.toml")
    assert bare.policy_path is None and bare.policy() == SitePolicy.permissive()


def test_a_relative_policy_path_is_refused_naming_the_key(tmp_path):
    with pytest.raises(SiteConfigError, match="node_config policy-path must be an absolute path"):
        SiteConfig.from_node_config({"data-path": str(tmp_path), "policy-path": "p.toml"}, "")
    with pytest.raises(SiteConfigError, match="run-config site-policy must be an absolute path"):
        SiteConfig.from_node_config({"partition-id": 0}, str(tmp_path), "p.toml")


def test_simulation_takes_one_file_or_a_folder_of_site_files(tmp_path):
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "hospital-01.toml").write_text("answer-queries = false\n")
    one = SiteConfig.from_node_config({"partition-id": 1}, str(tmp_path),
                                      str(folder / "hospital-01.toml"))
    assert one.policy_path == folder / "hospital-01.toml"
    own = SiteConfig.from_node_config({"partition-id": 1}, str(tmp_path), str(folder))
    other = SiteConfig.from_node_config({"partition-id": 0}, str(tmp_path), str(folder))
    assert not own.policy().answer_queries
    assert other.policy_path is None and other.policy() == SitePolicy.permissive()


def test_the_supernode_passes_only_the_policy_path(tmp_path):
    text = node_config_string(tmp_path / "data", tmp_path / "state", "hospital-a",
                              tmp_path / "policy.toml")
    assert text.endswith(f' policy-path="{tmp_path / "policy.toml"}"')
    assert "policy-path" not in node_config_string(tmp_path, tmp_path, "hospital-a")
    with pytest.raises(FlowerProcessError, match="policy path must be absolute"):
        node_config_string(tmp_path, tmp_path, "hospital-a", Path("policy.toml"))


def test_the_node_configs_step_cap_has_its_own_name(tmp_path):
    """Issue #45: node_config ``max-local-steps`` clamped silently while the policy rule of
    the same name refused; the clamp is ``local-steps-cap``, the old name refused by name."""
    from app.config.site_config import SiteConfig, SiteConfigError  # noqa: PLC0415

    node = {"data-path": str(tmp_path), "local-steps-cap": 5}
    assert SiteConfig.from_node_config(node, data_root="").local_steps_cap == 5
    with pytest.raises(SiteConfigError, match="renamed local-steps-cap"):
        SiteConfig.from_node_config({"data-path": str(tmp_path), "max-local-steps": 5}, "")
    with pytest.raises(SiteConfigError, match="local-steps-cap"):
        SiteConfig.from_node_config({**node, "local-steps-cap": -1}, "")
