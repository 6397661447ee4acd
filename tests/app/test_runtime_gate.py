"""The runtime decides before the app sees a message: the data rules, checked by the hospital's code.

Each test builds the message a (possibly malicious) coordinator sends and asks the
runtime's gate (:func:`app.site_runtime.runtime_gate.admit`), which must refuse what the
policy forbids whatever the app bundle would do, and plan the ledger's charge itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from app.site_runtime.dataset_census import DatasetCensus
from app.site_runtime.runtime_gate import SiteFacts, admit
from clients.site.policy import PolicyRefusal, load_policy
from clients.site.instruction import SiteRunSettings
from strategies.wire import message_keys as keys
from tests.app.site_messages import instruction
from tests.clients.policy_files import write_policy
from tests.clients.small_sites import small_cxr_site

@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """The ids Flower's Message needs, as the runner's pull sets them."""
    for name, value in (("_task_id", 3), ("_run_id", 1), ("_node_id", 7)):
        monkeypatch.setattr(TaskIdentity, name, value)


RUN = {"task": "cxr-cls", "image-size": 32, "batch-size": 4, "local-steps": 5,
       "num-server-rounds": 3}


def _gate(tmp_path: Path, policy_text: str, message: Message, run: dict | None = None,
          site: Path | None = None):
    site = site or tmp_path / "site"
    policy = load_policy(write_policy(tmp_path, policy_text))
    facts = SiteFacts("hospital-a", site, site / ".fedmed-state")
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(),
                      run_config={**RUN, **(run or {})})
    return admit(message, context, policy, facts, DatasetCensus(tmp_path / "runtime"))


def _refused(rule: str, *args, **kwargs) -> None:
    with pytest.raises(PolicyRefusal) as info:
        _gate(*args, **kwargs)
    assert info.value.rule == rule


def test_the_cross_site_fine_tune_is_refused_where_the_fine_tuned_model_stays(tmp_path):
    """Found item 2: a bundle whose own check was edited sent the fine-tuned model."""
    final = instruction("train", **{keys.LOCAL_STEPS: 5, keys.SERVER_ROUND: 4})
    _refused("share-finetuned-model", tmp_path, "share-finetuned-model = false\n", final)
    assert _gate(tmp_path, "share-finetuned-model = true\n", final).kind == "train"


@pytest.mark.parametrize("policy_text, config, run, rule", [
    ('allowed-tasks = ["pe-seg"]\n', {}, {}, "allowed-tasks"),
    ("max-local-steps = 3\n", {keys.LOCAL_STEPS: 4}, {}, "max-local-steps"),
    ("min-batch-size = 8\n", {}, {}, "min-batch-size"),
    ("max-image-size = 16\n", {}, {}, "max-image-size"),
    ('allowed-codecs = ["none"]\n', {keys.CODEC: "topk:0.1"}, {}, "allowed-codecs"),
    ("[dp]\nrequired = true\n", {}, {}, "dp.required"),
    ("[dp]\nmin-noise-multiplier = 1.0\n", {}, {"privacy.noise-multiplier": 0.5},
     "dp.min-noise-multiplier"),
    ("[secure-aggregation]\nrequired = true\n", {}, {}, "secure-aggregation.required"),
    ("share-control-variates = false\n", {keys.CONTROL_VARIATES: "scaffold"}, {},
     "share-control-variates"),
    ("share-pruning-gradients = false\n", {keys.PRUNING_REPORT: "none"}, {},
     "share-pruning-gradients"),
])
def test_every_training_rule_is_the_runtimes(tmp_path, policy_text, config, run, rule):
    message = instruction("train", **{keys.LOCAL_STEPS: 2, **config})
    _refused(rule, tmp_path, policy_text, message, run)


def test_queries_are_counted_by_the_runtime_and_capped(tmp_path):
    query = instruction("query", **{keys.FEDERATION: "fed-1"})
    _refused("answer-queries", tmp_path, "answer-queries = false\n", query)
    _refused("dp.required", tmp_path, "[dp]\nrequired = true\n", query)
    for _ in range(2):
        assert _gate(tmp_path, "max-queries = 2\n", query).kind == "query"
    _refused("max-queries", tmp_path, "max-queries = 2\n", query)
    counted = list((tmp_path / "site" / ".fedmed-state" / "runtime").rglob("*.json"))
    assert len(counted) == 1  # in the runtime's folder, never the worker's


def test_the_query_cap_belongs_to_the_dataset_not_the_federation(tmp_path):
    """Issue #46 found 5: with a cap of 2, fed-2 and fed-3 were answered after fed-1's refusal."""
    for _ in range(2):
        query = instruction("query", **{keys.FEDERATION: "fed-1"})
        assert _gate(tmp_path, "max-queries = 2\n", query).kind == "query"
    for federation in ("fed-1", "fed-2", "fed-3"):
        _refused("max-queries", tmp_path, "max-queries = 2\n",
                 instruction("query", **{keys.FEDERATION: federation}))
    other = tmp_path / "other-site"  # another dataset has its own count
    query = instruction("query", **{keys.FEDERATION: "fed-9"})
    assert _gate(tmp_path, "max-queries = 2\n", query, site=other).kind == "query"


def test_counts_an_earlier_version_kept_per_federation_still_count(tmp_path):
    import numpy as np
    old = tmp_path / "site" / ".fedmed-state" / "runtime" / "queries" / "fed-1"
    old.mkdir(parents=True)
    np.save(old / "queries-answered.npy", np.asarray(2, dtype=np.int64))
    _refused("max-queries", tmp_path, "max-queries = 2\n",
             instruction("query", **{keys.FEDERATION: "fed-2"}))


def test_vertical_stages_need_consent_and_keep_labels(tmp_path):
    def stage(name: str, **config) -> Message:
        record = ConfigRecord({keys.VERTICAL_STAGE: name, keys.FEDERATION: "v", **config})
        return Message(RecordDict({keys.CONFIG: record}), dst_node_id=7,
                       message_type=keys.VERTICAL_MESSAGE_TYPE)

    _refused("vertical.allowed", tmp_path, "min-batch-size = 1\n", stage("describe"))
    allowed = "[vertical]\nallowed = true\nshare-labels = false\n"
    assert _gate(tmp_path, allowed, stage("describe")).stage == "describe"
    vanilla = {"vertical.method": "splitnn"}
    _refused("vertical.share-labels", tmp_path, allowed, stage("split-train", batches=2),
             vanilla)
    u_shaped = {"vertical.method": "splitnn-u"}
    _refused("vertical.label-dp-epsilon", tmp_path, allowed, stage("split-train", batches=2),
             u_shaped)                          # its gradients carry the labels: label DP
    label_dp = allowed + "label-dp-epsilon = 2.0\n"
    assert _gate(tmp_path, label_dp, stage("split-train", batches=2), u_shaped).stage
    _refused("min-batch-size", tmp_path, "min-batch-size = 8\n" + label_dp,
             stage("split-train", batches=2), u_shaped)


def test_an_unknown_message_type_is_refused(tmp_path):
    message = Message(RecordDict(), dst_node_id=7, message_type="train.exfiltrate")
    _refused("message-type", tmp_path, "", message)


def test_a_dp_round_is_planned_from_the_runtimes_own_count(tmp_path):
    site = small_cxr_site(tmp_path / "site", num_images=12, seed=3)
    admission = _gate(tmp_path, "", instruction("train", **{keys.LOCAL_STEPS: 6}),
                      {"privacy.noise-multiplier": 1.1, "privacy.max-grad-norm": 1.0},
                      site=site)
    assert admission.spend is not None and admission.spend.steps == 6
    assert admission.spend.kind == "train" and admission.spend.batch_size == 4
    sizes = SiteRunSettings.from_run_config(RUN).sizes
    census = DatasetCensus(tmp_path / "runtime").counts("cxr-cls", site, sizes,
                                                        site / ".fedmed-state")
    assert admission.examples == census.train_examples > 0
    assert (site / ".fedmed-state" / "data-report").is_dir()  # the console's view: the runtime's


def test_min_val_items_withholds_from_the_runtimes_count(tmp_path):
    site = small_cxr_site(tmp_path / "site", num_images=12, seed=3)
    evaluate = instruction("evaluate")
    assert _gate(tmp_path, "min-val-items = 1000\n", evaluate,
                 site=site).withheld == {"min-val-items": ""}
    assert _gate(tmp_path, "min-val-items = 1\n", evaluate, site=site).withheld == {}
