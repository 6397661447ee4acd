"""The site policy file: loading, validation (file and key named), fingerprint."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from clients.site.policy import (DpRules, PolicyRefusal, SitePolicy, SitePolicyError,
                                 load_policy)
from strategies.wire.errors import ConfigError, SiteError
from tests.clients.policy_files import policy_refusal, write_policy

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_shipped_default_is_strict_and_permissive_file_matches_the_class():
    default = load_policy(CONFIGS / "site-policy.toml")
    assert default.min_batch_size >= 4 and default.min_val_items >= 1
    assert math.isfinite(default.max_local_steps) and math.isfinite(default.dp.max_epsilon)
    assert default.dp.delta <= 1e-5 and default.dp.min_noise_multiplier > 0
    assert default.dp.allows_accountant("rdp") and default.dp.allows_accountant("prv")
    permissive = load_policy(CONFIGS / "site-policy-permissive.toml")
    assert permissive == SitePolicy.permissive()
    assert default.fingerprint != permissive.fingerprint


def test_missing_keys_take_the_permissive_values(tmp_path):
    policy = load_policy(write_policy(tmp_path, "min-batch-size = 8\n[dp]\nmax-epsilon = 3.0\n"))
    assert policy.min_batch_size == 8 and policy.dp == DpRules(max_epsilon=3.0)
    assert policy.allows_task("pe-seg") and policy.allows_codec("topk")
    assert policy.max_local_steps == math.inf


@pytest.mark.parametrize("text, key", [
    ("min-batchsize = 8\n", "'min-batchsize'"),
    ("[dp]\nepsilon = 8.0\n", "'dp.epsilon'"),
])
def test_unknown_key_is_refused_naming_file_and_key(tmp_path, text, key):
    path, error = policy_refusal(tmp_path, text, key)
    assert str(path) in str(error) and isinstance(error, ConfigError)


@pytest.mark.parametrize("text, key", [
    ("min-batch-size = 0\n", "'min-batch-size' must be >= 1"),
    ("min-batch-size = \"8\"\n", "'min-batch-size' must be a number"),
    ("max-local-steps = 2.5\n", "'max-local-steps' must be a whole number"),
    ("max-time-budget = -1.0\n", "'max-time-budget' must be >= 0"),
    ("answer-queries = \"yes\"\n", "'answer-queries' must be true or false"),
    ("allowed-tasks = [\"mri-seg\"]\n", "'allowed-tasks' has unknown names"),
    ("allowed-codecs = \"topk\"\n", "'allowed-codecs' must be a list"),
    ("[dp]\ndelta = 2.0\n", "'dp.delta' must be in \\(0, 1\\]"),
    ("[dp]\naccountants = [\"gdp\"]\n", "'dp.accountants' has unknown names"),
    ("[dp]\nmax-epsilon = nan\n", "'dp.max-epsilon' must be >= 0"),
    ("min-local-steps = 5\nmax-local-steps = 4\n", "'min-local-steps' exceeds"),
    ("dp = 1\n", "'dp' must be a table"),
    ("min-batch-size = \n", "not valid TOML"),
])
def test_bad_value_is_refused_naming_the_key(tmp_path, text, key):
    path, error = policy_refusal(tmp_path, text, key)
    assert str(path) in str(error)


def test_unreadable_file_names_the_file(tmp_path):
    with pytest.raises(SitePolicyError, match="unreadable"):
        load_policy(tmp_path / "absent.toml")


def test_fingerprint_depends_on_the_rules_not_on_the_layout(tmp_path):
    a = load_policy(write_policy(tmp_path, "min-batch-size = 8\n", "a.toml"))
    b = load_policy(write_policy(tmp_path, "# comment\n\nmin-batch-size   =   8 # same rule\n"
                                     "min-local-steps = 1\n", "b.toml"))
    c = load_policy(write_policy(tmp_path, "min-batch-size = 9\n", "c.toml"))
    d = load_policy(write_policy(tmp_path, "[dp]\nrequired = true\n", "d.toml"))
    assert a.fingerprint == b.fingerprint
    assert len({a.fingerprint, c.fingerprint, d.fingerprint,
                SitePolicy.permissive().fingerprint}) == 4
    assert len(a.fingerprint) == 16 and int(a.fingerprint, 16) >= 0


def test_refusal_names_the_rule_and_is_a_site_error():
    refusal = PolicyRefusal("dp.max-epsilon", "epsilon 9.1 > 8.0")
    assert isinstance(refusal, SiteError) and refusal.rule == "dp.max-epsilon"
    assert str(refusal) == "policy rule dp.max-epsilon: epsilon 9.1 > 8.0"
