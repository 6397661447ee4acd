"""One lying site cannot choose PruneFL's re-pruning (#45, found 7: "one of 5 sites'
squared-gradient reports decided PruneFL's re-pruning: all 200 of its units were kept, and the
honest top-200 units kept fell from 200 to 66").

Through the product: the strategy ``build_strategy`` makes from a run config, on the in-process
engine, with five scripted pruned sites that answer as the ClientApp does (the compacted update,
the mask version acknowledged, the squared gradients encoded with the round's report codec).
The model is one prunable array ``w`` of 1000 weights and an unpruned bias; the initial pruning
keeps one weight, the re-pruning of round 1 may keep 266 more (``pruning.max-density``), and
with a large time constant it keeps the 266 candidates of largest squared gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, \
    MetricRecord, RecordDict

from app.config.run_config import RunConfig
from app.engine import InProcessGrid, VirtualSite
from app.server_app import build_strategy
from strategies.compression import encode
from strategies.plugins.pruning.prunefl import PruneFL
from strategies.rounds.reply_intake import TrainReply
from strategies.robust import clip_factors, update_norm
from strategies.wire import message_keys as keys
from strategies.wire.model_layout import unpack_model
from strategies.plugins.pruning.pruning_round import (REPORT_BOUND, PruningRound,
                                                      squared_gradients)
from strategies.wire.update_codec import pack_update

pytestmark = pytest.mark.usefixtures("server_identity")

UNITS, TOP, ROOM = 1000, 200, 266
STRUCTURE = {"mode": "unstructured", "groups": [{"name": "w", "array": "w"}]}
#: |w| grows with the index: the initial pruning keeps w[999], which stays (in no set below).
MODEL = {"w": np.linspace(0.01, 1.0, UNITS, dtype=np.float32),
         "b": np.zeros(4, np.float32)}
OPTIONS = {"initial_density": 0.001, "interval": 1, "max_density": (ROOM + 1) / UNITS,
           "time_per_weight": 1.0, "time_constant": 1e6, "report_codec": "none"}
RUN = {"min-nodes": 5, "node-wait-timeout": 5, "fraction-evaluate": 0.0,
       "strategy.pruning": "prunefl", **{f"pruning.{k.replace('_', '-')}": v
                                         for k, v in OPTIONS.items()}}
_ORDER = np.random.default_rng(0).permutation(UNITS - 1)
#: The units the honest sites find important, and the units the liar pushes.
HONEST_TOP, LIAR_UNITS = np.sort(_ORDER[:TOP]), np.sort(_ORDER[TOP:2 * TOP])

Report = Callable[[int], np.ndarray]


def honest(site: int) -> np.ndarray:
    """A site's squared gradients over (w, b): 1 on the honest top units, 0.05 elsewhere, each
    times its own log-normal factor (sites see different data)."""
    base = np.full(UNITS + 4, 0.05)
    base[HONEST_TOP] = 1.0
    noise = np.exp(0.3 * np.random.default_rng(100 + site).standard_normal(base.size))
    return (base * noise).astype(np.float32)


def liar(_site: int) -> np.ndarray:
    """50 on its own 200 units, 0 elsewhere."""
    vector = np.zeros(UNITS + 4, np.float32)
    vector[LIAR_UNITS] = 50.0
    return vector


def pruned_site(site: int, report: Report) -> Callable[[Message, Context], Message]:
    """A pruned site's answer to a train instruction: a zero update of the compacted model, the
    mask version acknowledged and, when the round asks, ``report(site)`` encoded."""

    def answer(message: Message, _context: Context) -> Message:
        assert message.metadata.message_type == MessageType.TRAIN
        config = message.content[keys.CONFIG]
        arrays = {k: v.numpy() for k, v in message.content[keys.ARRAYS].items()
                  if not k.startswith("pruning-")}
        delta = [np.zeros_like(a) for a in unpack_model(arrays).values()]
        record = {k: Array(v) for k, v in pack_update(delta, "none").items()}
        if config[keys.PRUNING_REPORT]:
            record[keys.PRUNING_SQGRAD] = Array(encode(report(site), config[keys.PRUNING_REPORT]))
        content = RecordDict({
            keys.SITE: ConfigRecord({keys.SITE_NAME: f"site-{site}"}),
            keys.DELTA: ArrayRecord(record),
            keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: 10, keys.STEPS: 1,
                                        keys.TRAIN_LOSS: 0.5, keys.INITIAL_LOSS: 1.0,
                                        keys.PRUNING_VERSION: config[keys.PRUNING_VERSION]})})
        return Message(content, reply_to=message)

    return answer


def repruned(reports: list[Report]) -> tuple[np.ndarray, dict[str, float]]:
    """Round 1 of the federation of ``reports``' sites: the units kept and the round's info."""
    strategy = build_strategy(RunConfig.from_mapping({**RUN, "min-nodes": len(reports)}))
    pruning = strategy.train.feature(PruningRound)
    start, _ = pruning.start(ArrayRecord(
        {k: Array(v) for k, v in MODEL.items()}), STRUCTURE)
    sites = [VirtualSite({"site-name": f"site-{i}"}, pruned_site(i, report))
             for i, report in enumerate(reports)]
    strategy.start(grid=InProcessGrid(sites, run_id=42), initial_arrays=start, num_rounds=1)
    return pruning.pruning.masks["w"], strategy.reports[1].strategy


def chosen(squared: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, float]]:
    """PruneFL's re-pruning of ``MODEL`` from the squared gradients ``squared``: its mask of
    ``w`` and its info."""
    pruning = PruneFL(**OPTIONS)
    pruning.initialise(MODEL, STRUCTURE)
    info = pruning.observe(1, MODEL, squared, 0.0)
    return pruning.masks["w"], info


def plain_sum(reports: list[np.ndarray]) -> np.ndarray:
    """The paper's sum of the sites' ``reports``, in float64 as the rounds summed them."""
    return sum(r.astype(np.float64) for r in reports)


def summed_choice(reports: list[np.ndarray]) -> np.ndarray:
    """The paper's choice from the plain sum of ``reports`` (PruneFL's criterion itself)."""
    total = plain_sum(reports)
    return chosen({"w": total[:UNITS], "b": total[UNITS:]})[0]


def combined(reports: list[np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The round's combination of ``reports`` (one reply each, codec ``none``)."""
    replies = [TrainReply(node_id=i, site=f"site-{i}", delta=[], num_examples=10, steps=1,
                          train_loss=0.5, channels={keys.PRUNING_SQGRAD: encode(r, "none")})
               for i, r in enumerate(reports)]
    squared, info = squared_gradients(replies, MODEL, "none")
    assert squared is not None
    return squared, info


def test_the_plain_sum_lets_one_liar_of_five_choose_the_mask():
    """The attack on the paper's sum itself, as the found item measured it."""
    kept = summed_choice([liar(0), *(honest(i) for i in range(1, 5))])
    assert int(kept[LIAR_UNITS].sum()) == TOP
    assert int(kept[HONEST_TOP].sum()) == ROOM - TOP  # 66 of 200


def test_one_liar_of_five_cannot_choose_the_mask():
    kept, info = repruned([liar, honest, honest, honest, honest])
    assert int(kept[HONEST_TOP].sum()) == TOP  # all 200 honest top units kept
    assert int(kept.sum()) == ROOM + 1  # the budget is used: w[999] stays, 266 added
    # the liar's clip factor: its report scaled to kappa (1.5) x the lower median norm
    assert info["pruning-clip-factor/site-0"] < 0.05
    assert all(info[f"pruning-clip-factor/site-{i}"] == 1.0 for i in range(1, 5))
    assert info["pruning-reports"] == 5
    # it steers only the 66 units past the honest top (all of low, near-equal honest value):
    # 40 of them are its own, against 16 had it reported honestly
    assert int(kept[LIAR_UNITS].sum()) <= ROOM - TOP


@pytest.mark.parametrize("sites", [3, 5])
def test_a_liar_cannot_raise_a_coordinate_above_the_honest_values(sites: int):
    """The bound: with fewer than half the reports lying, each coordinate of the median lies
    within the honest (clipped, here unclipped) values of that coordinate."""
    reports = [liar(0), *(honest(i) for i in range(1, sites))]
    squared, info = combined(reports)
    total = np.concatenate([squared["w"], squared["b"]])
    stack = np.stack(reports[1:]).astype(np.float64)
    assert np.all(total <= sites * stack.max(axis=0) + 1e-12)
    assert np.all(total >= sites * stack.min(axis=0) - 1e-12)
    assert info["pruning-clip-factor/site-0"] < 0.05  # clipped: its L2 norm is ~47x the honest
    kept, _ = chosen(squared)
    assert int(kept[HONEST_TOP].sum()) == TOP
    assert int(kept[LIAR_UNITS].sum()) <= ROOM - TOP  # 54 (3 sites), 40 (5), of the margin's 66


def test_the_clip_alone_would_not_hold_a_liar_spread_over_many_units():
    """Heavy-tailed honest reports (as real squared gradients are): a liar that spreads its
    clipped norm over 700 units just past the honest top beats the clipped sum, not the
    median of the clipped reports."""
    base = np.exp(2.0 * np.random.default_rng(3).standard_normal(UNITS + 4))
    reports = [(base * np.exp(0.3 * np.random.default_rng(200 + i).standard_normal(base.size))
                ).astype(np.float32) for i in range(1, 5)]
    ranked = [u for u in np.argsort(-plain_sum(reports)[:UNITS]) if u != UNITS - 1]
    top, spread = np.array(ranked[:TOP]), np.array(ranked[TOP:TOP + 700])
    lie = np.zeros(UNITS + 4, np.float32)
    lie[spread] = 1e4
    reports.insert(0, lie)
    factors, _ = clip_factors(np.array([update_norm([r.astype(np.float64)]) for r in reports]),
                              REPORT_BOUND)
    clipped_sum = summed_choice([(r * f).astype(np.float32) for r, f in zip(reports, factors)])
    assert int(clipped_sum[top].sum()) < 100  # 78 of 200
    kept, _ = chosen(combined(reports)[0])
    assert int(kept[top].sum()) == TOP


def test_two_honest_sites_re_prune_bit_for_bit_as_by_the_plain_sum():
    """With 2 sites the median is the mean: where the clip does not bind, the round re-prunes
    from exactly the paper's sum (the mask and the objective equal to the last bit)."""
    kept, info = repruned([honest, honest])
    reports = [honest(0), honest(1)]
    assert info["pruning-clip-factor/site-0"] == info["pruning-clip-factor/site-1"] == 1.0
    total = plain_sum(reports)
    by_sum, by_sum_info = chosen({"w": total[:UNITS], "b": total[UNITS:]})
    np.testing.assert_array_equal(kept, by_sum)
    assert info["pruning-objective"] == by_sum_info["pruning-objective"]
    squared, _ = combined(reports)
    np.testing.assert_array_equal(np.concatenate([squared["w"], squared["b"]]), total)


def test_a_report_of_zeros_sets_no_bound():
    """1 site of 2 reporting zeros: the lower median norm would be 0 and clip the other report to
    zeros (no unit re-added); it sets no bound, and the median of the two is half the honest
    report, so the round re-prunes from the honest report alone, bit for bit."""
    report = honest(1)
    squared, info = combined([np.zeros(UNITS + 4, np.float32), report])
    assert info["pruning-clip-factor/site-0"] == info["pruning-clip-factor/site-1"] == 1.0
    np.testing.assert_array_equal(np.concatenate([squared["w"], squared["b"]]), report)
    np.testing.assert_array_equal(chosen(squared)[0], summed_choice([report]))


@pytest.mark.parametrize("sites", [3, 5, 10])
def test_honest_sites_keep_their_important_units_and_lose_no_objective(sites: int):
    """From 3 sites the median is not the mean, so the choice cannot be the plain sum's bit for
    bit: only units at the greedy's margin move (here the 66 past the honest top, whose honest
    values are all alike), and the paper's objective of the chosen mask, read with the honest
    sum, stays within 0.1% of the sum's own choice."""
    reports = [honest(i) for i in range(sites)]
    kept, _ = chosen(combined(reports)[0])
    by_sum = summed_choice(reports)
    assert int(kept[HONEST_TOP].sum()) == int(by_sum[HONEST_TOP].sum()) == TOP
    assert int(kept.sum()) == int(by_sum.sum()) == ROOM + 1
    value = plain_sum(reports)[:UNITS]
    assert value[kept].sum() >= 0.999 * value[by_sum].sum()
