"""SecAgg+'s pure core: masks cancel, drop-outs are recovered, tampering is detected, the
coordinator learns nothing it cannot, and a site never answers what would unmask one input."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.secure_aggregation.coordinator import SecAggRound
from strategies.wire import message_keys as keys
from strategies.wire.secure_aggregation.encoding import dequantised_sum, pack, quantise, unpack
from strategies.wire.secure_aggregation.errors import SecAggConfigError, SecAggError
from strategies.wire.secure_aggregation.participant import Participant
from strategies.wire.secure_aggregation.settings import RoundPlan, SecAggSettings, neighbour_count
from strategies.wire.secure_aggregation.weights import site_coefficient, sum_scale
from tests.strategies.secagg_sites import (FEDERATION, agreed_sites, identities, keyed_sites,
                                          random_levels, run_round, setup_reply)

NODES = [11, 22, 33, 44, 55]


def plain_sum(levels, nodes, modulus_bits):
    return sum(levels[n] for n in nodes) & np.uint64((1 << modulus_bits) - 1)


def test_masks_cancel_and_the_sum_is_exact():
    levels = random_levels(NODES, 1000)
    coordinator, result = run_round(levels)
    assert np.array_equal(result.exact, plain_sum(levels, NODES, coordinator.modulus_bits))
    assert result.summed == NODES and result.dropped == [] and result.bad_shares == {}


def test_a_masked_vector_alone_looks_nothing_like_the_input():
    coordinator, sites, _ = agreed_sites([1, 2, 3], 2000)
    for i, site in sites.items():  # all-zero inputs: the masked vectors are noise
        site.receive_shares(coordinator.collect_entries(i))
        masked = unpack(site.mask_levels(np.zeros(2000, dtype=np.uint64)),
                        coordinator.modulus_bits, 2000)
        assert np.count_nonzero(masked) > 1990
        assert abs(masked.mean() / 2 ** coordinator.modulus_bits - 0.5) < 0.05


def test_a_site_dropping_before_its_masked_input_is_left_out_exactly():
    levels = random_levels(NODES, 500, seed=1)
    coordinator, result = run_round(levels, drop={keys.SECAGG_COLLECT: [33]})
    kept = [n for n in NODES if n != 33]
    assert result.summed == kept and result.dropped == [33]
    assert np.array_equal(result.exact, plain_sum(levels, kept, coordinator.modulus_bits))


def test_sites_dropping_after_their_masked_input_stay_in_the_sum():
    nodes = list(range(1, 11))
    levels = random_levels(nodes, 300, seed=2)
    coordinator, result = run_round(levels, drop={keys.SECAGG_UNMASK: [2, 5, 9]})
    assert result.summed == nodes
    assert np.array_equal(result.exact, plain_sum(levels, nodes, coordinator.modulus_bits))


def test_three_sites_survive_one_dropping_after_its_masked_input():
    levels = random_levels([1, 2, 3], 50, seed=8)  # each secret: 2 of its 3 holders
    coordinator, result = run_round(levels, drop={keys.SECAGG_UNMASK: [2]})
    assert (coordinator.threshold, result.summed) == (2, [1, 2, 3])
    assert np.array_equal(result.exact, plain_sum(levels, [1, 2, 3], coordinator.modulus_bits))


def test_thirty_percent_dropouts_at_fifty_sites_with_log_degree():
    nodes = list(range(100, 150))
    levels = random_levels(nodes, 64, seed=3)
    k = neighbour_count(50)
    assert k < 49  # a sparse graph: of order log n, not every other site
    dropped = nodes[::10][:5] + nodes[1::5][:10]  # 15 of 50 after their masked input
    coordinator, result = run_round(levels, drop={keys.SECAGG_UNMASK: dropped})
    assert all(len(p) == k for p in coordinator.neighbours.values())
    assert np.array_equal(result.exact, plain_sum(levels, nodes, coordinator.modulus_bits))


def test_both_kinds_of_dropout_in_one_round():
    nodes = list(range(1, 8))
    levels = random_levels(nodes, 100, seed=4)
    coordinator, result = run_round(levels, drop={keys.SECAGG_COLLECT: [3],
                                                  keys.SECAGG_UNMASK: [6]})
    kept = [n for n in nodes if n != 3]
    assert result.dropped == [3]
    assert np.array_equal(result.exact, plain_sum(levels, kept, coordinator.modulus_bits))


def test_an_altered_ciphertext_is_refused_by_its_recipient():
    def alter(stage, node, entries):
        if stage == "deliver" and node == 22:
            texts = list(entries[keys.SECAGG_SHARES])
            texts[0] = texts[0][:-5] + bytes(5)
            entries = {**entries, keys.SECAGG_SHARES: texts}
        return entries
    with pytest.raises(SecAggError, match="fails authentication"):
        run_round(random_levels(NODES, 10), tamper=alter)


def test_a_share_sent_to_the_wrong_recipient_is_refused():
    def redirect(stage, node, entries):
        if stage == "deliver" and node == 22:
            entries = {**entries, keys.SECAGG_SHARES: entries[keys.SECAGG_SHARES][::-1]}
        return entries
    with pytest.raises(SecAggError, match="fails authentication"):
        run_round(random_levels(NODES, 10), tamper=redirect)


def test_a_tampered_unmask_share_is_detected_and_its_holder_named():
    nodes = list(range(1, 8))  # complete graph: 6 holders per secret, threshold 4
    levels = random_levels(nodes, 50, seed=5)
    def corrupt(stage, node, entries):
        if stage == keys.SECAGG_UNMASK and node == 4:
            shares = [s[:-1] + bytes([s[-1] ^ 1]) for s in entries[keys.SECAGG_SEED_SHARES]]
            entries = {**entries, keys.SECAGG_SEED_SHARES: shares}
        return entries
    coordinator, result = run_round(levels, tamper=corrupt)
    assert np.array_equal(result.exact, plain_sum(levels, nodes, coordinator.modulus_bits))
    assert set(result.bad_shares) == {4} and "seed" in result.bad_shares[4]


def test_too_few_honest_shares_fail_the_round_naming_the_site():
    levels = random_levels([1, 2, 3], 20, seed=6)  # 3 holders, t = 2: one spare share
    def corrupt(stage, node, entries):
        if stage == keys.SECAGG_UNMASK and node in (1, 2):
            entries = {**entries, keys.SECAGG_SEED_SHARES: [
                bytes(len(s)) for s in entries[keys.SECAGG_SEED_SHARES]]}
        return entries
    with pytest.raises(SecAggError, match="self-mask seed of site"):
        run_round(levels, tamper=corrupt)


def _masked_sites(nodes: list[int]):
    coordinator, sites, ids = agreed_sites(nodes, 4)
    for i, site in sites.items():
        site.receive_shares(coordinator.collect_entries(i))
        coordinator.take_masked(i, site.mask_levels(np.zeros(4, dtype=np.uint64)))
    return coordinator, sites, ids


def _signed(coordinator, sites, ids):
    for i in coordinator.stage_nodes(keys.SECAGG_CONSISTENCY):
        coordinator.take_consistency(i, sites[i].consistency(coordinator.consistency_entries(i),
                                                             ids[i]))


def test_a_site_never_gives_both_shares_of_one_neighbour():
    coordinator, sites, ids = _masked_sites([1, 2, 3])
    with pytest.raises(SecAggError, match="before this site signed"):
        sites[1].unmask(coordinator.unmask_entries(1), 2, ids[1])
    _signed(coordinator, sites, ids)
    entries = coordinator.unmask_entries(1)
    reply = sites[1].unmask(entries, 2, ids[1])
    assert not set(reply[keys.SECAGG_SEED_SHARES_OF]) & set(reply[keys.SECAGG_KEY_SHARES_OF])
    with pytest.raises(SecAggError, match="another survivor set"):
        sites[1].unmask({**entries, keys.SECAGG_SURVIVORS: [1, 2, 9]}, 2, ids[1])
    with pytest.raises(SecAggError, match="fewer than 4"):
        sites[1].unmask(entries, 4, ids[1])  # the site's policy: at least 4 inputs in the sum
    with pytest.raises(SecAggError, match="size of the survivor set"):
        sites[1].unmask({**entries, keys.SECAGG_SUMMED: 1}, 2, ids[1])


def test_a_site_signs_one_survivor_set_that_holds_itself_and_its_masking_neighbours():
    coordinator, sites, ids = _masked_sites([1, 2, 3])
    entries = coordinator.consistency_entries(1)
    names = entries[keys.SECAGG_SURVIVOR_NAMES]
    with pytest.raises(SecAggError, match="under its own name"):
        sites[1].consistency({**entries, keys.SECAGG_SURVIVORS: [2, 3],
                              keys.SECAGG_SURVIVOR_NAMES: names[1:]}, ids[1])
    with pytest.raises(SecAggError, match="under those names"):
        sites[1].consistency({**entries, keys.SECAGG_SURVIVOR_NAMES:
                              [names[0], names[2], names[1]]}, ids[1])
    sites[1].consistency(entries, ids[1])
    with pytest.raises(SecAggError, match="already signed"):
        sites[1].consistency(entries, ids[1])


def test_unmask_needs_enough_valid_signatures_by_distinct_survivors():
    coordinator, sites, ids = _masked_sites([1, 2, 3, 4])
    _signed(coordinator, sites, ids)
    entries = coordinator.unmask_entries(1)
    signatures = entries[keys.SECAGG_SIGNATURES]
    assert sites[1].needed_signatures() == 3
    with pytest.raises(SecAggError, match="fewer than 3"):
        sites[1].unmask({**entries, keys.SECAGG_SIGNERS: [1, 2],
                         keys.SECAGG_SIGNATURES: signatures[:2]}, 2, ids[1])
    with pytest.raises(SecAggError, match="repeated or not survivors"):
        sites[1].unmask({**entries, keys.SECAGG_SIGNERS: [1, 2, 2, 3],
                         keys.SECAGG_SIGNATURES: [*signatures[:2], *signatures[1:3]]}, 2, ids[1])
    forged = [signatures[0], signatures[1], signatures[1], signatures[3]]  # 3's is 2's
    with pytest.raises(SecAggError, match="'site-3': the signature does not verify"):
        sites[1].unmask({**entries, keys.SECAGG_SIGNATURES: forged}, 2, ids[1])
    assert sites[1].unmask(entries, 2, ids[1])[keys.SECAGG_SEED_SHARES_OF] == [1, 2, 3, 4]


def test_a_site_masks_once_per_round_and_only_its_own_round():
    coordinator, sites, ids = keyed_sites([1, 2, 3], 4, server_round=2)
    with pytest.raises(SecAggError, match="round 3"):
        sites[1].share_keys({**coordinator.share_keys_entries(1), keys.SERVER_ROUND: 3}, ids[1])
    for i, site in sites.items():
        coordinator.take_shares(i, site.share_keys(coordinator.share_keys_entries(i), ids[i]))
    sites[1].receive_shares(coordinator.collect_entries(1))
    sites[1].mask_levels(np.zeros(4, dtype=np.uint64))
    with pytest.raises(SecAggError, match="already sent its masked input"):
        sites[1].mask_levels(np.ones(4, dtype=np.uint64))


def test_the_state_a_site_keeps_between_stages_round_trips():
    coordinator, sites, ids = keyed_sites([1, 2, 3], 4)
    for i in sites:
        sites[i] = Participant.from_bytes(sites[i].to_bytes())
        coordinator.take_shares(i, sites[i].share_keys(coordinator.share_keys_entries(i),
                                                       ids[i]))
    for i in sites:
        sites[i] = Participant.from_bytes(sites[i].to_bytes())
        sites[i].receive_shares(coordinator.collect_entries(i))
        sites[i] = Participant.from_bytes(sites[i].to_bytes())
        coordinator.take_masked(i, sites[i].mask_levels(np.full(4, i, dtype=np.uint64)))
    for i in sites:
        sites[i] = Participant.from_bytes(sites[i].to_bytes())
        coordinator.take_consistency(i, sites[i].consistency(coordinator.consistency_entries(i),
                                                             ids[i]))
    for i in sites:
        sites[i] = Participant.from_bytes(sites[i].to_bytes())
        coordinator.take_unmask(i, sites[i].unmask(coordinator.unmask_entries(i), 2, ids[i]))
    assert coordinator.finish().exact.tolist() == [6, 6, 6, 6]
    with pytest.raises(SecAggError, match="unreadable"):
        Participant.from_bytes(b"{not json")


def test_the_coordinator_refuses_a_repeated_key_and_a_stray_reply():
    settings = SecAggSettings()
    coordinator = SecAggRound(settings, 1, [1, 2, 3], seed=0, length=4)
    ids = identities([1, 2, 3])
    site = Participant.start(settings.plan(1, 1, 3), FEDERATION)
    coordinator.take_keys(1, setup_reply(site, ids[1]))
    with pytest.raises(SecAggError, match="repeats a public key"):
        coordinator.take_keys(2, setup_reply(site, ids[2]))
    other = Participant.start(settings.plan(1, 2, 3), FEDERATION)
    with pytest.raises(SecAggError, match="repeats site name"):
        coordinator.take_keys(2, setup_reply(other, ids[1]))
    with pytest.raises(SecAggError, match="not asked"):
        coordinator.take_keys(99, setup_reply(other, ids[2]))
    with pytest.raises(SecAggError, match="min-participants"):
        SecAggRound(SecAggSettings(min_participants=4), 1, [1, 2, 3], seed=0, length=4)


def test_a_malformed_masked_vector_is_refused():
    levels = random_levels([1, 2, 3], 10)
    coordinator = SecAggRound(SecAggSettings(), 1, [1, 2, 3], seed=0, length=10)
    with pytest.raises(SecAggError, match="not asked"):
        coordinator.take_masked(1, pack(levels[1], coordinator.modulus_bits))
    with pytest.raises(SecAggError, match="bytes"):
        unpack(np.zeros(3, dtype=np.uint8), 22, 10)


def test_settings_and_plans_are_checked_naming_the_key():
    for bad, key in ((dict(bits=31), "secagg.bits"), (dict(clip=0.0), "secagg.clip"),
                     (dict(threshold=0.4), "secagg.threshold"),
                     (dict(neighbours=1), "secagg.neighbours"),
                     (dict(min_participants=1), "secagg.min-participants")):
        with pytest.raises(SecAggConfigError, match=key):
            SecAggSettings(**bad).check()
    with pytest.raises(SecAggError, match="more than half"):
        RoundPlan(1, 1, 10, 8, 4, 20, 1.0)  # 4 of 9 holders
    assert RoundPlan(1, 1, 10, 8, 5, 20, 1.0).threshold == 5
    with pytest.raises(SecAggError, match=keys.SECAGG_BITS):
        RoundPlan.parse({**SecAggSettings().plan(1, 1, 3).entries(), keys.SECAGG_BITS: "20"})


def test_quantisation_is_unbiased_and_the_sum_dequantises():
    rng = np.random.default_rng(0)
    x = rng.uniform(-0.5, 0.5, (4, 20000))
    levels = [quantise(row, clip=1.0, bits=12) for row in x]
    back = dequantised_sum(sum(levels), 4, clip=1.0, bits=12)
    step = 2.0 / (2 ** 12 - 1)
    assert np.max(np.abs(back - x.sum(axis=0))) <= 4 * step
    assert abs(np.mean(back - x.sum(axis=0))) < step / 20
    assert quantise(np.array([5.0, -5.0]), clip=1.0, bits=12).tolist() == [4095, 0]
    with pytest.raises(SecAggError, match="not finite"):
        quantise(np.array([np.nan]), clip=1.0, bits=12)


def test_a_sites_coefficient_is_the_sums_scale_times_its_fold_weight():
    # c_i = kappa m_i / a_i with m_i = min(n_i, r): S / kappa is the plain round's running sum
    sizes, steps = [100, 40, 250, 400], [8.0, 3.0, 8.0, 6.0]
    reference, floor = 250, 4.0
    for n, a in zip(sizes, steps):
        counted = min(n, reference)
        assert site_coefficient(n, reference) == pytest.approx(sum_scale(reference) * counted)
        fednova = site_coefficient(n, reference, a, floor)
        assert fednova <= 1.0
        assert fednova == pytest.approx(sum_scale(reference, floor) * counted / max(a, floor))
    with pytest.raises(SecAggError, match="weight reference"):
        sum_scale(0.0)


def test_rand_k_keeps_the_statistics_whole_and_draws_among_the_weights():
    from strategies.wire.secure_aggregation.vector import kept_indices

    like = [np.zeros((10, 10), np.float32), np.zeros(4, np.float32),  # weight, running_mean
            np.zeros(3, np.int64), np.zeros(4, np.float32)]           # counter, running_var
    kept = kept_indices(like, "randk:0.1", seed=5, whole=(1, 3))
    assert list(kept[-8:]) == list(range(100, 108))  # both statistics, all 8 values
    assert kept.size == 10 + 8 and np.all(kept[:10] < 100)
    assert np.array_equal(kept, kept_indices(like, "randk:0.1", seed=5, whole=(1, 3)))
    assert kept_indices(like, "none", seed=5) is None
    with pytest.raises(SecAggConfigError, match="strategy.codec"):
        kept_indices(like, "topk:0.1", seed=5)
