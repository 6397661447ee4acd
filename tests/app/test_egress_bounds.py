"""What the egress filter assumes of the product holds, so it never refuses a genuine reply:
the codecs' largest payloads, the task models' raw arrays, the policy's rule names."""

from __future__ import annotations

import numpy as np
import pytest

from app.site_runtime.egress_arrays import MAX_PAYLOAD_BYTES_PER_ENTRY, PAYLOAD_HEAD_BYTES
from app.site_runtime.egress_records import policy_rules
from app.site_runtime.egress_refusal import RULES, EgressRefusal
from clients.registry import TASKS, task_class
from clients.training.site_task import TaskSettings
from strategies.compression import encode, names
from strategies.rounds.normalisation_statistics import StatisticPositions

#: Every registered codec's most expensive specs (per entry): a new codec must add its own.
WORST_SPECS = {"none": ("none",), "fp16": ("fp16",), "sign": ("sign",),
               "topk": ("topk:1.0", "topk:1.0:layer"), "randk": ("randk:1.0",),
               "qsgd": ("qsgd:32767", "qsgd:1:b1", "qsgd:32767:b1")}


def test_every_codec_stays_within_the_byte_budget_per_entry():
    assert sorted(WORST_SPECS) == sorted(names())
    vector = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    for specs in WORST_SPECS.values():
        for spec in specs:
            payload = encode(vector, spec, seed=1, segments=[300, 700])
            assert payload.size <= MAX_PAYLOAD_BYTES_PER_ENTRY * vector.size + PAYLOAD_HEAD_BYTES


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_array_a_site_sends_raw_is_a_normalisation_statistic_or_an_integer(task):
    model = task_class(task).model_for(TaskSettings())
    parameters = {name for name, _ in model.named_parameters()}
    state = model.state_dict()
    arrays = [value.numpy() for value in state.values()]
    statistics = set(StatisticPositions.of(list(state), arrays).estimates)
    raw_floats = {i for i, name in enumerate(state)
                  if name not in parameters and arrays[i].dtype.kind == "f"}
    assert raw_floats == statistics


def test_the_rules_sites_name_are_policy_rules():
    named = {"min-val-items", "evaluate-trains", "dp.max-epsilon", "max-queries",
             "allowed-tasks", "vertical.allowed", "vertical.min-intersection",
             "vertical.share-labels", "share-finetuned-model", "min-batch-size",
             "secure-aggregation.min-participants", "apps"}
    assert named <= policy_rules() and "fingerprint" not in policy_rules()


def test_every_rule_is_named_under_egress():
    assert all(rule.startswith("egress.") for rule in RULES)
    with pytest.raises(ValueError, match="unknown egress rule"):
        EgressRefusal("egress.anything", "detail")
