"""Found item 2 of #28: loss queries cannot be differenced to one patient, are refused where
the site requires DP, and are answered at most ``max-queries`` times per federation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from clients.site.instruction import Instruction
from clients.site.policy import DpRules, PolicyRefusal, SitePolicy
from clients.site.site_round import answer
from strategies.wire import message_keys as keys
from strategies.wire.model_layout import unpack_model
from tests.clients.site_round_fixtures import TinyCxr, packed_global, run_settings, site

RUN = run_settings()
MIN_BATCH = dataclasses.replace(SitePolicy.permissive(), min_batch_size=4)
torch.manual_seed(0)
GLOBAL = packed_global()  # one model for every query


def _query(tmp_path, tasks, subset: int, policy: SitePolicy = MIN_BATCH,
           federation: str = "fed-1") -> float:
    instruction = Instruction.parse("query", {keys.LOSS_SUBSET: subset,
                                              keys.FEDERATION: federation}, RUN, "run-1")
    reply = answer(instruction, GLOBAL, site(tmp_path, policy), RUN, tasks)
    return reply.metrics[keys.QUERY_LOSS]


def _single_losses() -> list[float]:
    """The loss of every training example alone (what the attack wants to learn)."""
    task = TinyCxr()
    model = task.build_model()
    model.load_state_dict({k: torch.as_tensor(v) for k, v in
                           unpack_model(GLOBAL).items()})
    model.eval()
    loss_fn = task.loss_fn()
    with torch.no_grad():
        return [float(loss_fn(model(x[None]), y[None])) for x, y in
                (task.train_set[i] for i in range(len(task.train_set)))]


def test_the_difference_of_two_subset_losses_is_no_single_patients_loss(tmp_path, tasks):
    singles = _single_losses()
    differenced = []
    for _ in range(3):  # the attack of #28: 5 * L5 - 4 * L4
        differenced.append(5 * _query(tmp_path, tasks, 5) - 4 * _query(tmp_path, tasks, 4))
    hits = [any(d == pytest.approx(s, abs=1e-5) for s in singles) for d in differenced]
    assert not all(hits)  # a prefix of one seeded permutation: all three hit perm[4]
    repeated = {round(_query(tmp_path, tasks, 4), 6) for _ in range(6)}
    assert len(repeated) > 1  # the same query draws a new subset each time


def test_a_site_that_requires_dp_answers_no_loss_query(tmp_path, tasks):
    strict = dataclasses.replace(MIN_BATCH, dp=DpRules(required=True))
    with pytest.raises(PolicyRefusal) as refused:
        _query(tmp_path, tasks, 0, strict)
    assert refused.value.rule == "dp.required"


def test_queries_per_dataset_are_bounded_by_max_queries(tmp_path, tasks):
    budget = dataclasses.replace(MIN_BATCH, max_queries=2)
    for _ in range(2):
        _query(tmp_path, tasks, 0, budget)
    with pytest.raises(PolicyRefusal) as refused:
        _query(tmp_path, tasks, 0, budget)
    assert refused.value.rule == "max-queries"
    with pytest.raises(PolicyRefusal) as refused:  # a budget per dataset (issue #46)
        _query(tmp_path, tasks, 0, budget, federation="fed-2")
    assert refused.value.rule == "max-queries"
