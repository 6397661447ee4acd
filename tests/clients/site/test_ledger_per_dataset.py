"""Found item 1 of #28: the epsilon budget is one per site and dataset, not per federation.

The coordinator chooses the federation id; a new id must not buy a new budget.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from clients.site.instruction import Instruction
from clients.site.policy import DpRules, PolicyRefusal, SitePolicy
from clients.site.privacy_ledger import PrivacyLedger, dataset_id
from clients.site.site_round import answer
from clients.training.private_training import DpSettings
from strategies.wire import message_keys as keys
from tests.clients.site_round_fixtures import packed_global, run_settings, site

DP_RUN = run_settings(privacy=DpSettings(noise_multiplier=1.5))


def _train(federation: str, server_round: int, policy: SitePolicy, tmp_path, tasks):
    instruction = Instruction.parse("train", {keys.SERVER_ROUND: server_round,
                                              keys.FEDERATION: federation}, DP_RUN, "run-1")
    return answer(instruction, packed_global(private=True), site(tmp_path, policy), DP_RUN,
                  tasks)


def _budget(max_epsilon: float) -> SitePolicy:
    return dataclasses.replace(SitePolicy.permissive(), dp=DpRules(max_epsilon=max_epsilon))


def test_a_new_federation_id_does_not_reset_the_budget(tmp_path, tasks):
    open_budget = _budget(float("inf"))
    first = _train("fed-1", 1, open_budget, tmp_path, tasks).metrics
    second = _train("fed-1", 2, open_budget, tmp_path, tasks).metrics
    assert second[keys.EPSILON] > first[keys.EPSILON] > 0
    assert keys.EPSILON_LEFT not in second  # no budget: no (infinite) metric
    budget = _budget(second[keys.EPSILON] * 1.01)  # room for no third round
    for federation, server_round in (("fed-1", 3), ("fed-2", 1), ("fed-3", 1)):
        with pytest.raises(PolicyRefusal) as refused:
            _train(federation, server_round, budget, tmp_path, tasks)
        assert refused.value.rule == "dp.max-epsilon"
    ledger = PrivacyLedger.of_site(tmp_path / "state", tmp_path / "data", "rdp")
    assert [entry.federation for entry in ledger.entries] == ["fed-1", "fed-1"]


def test_the_ledger_lives_under_privacy_by_dataset_and_replies_say_what_is_left(tmp_path,
                                                                               tasks):
    reply = _train("fed-9", 1, _budget(50.0), tmp_path, tasks).metrics
    spent = reply[keys.EPSILON]
    assert reply[keys.EPSILON_ROUND] == pytest.approx(spent)
    assert reply[keys.EPSILON_LEFT] == pytest.approx(50.0 - spent)
    digest = hashlib.sha256(str((tmp_path / "data").resolve()).encode()).hexdigest()[:16]
    assert dataset_id(tmp_path / "data") == digest
    folder = tmp_path / "state" / "privacy" / digest
    entries = json.loads((folder / "history.json").read_text())["entries"]
    assert [(e["federation"], e["kind"]) for e in entries] == [("fed-9", "train")]
    assert entries[0]["steps"] == 3 and entries[0]["noise-multiplier"] == 1.5
    assert not (tmp_path / "state" / "fed-9" / "dp-history.npy").exists()
