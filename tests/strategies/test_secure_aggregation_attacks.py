"""A coordinator that lies cannot unmask one site's SecAgg+ input (issue #46, found 1 and 2).

Both attacks were reproduced on the unauthenticated protocol: every site-side check
passed and the target's masked update came out exactly.

1. Lying about drop-outs (Bonawitz et al. 2017, section 4.4): each holder is told that
   the target survived and that everyone else dropped out, so it reveals the target's
   self-mask seed share and every other neighbour's mask-key share. The consistency
   stage now makes each site sign the one survivor set it was shown, and a site reveals
   only for a set with ``max(t, floor(n / 2) + 1)`` valid signatures of its members.
2. Key substitution (Bell et al. 2020, "a PKI"): the coordinator hands a site its own
   public keys as a neighbour's and decrypts the shares addressed to them. Round keys are
   now signed with the site's long-term key and checked against the site's roster.
"""

from __future__ import annotations

import numpy as np
import pytest

from strategies.wire import message_keys as keys
from strategies.wire.secure_aggregation.crypto import KeyPair
from strategies.wire.secure_aggregation.errors import SecAggError
from strategies.wire.secure_aggregation.settings import SecAggSettings
from tests.strategies.secagg_sites import agreed_sites, keyed_sites, random_levels, run_round

SHIPPED = SecAggSettings(threshold=0.5, min_participants=3)  # the shipped policy's values


def _masked(nodes: list[int], levels: dict[int, np.ndarray]):
    coordinator, sites, ids = agreed_sites(nodes, 4, SHIPPED)
    for node, site in sites.items():
        site.receive_shares(coordinator.collect_entries(node))
        coordinator.take_masked(node, site.mask_levels(levels[node]))
    return coordinator, sites, ids


def _story(coordinator, ids, node_of: dict[int, int], told: list[int]) -> dict:
    """Survivor entries naming the participants ``told`` (indices) and their sites."""
    told = sorted(told)
    return {keys.SECAGG_SURVIVORS: told,
            keys.SECAGG_SURVIVOR_NAMES: [ids[node_of[i]].name for i in told]}


def test_lying_about_drop_outs_gets_no_share_from_any_holder():
    nodes = [1, 2, 3, 4]
    levels = random_levels(nodes, 4)
    coordinator, sites, ids = _masked(nodes, levels)
    node_of = {index: node for node, index in coordinator.index.items()}
    target = coordinator.index[1]
    holders = [n for n in nodes if n != 1]
    signatures: dict[int, dict[int, bytes]] = {}
    for holder in holders:  # each holder: "only the target and you survived"
        index = coordinator.index[holder]
        story = _story(coordinator, ids, node_of, [target, index])
        reply = sites[holder].consistency({**coordinator.consistency_entries(holder), **story},
                                          ids[holder])
        signatures[holder] = {index: reply[keys.SECAGG_SURVIVOR_SIGNATURE]}
    # the target signs the story of one holder (a site signs one set per round)
    first = holders[0]
    story = _story(coordinator, ids, node_of, [target, coordinator.index[first]])
    reply = sites[1].consistency({**coordinator.consistency_entries(1), **story}, ids[1])
    signatures[first][target] = reply[keys.SECAGG_SURVIVOR_SIGNATURE]
    for holder in holders:
        index = coordinator.index[holder]
        shown = signatures[holder]
        entries = {**coordinator.unmask_entries(holder),
                   **_story(coordinator, ids, node_of, [target, index]),
                   keys.SECAGG_SUMMED: 2, keys.SECAGG_SIGNERS: sorted(shown),
                   keys.SECAGG_SIGNATURES: [shown[i] for i in sorted(shown)]}
        with pytest.raises(SecAggError, match="fewer than"):
            sites[holder].unmask(entries, 2, ids[holder])  # the sum's own floor set aside
    # a story signed by others is not the one this holder signed: refused as well
    honest = {**coordinator.unmask_entries(holders[1]),
              **_story(coordinator, ids, node_of, [target, coordinator.index[first]])}
    with pytest.raises(SecAggError, match="another survivor set"):
        sites[holders[1]].unmask(honest, 2, ids[holders[1]])


def test_a_substituted_neighbour_key_is_refused_naming_the_site():
    coordinator, sites, ids = keyed_sites([1, 2, 3, 4], 4, SHIPPED)
    entries = coordinator.share_keys_entries(1)
    peers = entries[keys.SECAGG_PEERS]
    fake_c, fake_s = KeyPair(), KeyPair()  # the coordinator's own key pairs
    keys_c = list(entries[keys.SECAGG_PEER_KEYS_C])
    keys_s = list(entries[keys.SECAGG_PEER_KEYS_S])
    keys_c[0], keys_s[0] = fake_c.public, fake_s.public
    victim = entries[keys.SECAGG_PEER_NAMES][0]
    with pytest.raises(SecAggError, match=f"site '{victim}': the signature does not verify"):
        sites[1].share_keys({**entries, keys.SECAGG_PEER_KEYS_C: keys_c,
                             keys.SECAGG_PEER_KEYS_S: keys_s}, ids[1])
    assert not sites[1].held and peers  # nothing was shared
    renamed = list(entries[keys.SECAGG_PEER_NAMES])
    renamed[0] = "site-99"  # a site the roster does not hold
    with pytest.raises(SecAggError, match="'site-99' is not in this site's roster"):
        sites[1].share_keys({**entries, keys.SECAGG_PEER_NAMES: renamed}, ids[1])


def test_signed_keys_of_another_round_are_refused():
    old, _, _ = keyed_sites([1, 2, 3], 4, SHIPPED, server_round=1)
    new, sites, ids = keyed_sites([1, 2, 3], 4, SHIPPED, server_round=2)
    stale = old.share_keys_entries(1)  # keys and signatures of round 1, replayed in round 2
    entries = {**new.share_keys_entries(1),
               **{k: stale[k] for k in (keys.SECAGG_PEER_KEYS_C, keys.SECAGG_PEER_KEYS_S,
                                        keys.SECAGG_PEER_SIGNATURES)}}
    with pytest.raises(SecAggError, match="the signature does not verify"):
        sites[1].share_keys(entries, ids[1])


def test_thirty_percent_honest_drop_outs_still_unmask():
    nodes = list(range(1, 11))
    levels = random_levels(nodes, 6)
    coordinator, secure = run_round(levels, SHIPPED, drop={keys.SECAGG_COLLECT: [2, 5, 9]},
                                    min_participants=3)
    kept = [n for n in nodes if n not in (2, 5, 9)]
    assert secure.exact.tolist() == sum(levels[n] for n in kept).tolist()
    assert len(coordinator.masked_from) == 7


def test_the_shares_are_flowers_format_without_its_thread_pool():
    """#46 item 6: split and rebuild call pycryptodome's Shamir directly, in Flower's
    byte format, so either side rebuilds the other's shares."""
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares

    from strategies.wire.secure_aggregation.crypto import rebuild_secret, split_secret
    secret = bytes(range(32))
    ours, theirs = split_secret(secret, 3, 5), create_shares(secret, 3, 5)
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    assert combine_shares(ours[1:4]) == secret == rebuild_secret(theirs[::2])
    assert rebuild_secret([ours[0], ours[4], ours[2]]) == secret
    with pytest.raises(SecAggError, match="do not combine"):
        rebuild_secret([ours[0], ours[1][:-16]])


def test_signatures_under_another_round_plan_do_not_count():
    """A coordinator that told some sites a smaller n (fewer signatures needed) cannot use
    their signatures where the plan is the real one: the plan is in the signed statement."""
    from strategies.wire.secure_aggregation.signing import survivor_statement
    nodes = [1, 2, 3, 4]
    coordinator, sites, ids = _masked(nodes, random_levels(nodes, 4))
    for node in nodes:
        coordinator.take_consistency(node, sites[node].consistency(
            coordinator.consistency_entries(node), ids[node]))
    entries = coordinator.unmask_entries(1)
    node_of = {index: node for node, index in coordinator.index.items()}
    plan = sites[1].plan
    survivors = list(zip(entries[keys.SECAGG_SURVIVORS], entries[keys.SECAGG_SURVIVOR_NAMES]))
    smaller = survivor_statement("fed-test", plan.server_round, survivors, 3, plan.threshold)
    forged = [ids[node_of[i]].sign(smaller) for i in entries[keys.SECAGG_SIGNERS]]
    with pytest.raises(SecAggError, match="the signature does not verify"):
        sites[1].unmask({**entries, keys.SECAGG_SIGNATURES: forged}, 2, ids[1])
    assert sites[1].unmask(entries, 2, ids[1])[keys.SECAGG_SEED_SHARES_OF] == [1, 2, 3, 4]


def test_drop_outs_at_the_consistency_stage_stay_in_the_sum_while_enough_sign():
    nodes = list(range(1, 11))
    levels = random_levels(nodes, 6)
    coordinator, secure = run_round(levels, SHIPPED, drop={keys.SECAGG_CONSISTENCY: [3, 7]},
                                    min_participants=3)
    assert len(coordinator.survivor_signatures) == 8  # 8 >= max(t, 10 // 2 + 1) = 6
    assert secure.exact.tolist() == sum(levels.values()).tolist()  # all 10 inputs arrived
    with pytest.raises(SecAggError, match="5 signatures .* fewer than 6"):  # nobody reveals
        run_round(levels, SHIPPED, drop={keys.SECAGG_CONSISTENCY: [1, 2, 3, 4, 5]},
                  min_participants=3)
