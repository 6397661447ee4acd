"""Split learning's site stages under the coordinator's flow, without Flower: the context's
``send`` answers each stage with the sites' own handlers (:func:`answer_vertical`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from app.config.run_config import RunConfig
from app.vertical.federation import VerticalContext
from app.vertical.messages import StageAnswer
from app.vertical.split_flow import message_sizes, run_split
from clients.manifests.load_report import LoadReport
from clients.site.policy import DpRules, PolicyRefusal, SitePolicy, VerticalRules
from clients.site.site import Site
from clients.site.site_round import SiteTasks
from clients.training.classification import ClassificationTask, LabelledTensors
from clients.training.trainer import ComputeDevice
from clients.training.site_task import SiteTask, TaskSettings
from clients.vertical import split_site
from clients.vertical.split_model import cut_task_network, load_part, part_arrays
from clients.vertical.split_state import STATE_FILE
from clients.vertical.stages import VerticalRequest, VerticalSite, answer_vertical
from strategies.wire.errors import ConfigError, ReplyError, SiteError
from strategies.wire.vertical_options import VerticalOptions

CPU = ComputeDevice(torch.device("cpu"), None)
SIZES = {"train": 64, "val": 32, "test": 32}


class TinyTask(ClassificationTask):
    """4 x 4 images whose label is whether the left half is brighter than the right."""

    name = "tiny-cls"
    manifest_name = "tiny.csv"
    item_noun = "image"
    preprocessing = "none"

    #: Images per split (a subclass may draw more).
    sizes = SIZES

    def _seed(self, split: str) -> list[int]:
        return [len(self.site_dir.name), len(split)]

    def _load_split(self, split: str) -> tuple[LabelledTensors, LoadReport]:
        rng = np.random.default_rng(self._seed(split))
        images = rng.random((self.sizes[split], 4, 4), dtype=np.float32)
        labels = (images[:, :, :2].mean((1, 2)) > images[:, :, 2:].mean((1, 2))).astype(np.float32)
        report = LoadReport()
        report.loaded.extend(f"{split}-{i}" for i in range(len(images)))
        return LabelledTensors(list(images), [[y] for y in labels]), report

    @classmethod
    def model_for(cls, settings: TaskSettings) -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(),
                             nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1))

    @classmethod
    def read_image(cls, path, settings):
        raise NotImplementedError

    @classmethod
    def manifest_items(cls, site_dir, split, settings):
        return []

    @classmethod
    def example_input(cls, settings):
        return np.zeros((1, 1, 4, 4), np.float32)


@dataclass
class TinySite(VerticalSite):
    """A vertical site whose task is the tiny one, loaded once."""

    loaded: SiteTask | None = None

    def task(self) -> SiteTask:
        if self.loaded is None:
            self.loaded = TinyTask(self.data_path, self.settings)
        return self.loaded


def tiny_site(tmp_path: Path, name: str, policy: SitePolicy) -> TinySite:
    """A site of the tiny task (its policy checked as the cxr-cls task's)."""
    data, state = tmp_path / name, tmp_path / name / "state"
    state.mkdir(parents=True)
    settings = TaskSettings(batch_size=8)
    site = Site(name, data, state, policy)
    return TinySite(name=name, data_path=data, state_dir=state, rules=policy.vertical,
                    task_name="cxr-cls",
                    department=name, settings=settings, lr=0.02, optimizer="adam", momentum=0.9,
                    seed=3, tasks=SiteTasks(compute=CPU), site=site)


@dataclass
class InProcessContext(VerticalContext):
    """The coordinator's context with every stage answered by the sites' handlers in process."""

    sites: dict[int, VerticalSite] = field(default_factory=dict)
    logged: dict[int, dict[str, float]] = field(default_factory=dict)
    #: A malicious site: (stage, node) -> what it does to its reply's arrays.
    tamper: dict[tuple[str, int], Callable[[dict], None]] = field(default_factory=dict)

    def send(self, stage: str, requests: Mapping, server_round: int,
             required: bool = True) -> dict[int, StageAnswer]:
        answers = {}
        for node, (entries, arrays) in requests.items():
            request = VerticalRequest(stage, self.federation, server_round, dict(entries),
                                      {k: np.array(v) for k, v in arrays.items()}, self.options,
                                      self.sites[node])
            reply = answer_vertical(request)
            self.traffic.count(stage, sum(a.nbytes for a in arrays.values()),
                               sum(a.nbytes for a in reply.arrays.values()))
            arrays = {k: np.array(v) for k, v in reply.arrays.items()}
            self.tamper.get((stage, node), lambda _: None)(arrays)
            answers[node] = StageAnswer(node, arrays, dict(reply.metrics), dict(reply.info))
        return answers

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.logged[step] = dict(metrics)


def federation(tmp_path: Path, method: str, mode: str = "parallel", rounds: int = 3,
               rules: VerticalRules = VerticalRules(allowed=True, share_labels=True),
               policy: SitePolicy = SitePolicy()) -> InProcessContext:
    options = VerticalOptions(method=method, split_mode=mode, cut=3, head_layers=1,
                              batches_per_message=4)
    config = RunConfig(task="tiny-cls", num_server_rounds=rounds, local_steps=6, lr=0.02,
                       optimizer="adam", seed=0, task_sizes=TaskSettings(batch_size=8),
                       vertical_options=options)
    sites = {node: tiny_site(tmp_path, f"site-{name}", replace(policy, vertical=rules))
             for node, name in ((11, "a"), (12, "bb"))}
    return InProcessContext(grid=None, nodes=list(sites), config=config, options=options,
                            federation="fed-1",
                            departments={n: s.department for n, s in sites.items()},
                            sites=sites)


@pytest.fixture(autouse=True)
def tiny_task(monkeypatch):
    monkeypatch.setattr("app.vertical.split_flow.task_class", lambda name: TinyTask)


def test_a_round_is_messages_of_batches_per_message():
    assert message_sizes(8, 3) == [3, 3, 2]
    assert message_sizes(6, 3) == [3, 3]


@pytest.mark.parametrize("method, mode", [("splitnn", "parallel"), ("splitnn-u", "parallel"),
                                          ("splitnn", "sequential")])
def test_split_learning_lowers_the_loss_at_both_sites(tmp_path, method, mode):
    ctx = federation(tmp_path, method, mode)
    result = run_split(ctx)
    for department in ("site-a", "site-bb"):
        first, last = ctx.logged[1], ctx.logged[3]
        assert last[f"{department}/train-loss"] < first[f"{department}/train-loss"]
        assert result.site_metrics[department]["val-examples"] == SIZES["val"]
        assert result.site_metrics[department]["test-auc"] > 0.8
    # the normalisation statistics count each batch once (the recomputed pass restores them);
    # in turn, the part has seen both sites' batches
    turns = 2 if mode == "sequential" else 1
    assert int(result.arrays["part/bottom.2.num_batches_tracked"]) == 3 * 6 * turns
    assert ("part/head.0.weight" in result.arrays) is (method == "splitnn-u")
    assert any(name.startswith("middle/") for name in result.arrays)
    # per round and site: a message for each of 2 batch groups (4 + 2) and the last gradients,
    # U's head stages, 2 evaluation stages
    per_round = 3 + (2 if method == "splitnn-u" else 0) + 2
    assert ctx.traffic.messages == 3 * 2 * per_round
    assert (tmp_path / "site-a" / "state" / STATE_FILE).is_file()


def test_labels_leave_only_where_the_policy_says_share_labels(tmp_path):
    keeps_labels = VerticalRules(allowed=True, share_labels=False)
    with pytest.raises(PolicyRefusal, match="vertical.share-labels") as refused:
        run_split(federation(tmp_path / "vanilla", "splitnn", rules=keeps_labels))
    assert refused.value.rule == "vertical.share-labels"
    with pytest.raises(PolicyRefusal) as refused:  # U-shaped: its gradients carry the labels
        run_split(federation(tmp_path / "u-no-dp", "splitnn-u", rules=keeps_labels))
    assert refused.value.rule == "vertical.label-dp-epsilon"
    label_dp = replace(keeps_labels, label_dp_epsilon=2.0)
    ctx = federation(tmp_path / "u", "splitnn-u", rounds=1, rules=label_dp)
    run_split(ctx)                              # U-shaped with label DP: the site answers
    assert "site-a/val-auc" in ctx.logged[1]


@pytest.mark.parametrize("policy, rule", [(SitePolicy(dp=DpRules(required=True)), "dp.required"),
                                          (SitePolicy(min_batch_size=16), "min-batch-size")])
def test_split_training_passes_the_policys_training_rules(tmp_path, policy, rule):
    with pytest.raises(PolicyRefusal) as refused:
        run_split(federation(tmp_path, "splitnn-u", policy=policy))
    assert refused.value.rule == rule


def _scaled_labels(arrays: dict) -> None:
    arrays["label-0"] = arrays["label-0"] * 7


def _cropped_activation(arrays: dict) -> None:
    arrays["activation-1"] = arrays["activation-1"][:, :3]


@pytest.mark.parametrize("tamper, error", [
    (_scaled_labels, "site-bb's label-0 is not in"),
    (_cropped_activation, "site-bb's activation-1 has items")])
def test_the_coordinator_names_a_site_whose_reply_is_malformed(tmp_path, tamper, error):
    ctx = federation(tmp_path, "splitnn", rounds=1)
    ctx.tamper[("split-train", 12)] = tamper
    with pytest.raises(ReplyError, match=error):
        run_split(ctx)


def test_a_part_whose_counters_came_back_as_shape_1_loads_and_a_misfit_is_named():
    """Flower's ArrayRecord returns a 0-d array (BatchNorm's counter) with shape (1,)."""
    split = cut_task_network(TinyTask.model_for(TaskSettings()), VerticalOptions(
        method="splitnn", cut=3))
    arrays = part_arrays(split.site_part())
    arrays["part/bottom.2.num_batches_tracked"] = np.array([5])
    assert load_part(split.site_part(), arrays)
    assert int(split.bottom[2].num_batches_tracked) == 5
    arrays["part/bottom.1.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(SiteError, match=r"bottom.1.weight \(3, 3\) for \(16, 16\)"):
        load_part(split.site_part(), arrays)


def test_a_site_without_its_part_refuses_a_stage_out_of_order(tmp_path):
    ctx = federation(tmp_path, "splitnn")
    with pytest.raises(SiteError, match="holds no site part"):
        ctx.send("split-train", {11: ({"batches": 1}, {})}, 1)


@pytest.mark.parametrize("method", ["splitnn", "splitnn-u"])
def test_one_batch_per_message_is_exactly_sgd_on_the_whole_network(tmp_path, method, monkeypatch):
    """k = 1, one site, plain SGD: every cut gradient is evaluated at the weights of the step
    it feeds, so split learning reproduces SGD on the unsplit network over the same batches."""
    ctx = federation(tmp_path, method, rounds=2)
    ctx.options = replace(ctx.options, batches_per_message=1)
    ctx.config = replace(ctx.config, optimizer="sgd", momentum=0.0, vertical_options=ctx.options)
    ctx.nodes = [11]
    site = ctx.sites[11]
    site.optimizer, site.momentum = "sgd", 0.0
    drawn: list[np.ndarray] = []
    draw = split_site._draw

    def recorded(request, count, state, *labels):
        draw(request, count, state, *labels)
        drawn.extend(state.pending)

    monkeypatch.setattr(split_site, "_draw", recorded)
    result = run_split(ctx)
    torch.manual_seed(ctx.seed)
    model = TinyTask.model_for(site.settings).train()
    optimiser = torch.optim.SGD(model.parameters(), lr=ctx.config.lr)
    data = site.task().train_set
    for indices in drawn:
        x = torch.stack([data[int(i)][0] for i in indices])
        y = torch.stack([data[int(i)][1] for i in indices])
        optimiser.zero_grad()
        nn.BCEWithLogitsLoss()(model(x), y).backward()
        optimiser.step()
    assert len(drawn) == 2 * 6
    expected = cut_task_network(model, ctx.options)
    for name, value in part_arrays(expected.site_part()).items():
        np.testing.assert_allclose(result.arrays[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    for name, value in expected.middle.state_dict().items():
        np.testing.assert_allclose(result.arrays[f"middle/{name}"], value.numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=name)


def test_a_cut_the_tasks_network_cannot_take_is_a_config_error_naming_the_key():
    network = TinyTask.model_for(TaskSettings())                # 7 blocks
    with pytest.raises(ConfigError, match=r"vertical.cut = 7: .* 7 blocks"):
        cut_task_network(network, VerticalOptions(method="splitnn", cut=7))
    with pytest.raises(ConfigError, match=r"vertical.head-layers = 6"):
        cut_task_network(network, VerticalOptions(method="splitnn-u", cut=1, head_layers=6))
    assert len(cut_task_network(network, VerticalOptions(method="splitnn", cut=6,
                                                         head_layers=6)).head) == 0
