"""Found items 6 (first bullet) and 5 (first bullet) of #28: a site's fine-tuned model leaves
it only when its policy shares it, and the researcher's sizes are bounded before data is read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from clients.site.instruction import Instruction
from clients.site.policy import PolicyRefusal, SitePolicy, load_policy
from clients.site.site_round import SiteTasks, answer
from clients.training.site_task import TaskSettings
from strategies.wire import message_keys as keys
from tests.clients.site_round_fixtures import packed_global, run_settings, site

SHIPPED_POLICY = Path(__file__).resolve().parents[3] / "configs" / "site-policy.toml"


def _train(policy: SitePolicy, server_round: int, tmp_path, tasks, run=None):
    run = run or run_settings()
    instruction = Instruction.parse("train", {keys.SERVER_ROUND: server_round}, run, "run-1")
    return answer(instruction, packed_global(), site(tmp_path, policy), run, tasks)


def test_the_cross_site_fine_tune_is_refused_unless_the_site_shares_it(tmp_path, tasks):
    keeps = dataclasses.replace(SitePolicy.permissive(), share_finetuned_model=False)
    assert _train(keeps, 2, tmp_path, tasks).update  # num-server-rounds = 2: a round
    with pytest.raises(PolicyRefusal) as refused:
        _train(keeps, 3, tmp_path, tasks)  # after the last round: the cross-site fine-tune
    assert refused.value.rule == "share-finetuned-model"
    shares = dataclasses.replace(keeps, share_finetuned_model=True)
    assert _train(shares, 3, tmp_path, tasks).update


def test_the_shipped_policy_keeps_fine_tuned_models_and_bounds_sizes():
    shipped = load_policy(SHIPPED_POLICY)
    assert not shipped.share_finetuned_model and not shipped.evaluate_trains
    assert (shipped.max_queries, shipped.max_volume_depth, shipped.max_slab_slices,
            shipped.max_study_bytes) == (100, 256, 32, 1 << 30)


@pytest.mark.parametrize("kind", ["train", "evaluate", "query"])
def test_a_97_gib_study_is_refused_before_any_data_is_read(tmp_path, kind):
    loads = []
    shipped = load_policy(SHIPPED_POLICY)
    run = dataclasses.replace(run_settings(task="ct3d-cls"),
                              sizes=TaskSettings(image_size=512, volume_depth=100_000))
    instruction = Instruction.parse(kind, {keys.SERVER_ROUND: 1}, run, "run-1")

    with pytest.raises(PolicyRefusal) as refused:
        answer(instruction, {}, site(tmp_path, shipped), run,
               SiteTasks(lambda *args, **kwargs: loads.append(args)))
    assert refused.value.rule == "max-volume-depth" and loads == []
    deep_enough = dataclasses.replace(shipped, max_volume_depth=10**6)
    with pytest.raises(PolicyRefusal) as refused:
        answer(instruction, {}, site(tmp_path, deep_enough), run,
               SiteTasks(lambda *args, **kwargs: loads.append(args)))
    assert refused.value.rule == "max-study-bytes" and "104857600000" in str(refused.value)
