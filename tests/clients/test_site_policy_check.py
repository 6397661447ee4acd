"""Each rule of the site policy refuses the request that breaks it, naming the rule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clients.site.policy import DpRules, PolicyRefusal, SitePolicy
from clients.site.policy_check import (Request, check_adaptation, check_evaluate, check_query,
                                       check_train, releases_val_metrics)

OPEN = SitePolicy.permissive()
GOOD = Request(task="pe-seg", image_size=64, batch_size=8, codec="topk:0.05", local_steps=20,
               time_budget=60.0, loss_subset=0, dp_noise_multiplier=1.0,
               dp_max_grad_norm=1.0, dp_delta=1e-5)
STRICT = replace(OPEN, allowed_tasks=("pe-seg",), allowed_codecs=("topk", "qsgd"),
                 min_batch_size=8, min_local_steps=10, max_local_steps=50,
                 max_time_budget=120.0, min_image_size=32, max_image_size=128,
                 dp=DpRules(required=True, min_noise_multiplier=0.8, max_grad_norm=2.0,
                            delta=1e-5, max_epsilon=8.0, accountants=("rdp",)))
#: STRICT without its DP requirement: a site that requires DP answers no loss query.
QUERIES = replace(STRICT, dp=replace(STRICT.dp, required=False))


def test_a_request_within_every_rule_is_answered():
    check_train(STRICT, GOOD)
    check_evaluate(STRICT, GOOD)
    check_query(QUERIES, GOOD)
    for check in (check_train, check_evaluate, check_query):
        check(OPEN, replace(GOOD, batch_size=1, local_steps=1, codec="none", time_budget=0.0,
                            dp_noise_multiplier=0.0, loss_subset=1))


@pytest.mark.parametrize("change, rule", [
    ({"task": "cxr-cls"}, "allowed-tasks"),
    ({"image_size": 16}, "min-image-size"),
    ({"image_size": 256}, "max-image-size"),
    ({"codec": "none"}, "allowed-codecs"),
    ({"codec": "sign"}, "allowed-codecs"),
    ({"batch_size": 1}, "min-batch-size"),
    ({"local_steps": 1}, "min-local-steps"),
    ({"local_steps": 51}, "max-local-steps"),
    ({"time_budget": 121.0}, "max-time-budget"),
    ({"time_budget": 0.0}, "max-time-budget"),  # no budget = unbounded
    ({"dp_noise_multiplier": 0.0}, "dp.required"),
    ({"dp_noise_multiplier": 0.5}, "dp.min-noise-multiplier"),
    ({"dp_max_grad_norm": 5.0}, "dp.max-grad-norm"),
    ({"dp_delta": 1e-3}, "dp.delta"),
    ({"dp_accountant": "prv"}, "dp.accountants"),
])
def test_train_request_breaking_a_rule_is_refused_naming_it(change, rule):
    with pytest.raises(PolicyRefusal) as info:
        check_train(STRICT, replace(GOOD, **change))
    assert info.value.rule == rule
    assert str(info.value).startswith(f"policy rule {rule}: ")


def test_dp_parameters_are_checked_when_used_even_if_not_required():
    optional = replace(STRICT, dp=replace(STRICT.dp, required=False))
    check_train(optional, replace(GOOD, dp_noise_multiplier=0.0))
    with pytest.raises(PolicyRefusal, match="dp.max-grad-norm"):
        check_train(optional, replace(GOOD, dp_max_grad_norm=3.0))


@pytest.mark.parametrize("change, rule", [
    ({"task": "ct3d-cls"}, "allowed-tasks"),
    ({"image_size": 8}, "min-image-size"),
])
def test_evaluate_and_query_refuse_task_and_image_size(change, rule):
    for check, policy in ((check_evaluate, STRICT), (check_query, QUERIES)):
        with pytest.raises(PolicyRefusal) as info:
            check(policy, replace(GOOD, **change))
        assert info.value.rule == rule


def test_evaluate_ignores_the_training_rules():
    check_evaluate(STRICT, replace(GOOD, batch_size=1, local_steps=500, codec="none",
                                   dp_noise_multiplier=0.0))


def test_queries_are_refused_when_not_answered_or_on_a_tiny_subset():
    with pytest.raises(PolicyRefusal) as info:
        check_query(replace(QUERIES, answer_queries=False), GOOD)
    assert info.value.rule == "answer-queries"
    with pytest.raises(PolicyRefusal) as info:
        check_query(QUERIES, replace(GOOD, loss_subset=1))
    assert info.value.rule == "min-batch-size"
    check_query(QUERIES, replace(GOOD, loss_subset=8))
    with pytest.raises(PolicyRefusal) as info:
        check_query(STRICT, GOOD)  # dp.required: a loss is an un-noised answer
    assert info.value.rule == "dp.required"


@pytest.mark.parametrize("check", [check_train, check_evaluate, check_query])
@pytest.mark.parametrize("change, rule", [
    ({"volume_depth": 257}, "max-volume-depth"),
    ({"slab_slices": 33}, "max-slab-slices"),
    ({"study_bytes": 2**30 + 1}, "max-study-bytes"),
])
def test_every_kind_bounds_what_the_site_decodes(check, change, rule):
    bounded = replace(QUERIES, max_volume_depth=256, max_slab_slices=32, max_study_bytes=2**30)
    check(bounded, replace(GOOD, volume_depth=256, slab_slices=32, study_bytes=2**30))
    with pytest.raises(PolicyRefusal) as info:
        check(bounded, replace(GOOD, **change))
    assert info.value.rule == rule


def test_an_adaptation_at_evaluation_passes_the_training_rules():
    with pytest.raises(PolicyRefusal) as info:
        check_adaptation(replace(STRICT, evaluate_trains=False), GOOD)
    assert info.value.rule == "evaluate-trains"
    check_adaptation(STRICT, replace(GOOD, codec="none", time_budget=0.0))  # no codec, no budget
    for change, rule in (({"batch_size": 1}, "min-batch-size"),
                         ({"local_steps": 51}, "max-local-steps"),
                         ({"dp_noise_multiplier": 0.0}, "dp.required")):
        with pytest.raises(PolicyRefusal) as info:
            check_adaptation(STRICT, replace(GOOD, **change))
        assert info.value.rule == rule


def test_validation_metrics_leave_only_from_enough_items():
    policy = replace(OPEN, min_val_items=5)
    assert not releases_val_metrics(policy, 4)
    assert releases_val_metrics(policy, 5)
    assert releases_val_metrics(OPEN, 0)
