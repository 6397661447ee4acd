"""Found item 3 of #28: an evaluate message trains on patient data only under the train rules.

``personalisation.method = finetune`` adapts the global model on the training split at
evaluation. The site's ``evaluate-trains`` rule decides whether it may; when it may, the
adaptation passes the train rules (batch size, steps, DP) and is charged to the ledger.
"""

from __future__ import annotations

import dataclasses

import pytest

from clients.site.instruction import Instruction
from clients.site.policy import DpRules, PolicyRefusal, SitePolicy
from clients.site.privacy_ledger import PrivacyLedger
from clients.site.site_round import answer
from clients.training.private_training import DpSettings
from clients.training.site_task import TaskSettings
from strategies.wire import message_keys as keys
from strategies.wire.personalisation_options import PersonalisationOptions
from tests.clients.site_round_fixtures import packed_global, run_settings, site

FINETUNE = PersonalisationOptions(method="finetune", finetune_steps=3)
#: The researcher's run of the attack: batches of 1 (min-batch-size refuses its training).
ATTACK = run_settings(sizes=TaskSettings(image_size=16, batch_size=1), personalisation=FINETUNE)
SHIPPED = dataclasses.replace(SitePolicy.permissive(), min_batch_size=4, evaluate_trains=False)


def _answer(kind: str, policy: SitePolicy, run, tmp_path, tasks, private: bool = False):
    instruction = Instruction.parse(kind, {keys.SERVER_ROUND: 1, keys.FEDERATION: "fed-1"},
                                    run, "run-1")
    return answer(instruction, packed_global(private), site(tmp_path, policy), run, tasks)


def test_the_attack_train_refused_evaluate_does_not_train(tmp_path, tasks):
    with pytest.raises(PolicyRefusal, match="min-batch-size"):
        _answer("train", SHIPPED, ATTACK, tmp_path, tasks)
    reply = _answer("evaluate", SHIPPED, ATTACK, tmp_path, tasks)
    assert keys.VAL_LOSS in reply.metrics  # the global model's metrics leave
    assert not any(name.startswith("personalised-") for name in reply.metrics)
    assert reply.site[keys.WITHHELD] == "evaluate-trains"


def test_an_allowed_adaptation_still_passes_the_train_rules(tmp_path, tasks):
    allowed = dataclasses.replace(SHIPPED, evaluate_trains=True)
    reply = _answer("evaluate", allowed, ATTACK, tmp_path, tasks)
    assert not any(name.startswith("personalised-") for name in reply.metrics)
    assert reply.site[keys.WITHHELD] == "min-batch-size"
    few_steps = dataclasses.replace(allowed, min_local_steps=5)
    fair = run_settings(personalisation=FINETUNE)  # batches of 4
    reply = _answer("evaluate", few_steps, fair, tmp_path, tasks)
    assert reply.site[keys.WITHHELD] == "min-local-steps"  # 3 adaptation steps < 5
    reply = _answer("evaluate", allowed, fair, tmp_path, tasks)
    assert "personalised-val-loss" in reply.metrics and keys.WITHHELD not in reply.site


def test_an_adaptation_at_a_dp_site_is_dp_sgd_charged_to_the_ledger(tmp_path, tasks):
    dp_site = dataclasses.replace(SHIPPED, evaluate_trains=True,
                                  dp=DpRules(required=True, max_epsilon=100.0))
    plain = run_settings(personalisation=FINETUNE)
    reply = _answer("evaluate", dp_site, plain, tmp_path, tasks)
    assert reply.site[keys.WITHHELD] == "dp.required"
    private = dataclasses.replace(plain, privacy=DpSettings(noise_multiplier=1.5))
    reply = _answer("evaluate", dp_site, private, tmp_path, tasks, private=True)
    assert "personalised-val-loss" in reply.metrics
    assert reply.metrics[keys.EPSILON] > 0
    assert reply.metrics[keys.EPSILON_LEFT] == pytest.approx(100.0 - reply.metrics[keys.EPSILON])
    ledger = PrivacyLedger.of_site(tmp_path / "state", tmp_path / "data", "rdp")
    assert [(e.federation, e.kind, e.steps) for e in ledger.entries] == [
        ("fed-1", "evaluate-adapt", 3)]


def test_too_few_studies_withhold_the_metrics_naming_min_val_items(tmp_path, tasks):
    strict = dataclasses.replace(SitePolicy.permissive(), min_val_items=5)
    reply = _answer("evaluate", strict, run_settings(), tmp_path, tasks)
    assert keys.VAL_LOSS not in reply.metrics
    assert reply.site[keys.WITHHELD] == "min-val-items"
