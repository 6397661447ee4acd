"""A coordinator that reads a site's private labels out of split learning (issue #46, found 3).

Each attack runs through the site's own stage handlers (:func:`answer_vertical`), the
coordinator's side written out here. Before issue #46 a site whose policy keeps its
labels (``share-labels = false``) answered U-shaped training with no defence and scored
every ``split-eval-finish`` it was sent:

* the gradient attack: the U-shaped ``split-head`` returns dL/da2_i = W^T (sigmoid(z_i) -
  y_i) / B per example; projected (least squares) on the head weights W the coordinator
  itself sent, its sign is -(2 y_i - 1): every label of the batch;
* the evaluation oracle: ``split-eval-finish`` scores outputs the coordinator chooses
  against the site's val labels; flipping one item's logit moves the accuracy by +-1/N,
  which is that item's label, with no call limit.

Now U-shaped training without label DP is refused (``vertical.label-dp-epsilon``), with
label DP the attack reads the randomised-response labels (Ghazi et al., NeurIPS 2021),
right about a true label with RR's keep probability only, and evaluations are counted
per dataset across federations (``vertical.max-evaluations``) and gated by
``min-val-items``, at the site and in the hospital's runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from safetensors.numpy import load_file

from app.site_runtime.dataset_census import DatasetCensus
from app.site_runtime.runtime_gate import SiteFacts, admit
from clients.site.policy import PolicyRefusal, SitePolicy, VerticalRules, load_policy
from clients.site.query_budget import EVALUATIONS, QUERY_COUNTS, answered
from clients.site.site import Site
from clients.site.site_round import SiteTasks
from clients.training.site_task import SiteTask, TaskSettings
from clients.training.trainer import ComputeDevice
from clients.vertical import label_dp
from clients.vertical.split_model import cut_task_network, part_arrays
from clients.vertical.split_state import STATE_FILE
from clients.vertical.stages import VerticalRequest, VerticalSite, answer_vertical
from strategies.wire import message_keys as keys
from strategies.wire.vertical_options import VerticalOptions
from tests.clients.policy_files import write_policy
from tests.clients.test_split_site import TinyTask
from tests.clients.small_sites import small_cxr_site

CPU = ComputeDevice(torch.device("cpu"), None)
SIZES = {"train": 400, "val": 32, "test": 32}
U_OPTIONS = VerticalOptions(method="splitnn-u", cut=3, head_layers=1, batches_per_message=1)
VANILLA = VerticalOptions(method="splitnn", cut=3, batches_per_message=1)
BATCH = 32
#: The policy that keeps the labels, as configs/site-policy.toml ships it (no label DP).
PRIVATE = VerticalRules(allowed=True, share_labels=False)


class LeakTask(TinyTask):
    """The tiny 4 x 4 task (label: whether the left half is brighter than the right; one
    sigmoid), with more training images."""

    name = "leak-cls"
    manifest_name = "leak.csv"
    sizes = SIZES

    def _seed(self, split: str) -> list[int]:
        return [len(split), 46]


@dataclass
class LeakSite(VerticalSite):
    """A vertical site of the leak task (checked by the policy as the cxr-cls task)."""

    loaded: SiteTask | None = None

    def task(self) -> SiteTask:
        if self.loaded is None:
            self.loaded = LeakTask(self.data_path, self.settings)
        return self.loaded


def leak_site(root: Path, federation: str, rules: VerticalRules,
              policy: SitePolicy = SitePolicy()) -> LeakSite:
    """The hospital's site in ``federation``: one data folder and state dir for all
    federations, a vertical state folder per federation (as ``vertical_site`` makes it)."""
    data, state = root / "hospital", root / "hospital" / "state"
    folder = state / federation / "vertical"
    folder.mkdir(parents=True, exist_ok=True)
    site = Site("hospital", data, state, replace(policy, vertical=rules))
    return LeakSite(name="hospital", data_path=data, state_dir=folder, rules=rules,
                    task_name="cxr-cls", department="hospital",
                    settings=TaskSettings(batch_size=BATCH), lr=0.01, optimizer="adam",
                    momentum=0.9, seed=3, tasks=SiteTasks(compute=CPU), site=site)


def send(site: LeakSite, stage: str, server_round: int, config: dict, arrays: dict,
         options: VerticalOptions = U_OPTIONS):
    """One message of the coordinator, answered by the site's own handler."""
    return answer_vertical(VerticalRequest(stage, "fed", server_round, config, arrays, options,
                                           site))


def true_labels(site: LeakSite, split: str = "train") -> np.ndarray:
    data = site.task().train_set if split == "train" else site.task().eval_set(split)
    return np.array([float(data[i][1][0]) for i in range(len(data))])


def gradient_attack(site: LeakSite, messages: int) -> tuple[np.ndarray, np.ndarray]:
    """The coordinator's attack, ``messages`` times: send a fresh site part (it knows its head
    weights W), get one batch's cut activations, return a2 = middle(a1), and read each
    example's label from the returned dL/da2 by least squares on W^T (one label: the sign of
    the projection on W). Returns the training indices the site drew and the labels read."""
    torch.manual_seed(0)
    split = cut_task_network(LeakTask.model_for(site.settings), U_OPTIONS)
    part = part_arrays(split.site_part())
    head_weight = part["part/head.0.weight"]                            # (labels, features)
    drawn, guessed = [], []
    for server_round in range(1, messages + 1):
        reply = send(site, "split-train", server_round, {"batches": 1, "step": 0}, part)
        with torch.no_grad():
            a2 = split.middle.train()(torch.from_numpy(reply.arrays["activation-0"]))
        gradient = send(site, "split-head", server_round, {},
                        {"output-0": a2.numpy()}).arrays["gradient-0"]
        # dL/da2_i = W^T c_i with c_i = (sigmoid(z_i) - y_i) / B: y_i = 1 exactly when c_i < 0
        coefficients = np.linalg.lstsq(head_weight.T, gradient.T, rcond=None)[0].T
        guessed.append((coefficients[:, 0] < 0).astype(float))
        pending = load_file(site.state_dir / STATE_FILE)["pending-indices"]
        drawn.append(pending[0])
    return np.concatenate(drawn), np.concatenate(guessed)


def test_the_gradient_attack_reads_every_label_where_no_defence_is_set(tmp_path):
    """The old behaviour of a site that keeps its labels (share-labels = false, no label DP):
    the same code still runs where the policy lets the labels leave, and the attack reads
    every label of every batch; the shipped policy now refuses it, at both stages."""
    site = leak_site(tmp_path, "fed-1", replace(PRIVATE, share_labels=True))
    drawn, guessed = gradient_attack(site, 4)
    assert len(drawn) == 4 * BATCH
    np.testing.assert_array_equal(guessed, true_labels(site)[drawn])      # 128 of 128
    private = leak_site(tmp_path, "fed-1", PRIVATE)
    with pytest.raises(PolicyRefusal) as refused:
        gradient_attack(private, 1)
    assert refused.value.rule == "vertical.label-dp-epsilon"
    with pytest.raises(PolicyRefusal, match="label-dp-epsilon"):  # a batch still pending
        send(private, "split-head", 1, {}, {"output-0": np.zeros((BATCH, 8), np.float32)})


def test_under_label_dp_the_attack_is_right_only_with_rrs_keep_probability(tmp_path,
                                                                           monkeypatch):
    """label-dp-epsilon = 1: the gradients still give the labels the site trains with, but
    those are randomised response's (drawn once): right about a true label with probability
    e / (e + 1) = 0.731, not 1; a second federation sees the very same noisy labels."""
    monkeypatch.setattr(label_dp, "urandom_rng", lambda: np.random.default_rng(2021))
    rules = replace(PRIVATE, label_dp_epsilon=1.0)
    site = leak_site(tmp_path, "fed-1", rules)
    drawn, guessed = gradient_attack(site, 16)
    keep = label_dp.keep_probability(1.0, 2)
    assert keep == pytest.approx(math.e / (math.e + 1))
    seen = np.unique(drawn)
    assert len(seen) > 250                                 # many patients
    accuracy = float(np.mean(guessed == true_labels(site)[drawn]))
    assert keep - 0.1 <= accuracy <= keep + 0.06           # RR's keep probability, not 1
    kept = next((tmp_path / "hospital" / "state" / label_dp.LABEL_DP_DIR).rglob("*.safetensors"))
    noisy = load_file(kept)["labels"][:, 0].astype(float)
    np.testing.assert_array_equal(guessed, noisy[drawn])   # it reads the RR labels exactly
    per_patient = float(np.mean(noisy[seen] == true_labels(site)[seen]))
    assert per_patient <= keep + 0.06
    # another federation id, many rounds later: the same noisy labels, nothing to average
    again = leak_site(tmp_path, "fed-2", rules)
    drawn_2, guessed_2 = gradient_attack(again, 4)
    np.testing.assert_array_equal(guessed_2, noisy[drawn_2])


def test_noisy_labels_are_drawn_once_and_a_smaller_epsilon_noises_them_further(tmp_path):
    labels = (np.random.default_rng(0).random((20000, 1)) < 0.3).astype(np.float32)
    first = label_dp.site_noisy_labels(tmp_path, tmp_path / "data", labels, 2.0,
                                       np.random.default_rng(1))
    assert np.mean(first == labels) == pytest.approx(label_dp.keep_probability(2.0, 2), abs=0.01)
    again = label_dp.site_noisy_labels(tmp_path, tmp_path / "data", labels, 2.0)
    np.testing.assert_array_equal(again, first)            # os.urandom not even asked
    larger = label_dp.site_noisy_labels(tmp_path, tmp_path / "data", labels, 8.0)
    np.testing.assert_array_equal(larger, first)           # cannot be un-noised: kept
    smaller = label_dp.site_noisy_labels(tmp_path, tmp_path / "data", labels, 0.5,
                                         np.random.default_rng(2))
    assert np.mean(smaller == labels) == pytest.approx(label_dp.keep_probability(0.5, 2),
                                                       abs=0.01)
    assert np.mean(smaller != first) < 1 - label_dp.keep_probability(0.5, 2)  # from `first`
    with pytest.raises(Exception, match="second view"):
        label_dp.site_noisy_labels(tmp_path, tmp_path / "data", labels[:100], 0.5)
    # L labels: eps / L each, so the vector is eps-label-DP
    three = label_dp.noisy_labels(np.zeros((30000, 3)), 3.0, np.random.default_rng(3))
    assert np.mean(three == 0) == pytest.approx(label_dp.keep_probability(1.0, 2), abs=0.01)


def test_k_ary_randomised_response_keeps_with_p_and_spreads_the_rest_uniformly():
    rng = np.random.default_rng(4)
    out = label_dp.randomised_response(np.zeros(60000, np.int64), 4, 1.0, rng)
    assert np.mean(out == 0) == pytest.approx(math.e / (math.e + 3), abs=0.01)
    others = np.bincount(out[out != 0], minlength=4)[1:]
    assert others.min() / others.max() > 0.95
    assert label_dp.further_keep(0.9, 0.6, 2) * 0.9 + 0.1 * (1 - label_dp.further_keep(
        0.9, 0.6, 2)) == pytest.approx(0.6)


def _eval_finish(site: LeakSite, logits: np.ndarray) -> dict:
    """The coordinator's ``split-eval-finish`` (vanilla: it sends the val logits)."""
    return send(site, "split-eval-finish", 1, {}, {"output-val": logits}, VANILLA).metrics


def test_the_evaluation_oracle_is_capped_per_dataset_across_federations(tmp_path):
    """One item's logit flipped moves the accuracy by its label: N + 1 calls read N labels.
    Capped at 4 evaluations of the dataset, fed-1 reads 3 labels and fed-2 gets nothing."""
    unlimited = leak_site(tmp_path / "old", "fed-1",
                          VerticalRules(allowed=True, max_evaluations=math.inf))
    base = np.full((SIZES["val"], 1), -10.0, np.float32)              # predict 0 everywhere
    reference = _eval_finish(unlimited, base)["val-accuracy"]
    read = []
    for i in range(8):
        probe = base.copy()
        probe[i] = 10.0
        read.append(float(_eval_finish(unlimited, probe)["val-accuracy"] > reference))
    np.testing.assert_array_equal(read, true_labels(unlimited, "val")[:8])  # the old oracle
    capped = VerticalRules(allowed=True, max_evaluations=4)
    site = leak_site(tmp_path / "new", "fed-1", capped)
    for _ in range(4):
        assert "val-accuracy" in _eval_finish(site, base)
    for federation in ("fed-1", "fed-2"):
        with pytest.raises(PolicyRefusal, match="all federations together") as refused:
            _eval_finish(leak_site(tmp_path / "new", federation, capped), base)
        assert refused.value.rule == "vertical.max-evaluations"
    counts = tmp_path / "new" / "hospital" / "state" / QUERY_COUNTS
    assert answered(counts, tmp_path / "new" / "hospital", EVALUATIONS) == 4


def test_an_evaluation_of_a_split_below_min_val_items_is_refused(tmp_path):
    rules = VerticalRules(allowed=True)
    logits = np.zeros((SIZES["val"], 1), np.float32)
    small = leak_site(tmp_path, "fed-1", rules, SitePolicy(min_val_items=SIZES["val"] + 1))
    with pytest.raises(PolicyRefusal) as refused:
        _eval_finish(small, logits)
    assert refused.value.rule == "min-val-items"
    assert "val-auc" in _eval_finish(leak_site(tmp_path, "fed-1", rules,
                                               SitePolicy(min_val_items=SIZES["val"])), logits)


# --- the hospital's runtime decides the same before the app sees the message ---------------

@pytest.fixture()
def task_identity(monkeypatch):
    """The ids Flower's Message needs, as the runner's pull sets them."""
    for name, value in (("_task_id", 3), ("_run_id", 1), ("_node_id", 7)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _admit(tmp_path: Path, policy_text: str, stage: str, federation: str, run: dict,
           arrays: dict | None = None, config: dict | None = None):
    site = tmp_path / "site"
    record = RecordDict({keys.CONFIG: ConfigRecord({keys.VERTICAL_STAGE: stage,
                                                    keys.FEDERATION: federation,
                                                    **(config or {})})})
    if arrays:
        record[keys.ARRAYS] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    message = Message(record, dst_node_id=7, message_type=keys.VERTICAL_MESSAGE_TYPE)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(),
                      run_config={"task": "cxr-cls", "image-size": 32, "batch-size": 4,
                                  "local-steps": 5, "num-server-rounds": 3, **run})
    policy = load_policy(write_policy(tmp_path, policy_text))
    return admit(message, context, policy, SiteFacts("hospital-a", site, site / ".fedmed-state"),
                 DatasetCensus(tmp_path / "runtime"))


def test_the_runtime_refuses_u_shaped_training_without_label_dp_and_caps_evaluations(
        tmp_path, task_identity):
    small_cxr_site(tmp_path / "site", num_images=12, seed=3)
    u_shaped = {"vertical.method": "splitnn-u"}
    private = "[vertical]\nallowed = true\nshare-labels = false\nmax-evaluations = 2\n"
    for stage, config in (("split-train", {"batches": 1}), ("split-head", {})):
        with pytest.raises(PolicyRefusal) as refused:
            _admit(tmp_path, private, stage, "fed-1", u_shaped, config=config)
        assert refused.value.rule == "vertical.label-dp-epsilon"
        assert _admit(tmp_path, private + "label-dp-epsilon = 1.0\n", stage, "fed-1", u_shaped,
                      config=config).stage == stage
    outputs = {"output-val": np.zeros((3, 1), np.float32)}
    for federation in ("fed-1", "fed-2"):
        assert _admit(tmp_path, private, "split-eval-finish", federation, {}, outputs).stage
    for federation in ("fed-2", "fed-3"):
        with pytest.raises(PolicyRefusal) as refused:
            _admit(tmp_path, private, "split-eval-finish", federation, {}, outputs)
        assert refused.value.rule == "vertical.max-evaluations"
    counted = list((tmp_path / "site" / ".fedmed-state" / "runtime").rglob("*.json"))
    assert len(counted) == 1                                # the runtime's folder, per dataset
    with pytest.raises(PolicyRefusal) as refused:
        _admit(tmp_path, "min-val-items = 1000\n" + private.replace("= 2", "= 9"),
               "split-eval-finish", "fed-4", {}, outputs)
    assert refused.value.rule == "min-val-items"
