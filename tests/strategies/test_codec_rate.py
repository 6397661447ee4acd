"""The adaptive compression rate (sign-based OGD on the kept fraction, book ch. 3 §3.3.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from strategies.wire import message_keys as keys
from strategies.wire.codecs.spec import parse_spec
from strategies.wire.plugin_options import PluginError
from strategies.plugins.schedules.codec_rate import (
    AdaptiveCodecRate,
    SiteRound,
    round_seconds,
)
from strategies.plugins.registries import (
    AGGREGATORS,
    CODEC_RATES,
    SCHEDULES,
    SELECTORS,
    check,
    default_sections,
)
from strategies.plugins.run_settings import RunSettings
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.rounds.checkpoint import decode_tree, encode_tree
from strategies.wire.update_codec import pack_update
from tests.strategies.scripted_grid import connected

pytestmark = pytest.mark.usefixtures("server_identity")

DENSE_BYTES = 1e6  # bytes of the update at rate 1 in the synthetic time model


def _synthetic_rates(link_mbps: float, rounds: int = 40, noise: float = 0.0,
                     start: str = "topk:0.1", step: float = 0.5,
                     interval: int = 1) -> list[float]:
    """Rates chosen on a synthetic federation: 1 s of compute a round, ``rate x 1 MB`` over
    the link, and a log-loss decrease of ``0.1 sqrt(rate)`` a round (more kept, more
    progress, with diminishing returns); the time per unit of progress is least at
    ``rate* = 1 s / (8 Mbit / link)``."""
    rng = np.random.default_rng(0)
    schedule = AdaptiveCodecRate(min=0.001, max=1.0, step=step, link_mbps=link_mbps,
                                 interval=interval)
    spec, loss, rates = parse_spec(start), 1.0, []
    for _ in range(rounds):
        rate = schedule.rate_for(spec)
        seen = loss * math.exp(noise * rng.standard_normal())
        schedule.observe(rate, [SiteRound(1.0, 0.0, DENSE_BYTES * rate, 10, seen)])
        rates.append(rate)
        loss *= math.exp(-0.1 * math.sqrt(rate))
    return rates


def test_a_slow_link_drives_the_rate_down_to_its_floor() -> None:
    rates = _synthetic_rates(link_mbps=0.008)  # 1000 s at rate 1: rate* = 0.001
    assert rates[0] == pytest.approx(0.1)
    assert max(rates[-20:]) <= 0.001 * math.exp(1.0) + 1e-12


def test_a_fast_link_drives_the_rate_up_to_its_ceiling() -> None:
    rates = _synthetic_rates(link_mbps=80.0)  # compute-bound: rate* = 10, clipped at 1
    assert min(rates[-20:]) >= math.exp(-1.0) - 1e-12
    assert rates[-20:].count(1.0) >= 5


def test_a_link_in_between_keeps_the_rate_around_its_optimum() -> None:
    rates = _synthetic_rates(link_mbps=0.8)  # rate* = 0.1
    tail = np.log(rates[-20:])
    assert abs(tail.mean() - math.log(0.1)) < 0.5
    assert tail.max() - tail.min() <= 4 * 0.5 + 1e-9  # within two steps either side


def test_noise_moves_the_rate_one_clipped_step_a_round_at_most() -> None:
    rates = np.log(_synthetic_rates(link_mbps=0.8, rounds=200, noise=2.0))
    assert np.all(np.abs(np.diff(rates)) <= 0.5 + 1e-9)
    assert rates.min() >= math.log(0.001) - 1e-9 and rates.max() <= 1e-9


def test_the_first_rounds_probe_down_then_follow_the_estimated_sign() -> None:
    rates = _synthetic_rates(link_mbps=80.0, rounds=5)
    np.testing.assert_allclose(np.log(rates) - math.log(0.1), [0.0, -0.5, -1.0, -0.5, 0.0])


def test_an_interval_keeps_each_rate_m_rounds_and_still_follows_the_link() -> None:
    fast = _synthetic_rates(link_mbps=80.0, rounds=60, interval=4)
    slow = _synthetic_rates(link_mbps=0.008, rounds=60, interval=4)
    for rates in (fast, slow):
        assert all(len(set(rates[k:k + 4])) == 1 for k in range(0, 60, 4))
    assert min(fast[-20:]) >= math.exp(-1.0) - 1e-12
    assert max(slow[-20:]) <= 0.001 * math.exp(1.0) + 1e-12


def test_the_round_time_is_the_slowest_site_with_its_bytes_or_as_measured() -> None:
    sites = [SiteRound(2.0, 9.0, 1e6, 1, 1.0), SiteRound(5.0, 6.0, 0.0, 1, 1.0)]
    assert round_seconds(sites, link_mbps=1.0) == pytest.approx(10.0)  # 2 s + 8 Mbit / 1
    assert round_seconds(sites, link_mbps=0.0) == pytest.approx(9.0)


def test_adaptive_rate_needs_a_fraction_and_no_warmup_and_sane_options() -> None:
    def settings(codec: str, warmup_rounds: int) -> RunSettings:
        return RunSettings(local_steps=1, num_rounds=3, fraction_train=1.0, min_nodes=1, seed=0,
                           optimizer="sgd", codec=codec, codec_warmup_rounds=warmup_rounds)

    sections = default_sections()
    check(CODEC_RATES, "adaptive", sections, settings("topk:0.01:layer", 0))
    check(CODEC_RATES, "fixed", sections, settings("qsgd:16", 3))
    with pytest.raises(PluginError, match="'strategy.codec-rate' = 'adaptive' needs a codec "
                                          "that keeps a fraction.*'qsgd:16'"):
        check(CODEC_RATES, "adaptive", sections, settings("qsgd:16", 0))
    with pytest.raises(PluginError, match="'strategy.codec-warmup-rounds' = 2"):
        check(CODEC_RATES, "adaptive", sections, settings("topk:0.01", 2))
    with pytest.raises(PluginError, match="'codec-rate.max' must be in \\[codec-rate.min"):
        CODEC_RATES.create("adaptive", min=0.1, max=0.01)
    with pytest.raises(PluginError, match="'codec-rate.step' must be > 0"):
        CODEC_RATES.create("adaptive", step=0.0)


def _round(strategy: FederatedStrategy, server_round: int, loss: float) -> list[str]:
    """One train round with two sites replying with an update packed by the round's codec;
    returns the codec each instruction carried."""
    grid = connected([2, 3])
    arrays = ArrayRecord([np.zeros(200, np.float32)])
    messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
    replies, codecs = [], []
    for i, message in enumerate(messages):
        message.metadata.__dict__["_message_id"] = f"msg-{server_round}-{i}"
        config = message.content[keys.CONFIG]
        codecs.append(config[keys.CODEC])
        packed = pack_update([np.linspace(-1, 1, 200, dtype=np.float32)], config[keys.CODEC],
                             config[keys.CODEC_SEED])
        replies.append(Message(RecordDict({
            keys.SITE: ConfigRecord({keys.SITE_NAME: f"site-{i}"}),
            keys.DELTA: ArrayRecord({k: Array(v) for k, v in packed.items()}),
            keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: 4, keys.STEPS: 2,
                                        keys.TRAIN_LOSS: loss, keys.INITIAL_LOSS: loss,
                                        keys.TRAIN_SECONDS: 1.0})}), reply_to=message))
    arrays, _ = strategy.aggregate_train(server_round, replies)
    assert arrays is not None
    return codecs


def test_the_rounds_rate_reaches_the_instructions_and_the_round_report() -> None:
    strategy = FederatedStrategy(
        aggregator=AGGREGATORS.create("fedavg"), schedule=SCHEDULES.create("fixed", tau0=2),
        selector=SELECTORS.create("uniform"), node_wait_timeout=1, codec="topk:0.5:layer",
        codec_rate=CODEC_RATES.create("adaptive", step=0.5, link_mbps=1.0))
    first = _round(strategy, 1, loss=1.0)
    second = _round(strategy, 2, loss=0.9)
    assert first == ["topk:0.5:layer"] * 2
    probe = 0.5 * math.exp(-0.5)  # no sign yet: the first step probes down
    assert [parse_spec(c).fraction for c in second] == pytest.approx([probe, probe])
    assert all(parse_spec(c).per_tensor for c in second)
    assert strategy.reports[1].strategy["codec-rate"] == 0.5
    assert strategy.reports[2].strategy["codec-rate"] == pytest.approx(probe)
    assert strategy.reports[2].strategy["codec-rate-seconds"] > 1.0  # compute + bytes
    assert "codec-rate" in strategy.snapshot()


def test_a_fixed_rate_changes_nothing_and_tracks_nothing_new() -> None:
    strategy = FederatedStrategy(
        aggregator=AGGREGATORS.create("fedavg"), schedule=SCHEDULES.create("fixed", tau0=2),
        selector=SELECTORS.create("uniform"), node_wait_timeout=1, codec="topk:0.5")
    assert _round(strategy, 1, 1.0) == _round(strategy, 2, 0.9) == ["topk:0.5"] * 2
    assert not {"codec-rate", "codec-rate-seconds"} & set(strategy.reports[2].strategy)
    assert "codec-rate" not in strategy.snapshot()


def test_the_adaptive_rates_state_survives_a_checkpoint() -> None:
    schedule = AdaptiveCodecRate(link_mbps=1.0, interval=2)
    for i in range(5):
        rate = schedule.rate_for(parse_spec("topk:0.1"))
        schedule.observe(rate, [SiteRound(1.0, 0.0, 1e5 * rate, 3, 1.0 - 0.1 * i)])
    tree, arrays = encode_tree({"codec-rate": schedule})
    restored = decode_tree(tree, arrays, {"codec-rate": AdaptiveCodecRate()})["codec-rate"]
    assert vars(restored) == vars(schedule)
    assert restored.rate_for(parse_spec("topk:0.1")) == schedule.rate_for(parse_spec("topk:0.1"))
