"""The site decides (#30): its [secure-aggregation] rules refuse stages through the one check path.

Found: a site could not require secure aggregation, nor bound the participants or the
threshold of a round its update is summed in.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from app import client_app
from clients.site.instruction import Instruction
from clients.site.policy import PolicyRefusal, SecAggRules, SitePolicy
from clients.site.secure_state import STATE_FILE
from clients.site.site_round import SiteTasks, answer
from clients.training.trainer import select_device
from strategies.wire import message_keys as keys
from strategies.wire.secure_aggregation.settings import RoundPlan
from tests.app.site_messages import instruction as message
from tests.clients.site.secure_federation import FEDERATION, MODEL, instruction, sites
from tests.clients.policy_files import write_policy
from tests.clients.site_round_fixtures import TinyCxr, run_settings

RULES = SecAggRules(required=True, min_participants=4, min_threshold=0.75)
POLICY = replace(SitePolicy.permissive(), secure_aggregation=RULES)


def _stage(stage: str, participants: int = 5, neighbours: int = 4, threshold: int = 4,
           **entries) -> dict:
    plan = RoundPlan(1, 1, participants, neighbours, threshold, 16, 0.5)
    return {keys.SECAGG_STAGE: stage, **plan.entries(), **entries}


@pytest.fixture()
def untouched() -> tuple[SiteTasks, list]:
    """Site tasks that record every load (a refusal must come before any data is read)."""
    loads: list = []
    return SiteTasks(lambda *a, **k: loads.append(a) or TinyCxr(), select_device("cpu")), loads


def _refused(tmp_path, entries: dict, tasks: SiteTasks) -> str:
    run = run_settings()
    [member] = sites(tmp_path, 1, POLICY)
    config = {keys.FEDERATION: FEDERATION, keys.SERVER_ROUND: 1, **entries}
    with pytest.raises(PolicyRefusal) as info:
        answer(Instruction.parse("train", config, run, "run-1"), MODEL, member, run, tasks)
    assert not (member.state_dir / FEDERATION / STATE_FILE).exists()
    return info.value.rule


@pytest.mark.parametrize("entries, rule", [
    ({}, "secure-aggregation.required"),  # a plain train round
    (_stage(keys.SECAGG_SETUP, participants=3, neighbours=2, threshold=2),
     "secure-aggregation.min-participants"),
    (_stage(keys.SECAGG_SETUP, threshold=4, neighbours=5, participants=6),
     "secure-aggregation.min-threshold"),  # 4 of 6 holders < 0.75
    (_stage(keys.SECAGG_UNMASK, **{keys.SECAGG_SURVIVORS: [2, 3], keys.SECAGG_SUMMED: 3}),
     "secure-aggregation.min-participants"),  # 3 survivors summed < 4
])
def test_a_round_below_the_policy_is_refused_naming_the_rule(tmp_path, untouched, entries,
                                                             rule):
    tasks, loads = untouched
    assert _refused(tmp_path, entries, tasks) == rule
    assert loads == []


def test_a_setup_within_the_policy_is_answered(tmp_path, untouched):
    tasks, loads = untouched
    run = run_settings()
    [member] = sites(tmp_path, 1, POLICY)
    reply = answer(instruction(_stage(keys.SECAGG_SETUP), run), MODEL, member, run, tasks)
    assert set(reply.secagg) == {keys.SECAGG_KEY_C, keys.SECAGG_KEY_S,
                                 keys.SECAGG_KEY_SIGNATURE} and len(loads) == 1


@pytest.mark.usefixtures("site_identity")
def test_the_client_app_sends_the_entries_as_the_secagg_record(tmp_path, monkeypatch):
    monkeypatch.setattr(client_app, "_TASKS", SiteTasks(lambda *a, **k: TinyCxr(),
                                                        select_device("cpu")))
    context = Context(run_id=42, node_id=7, state=RecordDict(), run_config={
        "task": "cxr-cls", "image-size": 16, "batch-size": 4},
        node_config={"data-path": str(tmp_path / "site"), "site-name": "hospital-a",
                     "state-dir": str(tmp_path / "state"), "cache-decoded": False})
    reply = client_app.train(message("train", **_stage(keys.SECAGG_SETUP)), context)
    assert not reply.has_error(), reply.error
    record = reply.content[keys.SECAGG]
    assert isinstance(record, ConfigRecord) and len(record[keys.SECAGG_KEY_C]) == 32
    assert dict(reply.content[keys.METRICS]) == {keys.NUM_EXAMPLES: 12}
    assert (tmp_path / "state" / "run-42" / STATE_FILE).exists()
    tampered = message("train", **_stage(keys.SECAGG_SHARE_KEYS, **{keys.SERVER_ROUND: 2}))
    refusal = client_app.train(tampered, context)
    assert refusal.has_error() and "SecAggError" in refusal.error.reason
    assert "round" not in refusal.error.reason  # the text stays in the site's log


@pytest.mark.usefixtures("site_identity")
def test_the_client_app_refuses_a_plain_round_naming_the_rule(tmp_path):
    policy = write_policy(tmp_path, "[secure-aggregation]\nrequired = true\n")
    context = Context(run_id=42, node_id=7, state=RecordDict(), run_config={},
                      node_config={"data-path": str(tmp_path / "site"), "site-name": "hospital-a",
                                   "state-dir": str(tmp_path / "state"),
                                   "policy-path": str(policy)})
    reply = client_app.train(message("train"), context)
    assert reply.error.code == keys.POLICY_REFUSAL_CODE
    assert reply.error.reason == ("site hospital-a: policy rule secure-aggregation.required "
                                  "(refused)")
