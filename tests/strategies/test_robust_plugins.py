"""The robust rules as plug-ins: defences (norm bound, Multi-Krum) and robust aggregators (#12).

Found item reproduced here: "No norm bound. A finite update scaled x1000 from the
smallest site moves the model as far as it likes" (before #12 there was no
``strategy.defence`` to choose and FedAvg took the scaled update at face value).
"""

from __future__ import annotations

import numpy as np
import pytest

from app.config.run_config import RunConfig
from strategies.aggregation import fedavg_delta, fednova_delta
from strategies.rounds.update_stream import DefendedAggregator, with_defence
from strategies.plugins.run_settings import RunSettings
from strategies.wire.plugin_options import PluginError
from strategies.plugins.registries import (
    AGGREGATORS,
    DEFENCES,
    build as build_plugin,
    default_sections,
    parse_sections,
)
from strategies.rounds.reply_intake import TrainReply
from strategies.robust import coordinatewise, update_norm

SETTINGS = RunSettings(local_steps=5, num_rounds=3, fraction_train=1.0, min_nodes=2, seed=0,
                       optimizer="sgd")


def reply(i: int, delta: list[np.ndarray], n: int = 100, a_norm: float = 5.0) -> TrainReply:
    return TrainReply(node_id=i, site=f"site-{i}", delta=delta, num_examples=n, steps=5,
                      train_loss=1.0, a_norm=a_norm)


def honest_round(count: int = 6, seed: int = 0) -> list[TrainReply]:
    """Float32 weights around a common direction plus an int64 step counter, like a model."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((4, 3)).astype(np.float32)
    return [reply(i, [base + 0.1 * rng.standard_normal((4, 3)).astype(np.float32),
                      (0.1 * rng.standard_normal(3)).astype(np.float32),
                      np.array(-5, dtype=np.int64)], n=100 + 50 * i)
            for i in range(count)]


def attacked(replies: list[TrainReply], factor: float) -> list[TrainReply]:
    """Site 0 (the smallest) sends its update times ``factor``."""
    first = replies[0]
    bad = [a * a.dtype.type(factor) if a.dtype.kind == "f" else a for a in first.delta]
    return [reply(0, bad, n=first.num_examples), *replies[1:]]


def build(defence: str, aggregator: str = "fedavg", **values):
    sections, _ = parse_sections(values)
    return with_defence(build_plugin(DEFENCES, defence, sections, SETTINGS),
                        build_plugin(AGGREGATORS, aggregator, sections, SETTINGS))


def distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(float(np.sum((x.astype(np.float64) - y) ** 2))
                             for x, y in zip(a, b) if x.dtype.kind == "f")))


# --------------------------------------------------------------------------- #
# Found item: no norm bound
# --------------------------------------------------------------------------- #
def test_a_scaled_update_moves_the_model_at_most_the_round_bound():
    replies = honest_round()
    clean, _ = build("none").aggregate(replies)
    undefended, _ = build("none").aggregate(attacked(replies, 1000.0))
    defended, info = build("norm-bound", **{"norm-bound.kappa": 2.0}).aggregate(
        attacked(replies, 1000.0))
    # the round's lower median norm (six norms: the lower of the two middle ones)
    median_norm = float(np.sort([update_norm(r.delta) for r in replies[1:]] +
                                [1000.0 * update_norm(replies[0].delta)])[2])
    assert distance(undefended, clean) > 20.0 * median_norm  # FedAvg alone: taken over
    assert info["norm-bound"] == pytest.approx(2.0 * median_norm, rel=1e-6)
    # the attacker moves the model at most its weight p_0 times the bound
    p0 = replies[0].num_examples / sum(r.num_examples for r in replies)
    assert distance(defended, clean) <= p0 * (info["norm-bound"] + median_norm)


def test_the_run_config_chooses_a_defence_and_names_the_key_of_a_bad_one():
    config = RunConfig.from_mapping({"strategy.defence": "norm-bound",
                                     "norm-bound.absolute": 2.5})
    assert config.strategy_defence == "norm-bound"
    assert config.plugin_options["norm-bound"].absolute == 2.5
    assert RunConfig().strategy_defence == "norm-bound"  # chosen from bench/robustness*.py
    with pytest.raises(PluginError, match="'strategy.defence' must be one of "
                                          "\\['multi-krum', 'none', 'norm-bound'\\]"):
        RunConfig.from_mapping({"strategy.defence": "krum"})


# --------------------------------------------------------------------------- #
# Norm bound
# --------------------------------------------------------------------------- #
def test_clip_factor_is_recorded_per_site_and_only_floats_are_scaled():
    replies = attacked(honest_round(), 50.0)
    clipped, info = DEFENCES.create("norm-bound", absolute=1.0).filter(replies)
    for before, after in zip(replies, clipped):
        factor = info[f"clip-factor/{before.site}"]
        assert factor == pytest.approx(min(1.0, 1.0 / update_norm(before.delta)), rel=1e-6)
        assert update_norm(after.delta) <= 1.0 + 1e-5
        assert [a.dtype for a in after.delta] == [a.dtype for a in before.delta]
        assert after.delta[2] == before.delta[2]  # the integer buffer is not scaled
        assert (after.num_examples, after.a_norm) == (before.num_examples, before.a_norm)


def test_norm_bound_keeps_unclipped_replies_identical():
    replies = honest_round()
    kept, info = DEFENCES.create("norm-bound", absolute=1e6, kappa=0.0).filter(replies)
    assert all(a is b for a, b in zip(kept, replies))
    assert set(info.values()) == {1.0, 1e6}


def test_norm_bound_composes_with_fednova_weights():
    replies = [reply(r.node_id, r.delta, r.num_examples, a_norm=2.0 + r.node_id)
               for r in attacked(honest_round(), 100.0)]
    defence = DEFENCES.create("norm-bound", kappa=1.5)
    clipped, _ = defence.filter(replies)
    delta, info = with_defence(defence, AGGREGATORS.create("fednova")).aggregate(replies)
    expected = fednova_delta([r.delta for r in clipped], [r.num_examples for r in clipped],
                             [r.a_norm for r in clipped])
    for got, want in zip(delta, expected):
        np.testing.assert_array_equal(got, want)
    assert "tau-eff" in info and "norm-bound" in info


@pytest.mark.parametrize(("values", "message"), [
    ({"kappa": 0.5}, "'norm-bound.kappa' must be 0 \\(no relative bound\\) or a finite"),
    ({"kappa": 0.0}, "'norm-bound.kappa' must be >= 1 when 'norm-bound.absolute' is 0"),
    ({"absolute": float("inf")}, "'norm-bound.absolute' must be a finite number"),
    ({"absolute": -1.0}, "'norm-bound.absolute' must be a float >= 0"),
])
def test_norm_bound_options_name_the_key(values, message):
    with pytest.raises(PluginError, match=message):
        parse_sections({f"norm-bound.{k}": v for k, v in values.items()})


# --------------------------------------------------------------------------- #
# Multi-Krum
# --------------------------------------------------------------------------- #
def test_multi_krum_leaves_out_an_outlier_and_records_who_was_kept():
    replies = attacked(honest_round(), -20.0)
    kept, info = DEFENCES.create("multi-krum", f=1).filter(replies)
    assert [r.site for r in kept] == [r.site for r in replies[1:]]
    assert info["krum-kept"] == 5.0 and info["krum-selected/site-0"] == 0.0
    delta, _ = build("multi-krum", **{"multi-krum.f": 1}).aggregate(replies)
    expected = fedavg_delta([r.delta for r in kept], [r.num_examples for r in kept])
    assert distance(delta, expected) == 0.0


def test_multi_krum_with_fewer_replies_than_assumed_keeps_what_it_can():
    replies = honest_round(count=2)
    kept, info = DEFENCES.create("multi-krum", f=3, m=5).filter(replies[:1])
    assert kept == replies[:1] and info["krum-kept"] == 1.0
    kept, _ = DEFENCES.create("multi-krum", f=3).filter(replies)
    assert len(kept) == 1


def test_multi_krum_options_name_the_key():
    with pytest.raises(PluginError, match="'multi-krum.f' must be an int >= 0"):
        parse_sections({"multi-krum.f": -1})
    with pytest.raises(PluginError, match="unknown run config key 'multi-krum.n'"):
        parse_sections({"multi-krum.n": 3})


# --------------------------------------------------------------------------- #
# Robust aggregators
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("name", ["trimmed-mean", "median"])
def test_robust_aggregators_give_no_weight_to_a_claimed_example_count(name):
    replies = honest_round()
    inflated = [reply(0, replies[0].delta, n=10**15), *replies[1:]]
    aggregator = build_plugin(AGGREGATORS, name, default_sections(), SETTINGS)
    honest, _ = aggregator.aggregate(replies)
    claimed, _ = aggregator.aggregate(inflated)
    assert distance(honest, claimed) == 0.0
    weighted = fedavg_delta([r.delta for r in inflated], [r.num_examples for r in inflated])
    assert distance(weighted, inflated[0].delta) < 1e-6  # FedAvg: the claim takes over


@pytest.mark.parametrize(("name", "bound"), [("trimmed-mean", 2.0), ("median", 2.0)])
def test_robust_aggregators_ignore_a_scaled_update(name, bound):
    replies = honest_round()
    aggregator = AGGREGATORS.create(name)
    clean, _ = aggregator.aggregate(replies)
    bad, _ = aggregator.aggregate(attacked(replies, 1e6))
    assert distance(clean, bad) < bound


def test_trimmed_mean_cuts_beta_n_per_end_and_says_so():
    replies = [reply(i, [np.array([float(v)]), np.array([v], dtype=np.int32)])
               for i, v in enumerate([1, 2, 3, 4, 100])]
    delta, info = AGGREGATORS.create("trimmed-mean", beta=0.2).aggregate(replies)
    assert info == {"trimmed-per-end": 1.0}
    assert delta[0].tolist() == [3.0] and delta[1].dtype == np.int32 and delta[1] == 3
    with pytest.raises(PluginError, match="'trimmed-mean.beta' must be a float in \\[0, 0.5\\)"):
        parse_sections({"trimmed-mean.beta": 0.5})


def test_median_rounds_integer_buffers_half_to_even():
    updates = [[np.array([1, 2], dtype=np.int64)], [np.array([2, 3], dtype=np.int64)]]
    assert coordinatewise(updates, lambda s: np.median(s, axis=0))[0].tolist() == [2, 2]


# --------------------------------------------------------------------------- #
# Honest behaviour
# --------------------------------------------------------------------------- #
def test_no_defence_is_the_aggregator_itself():
    aggregator = AGGREGATORS.create("fedavg")
    assert with_defence(DEFENCES.create("none"), aggregator) is aggregator
    assert isinstance(with_defence(DEFENCES.create("multi-krum"), aggregator),
                      DefendedAggregator)


def test_the_server_puts_the_chosen_defence_in_front_of_the_aggregator():
    from app.server_app import build_strategy  # noqa: PLC0415 - imports torch

    config = RunConfig.from_mapping({"strategy.defence": "multi-krum", "multi-krum.f": 2,
                                     "strategy.aggregator": "trimmed-mean"})
    aggregator = build_strategy(config).aggregator
    assert isinstance(aggregator, DefendedAggregator)
    assert aggregator.defence.f == 2 and aggregator.aggregator.beta == 0.2
    default = build_strategy(RunConfig()).aggregator  # norm-bound in front of FedAvg
    assert (type(default.defence).__name__, type(default.aggregator).__name__) == (
        "NormBoundDefence", "FedAvgAggregator")
    none = RunConfig.from_mapping({"strategy.defence": "none"})
    assert type(build_strategy(none).aggregator).__name__ == "FedAvgAggregator"
