"""The site policy's [secure-aggregation] section: loading (key named) and its three rules."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clients.site.policy import PolicyRefusal, SecAggRules, SitePolicy, load_policy
from clients.site.policy_check import Request, check_evaluate, check_query, check_train
from tests.clients.policy_files import policy_refusal, write_policy

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
OPEN = SitePolicy.permissive()
REQUIRED = replace(OPEN, secure_aggregation=SecAggRules(required=True, min_participants=4,
                                                         min_threshold=0.6))
PLAIN = Request(task="cxr-cls", image_size=16, batch_size=4, local_steps=3)
#: A setup stage: 5 participants, each with 4 neighbours: threshold 3 of the 5 holders of a
#: site's shares (its neighbours and itself; 0.6 >= 0.6).
STAGE = replace(PLAIN, secagg_stage="setup", secagg_participants=5, secagg_neighbours=4,
                secagg_threshold=3)


def test_the_section_is_read_and_missing_keys_keep_the_permissive_values(tmp_path):
    policy = load_policy(write_policy(tmp_path, "[secure-aggregation]\nrequired = true\n"
                                                "min-participants = 4\nmin-threshold = 0.6\n"))
    assert policy.secure_aggregation == SecAggRules(True, 4, 0.6)
    assert load_policy(write_policy(tmp_path, "min-batch-size = 2\n", "b.toml")
                       ).secure_aggregation == SecAggRules()
    assert OPEN.secure_aggregation == SecAggRules(required=False, min_participants=2,
                                                  min_threshold=0.5)
    assert policy.fingerprint != load_policy(write_policy(
        tmp_path, "[secure-aggregation]\nrequired = false\n", "c.toml")).fingerprint
    shipped = load_policy(CONFIGS / "site-policy.toml").secure_aggregation
    assert shipped.min_participants >= 2 and shipped.min_threshold >= 0.5


@pytest.mark.parametrize("text, key", [
    ("[secure-aggregation]\nrequire = true\n", "'secure-aggregation.require'"),
    ("[secure-aggregation]\nrequired = 1\n", "'secure-aggregation.required' must be true"),
    ("[secure-aggregation]\nmin-participants = 1\n",
     "'secure-aggregation.min-participants' must be >= 2"),
    ("[secure-aggregation]\nmin-participants = 2.5\n",
     "'secure-aggregation.min-participants' must be a whole number"),
    ("[secure-aggregation]\nmin-threshold = 0.4\n",
     "'secure-aggregation.min-threshold' must be in \\[0.5, 1\\]"),
    ("[secure-aggregation]\nmin-threshold = 1.5\n",
     "'secure-aggregation.min-threshold' must be in \\[0.5, 1\\]"),
    ("secure-aggregation = 1\n", "'secure-aggregation' must be a table"),
])
def test_a_bad_value_is_refused_naming_the_key(tmp_path, text, key):
    path, error = policy_refusal(tmp_path, text, key)
    assert str(path) in str(error)


def test_a_plain_train_is_refused_where_secure_aggregation_is_required():
    check_train(OPEN, PLAIN)
    with pytest.raises(PolicyRefusal) as info:
        check_train(REQUIRED, PLAIN)
    assert info.value.rule == "secure-aggregation.required"
    check_train(REQUIRED, STAGE)
    check_evaluate(REQUIRED, PLAIN)  # no update leaves with an evaluation or a loss query
    check_query(REQUIRED, PLAIN)


@pytest.mark.parametrize("stage", ["setup", "share-keys", "collect", "unmask"])
@pytest.mark.parametrize("change, rule", [
    ({"secagg_participants": 3}, "secure-aggregation.min-participants"),
    ({"secagg_threshold": 2}, "secure-aggregation.min-threshold"),  # 2/5 < 0.6
    ({"secagg_summed": 3}, "secure-aggregation.min-participants"),  # the unmask's survivors
])
def test_a_stage_below_the_policy_is_refused_naming_the_rule(stage, change, rule):
    request = replace(STAGE, secagg_stage=stage, **change)
    with pytest.raises(PolicyRefusal) as info:
        check_train(REQUIRED, request)
    assert info.value.rule == rule
    assert str(info.value).startswith(f"policy rule {rule}: ")


def test_the_threshold_is_always_a_strict_majority_of_the_holders():
    check_train(OPEN, replace(STAGE, secagg_participants=7, secagg_neighbours=5,
                              secagg_threshold=4))
    with pytest.raises(PolicyRefusal, match="secure-aggregation.min-threshold"):
        # 3 of 6 holders: half (min-threshold 0.5 holds) but no majority
        check_train(OPEN, replace(STAGE, secagg_participants=7, secagg_neighbours=5,
                                  secagg_threshold=3))
    with pytest.raises(PolicyRefusal, match="secure-aggregation.min-participants"):
        check_train(OPEN, replace(STAGE, secagg_participants=1))


def test_a_stage_still_passes_the_train_rules():
    with pytest.raises(PolicyRefusal) as info:
        check_train(replace(REQUIRED, min_batch_size=8), STAGE)
    assert info.value.rule == "min-batch-size"


def test_a_threshold_exactly_at_the_minimum_fraction_is_answered():
    at = replace(OPEN, secure_aggregation=SecAggRules(min_threshold=0.56))
    check_train(at, replace(STAGE, secagg_participants=30, secagg_neighbours=24,
                            secagg_threshold=14))  # 14/25 = 0.56 (0.56 * 25 > 14 in floats)
    with pytest.raises(PolicyRefusal, match="secure-aggregation.min-threshold"):
        check_train(at, replace(STAGE, secagg_participants=30, secagg_neighbours=24,
                                secagg_threshold=13))
