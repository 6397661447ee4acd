"""The site's side of SecAgg+: five stages through the site's round against the core's coordinator.

Found (#30): a site sent every update in the clear, with its per-site residual norm;
nothing at a site could take part in a securely aggregated round.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import replace

import numpy as np
import pytest

from clients.site.secure_state import STATE_FILE
from clients.site.secure_update import SecureInstruction, coefficient_of, secure_values
from clients.site.site_feature import LocalUpdate
from clients.site.site_round import answer
from clients.site.state_retention import expire_federation_states
from strategies.wire import message_keys as keys
from strategies.wire.secure_aggregation.crypto import KeyPair
from strategies.wire.secure_aggregation.errors import SecAggError
from strategies.wire.secure_aggregation.settings import SecAggSettings
from tests.clients.site.secure_federation import (FEDERATION, MODEL, instruction, run_round,
                                                  sites)
from tests.clients.site_round_fixtures import run_settings


def test_three_sites_unmask_to_the_sum_of_what_they_quantised(tmp_path, tasks, monkeypatch):
    members = sites(tmp_path, 3)
    record = run_round(monkeypatch, members, tasks)
    result = record.result
    assert sorted(result.summed) == [100, 101, 102] and result.dropped == []
    # bit for bit: the unmasked sum is the sum of the sites' b-bit levels (m > 3 (2^16 - 1))
    np.testing.assert_array_equal(result.exact, np.sum(record.quantised, axis=0))
    step = 2 * 0.5 / (2 ** 16 - 1)
    np.testing.assert_allclose(result.total, np.sum(record.values, axis=0), atol=3 * step)
    assert all(np.abs(v).max() <= 0.5 for v in record.values)  # clipped to secagg.clip
    assert np.abs(np.sum(record.values, axis=0)).max() > 0  # the sites trained
    for reply in record.replies[keys.SECAGG_COLLECT].values():
        assert set(reply.update) == {keys.SECAGG_MASKED}
        assert reply.update[keys.SECAGG_MASKED].dtype == np.uint8
        assert keys.RESIDUAL_NORM not in reply.metrics
        assert set(keys.TRAIN_REQUIRED) <= set(reply.metrics)
        assert reply.secagg is None
    for reply in record.replies[keys.SECAGG_SETUP].values():
        assert reply.metrics == {keys.NUM_EXAMPLES: 12} and reply.update is None
        assert set(reply.secagg) == {keys.SECAGG_KEY_C, keys.SECAGG_KEY_S,
                                     keys.SECAGG_KEY_SIGNATURE}
    assert not any((m.state_dir / FEDERATION / STATE_FILE).exists() for m in members)


def test_a_substituted_key_makes_the_site_leave_the_round(tmp_path, tasks, monkeypatch):
    """#46 found 2 through the site's round: a neighbour key the coordinator swapped for its
    own is refused, naming the neighbour, and the site's round (its secrets) is deleted."""
    members = sites(tmp_path, 3)
    fake = KeyPair()

    def substitute(name, entries):
        if name == "hospital-1" and entries[keys.SECAGG_STAGE] == keys.SECAGG_SHARE_KEYS:
            entries[keys.SECAGG_PEER_KEYS_S] = [fake.public,
                                                *entries[keys.SECAGG_PEER_KEYS_S][1:]]

    with pytest.raises(SecAggError, match="site 'hospital-[23]': the signature does not "
                                          "verify"):
        run_round(monkeypatch, members, tasks, tamper=substitute)
    assert not (members[0].state_dir / FEDERATION / STATE_FILE).exists()


def test_a_site_dropping_after_its_shares_is_unmasked_out(tmp_path, tasks, monkeypatch):
    members = sites(tmp_path, 4)
    record = run_round(monkeypatch, members, tasks, drop_after_shares=("hospital-2",))
    assert sorted(record.result.summed) == [100, 102, 103] and record.result.dropped == [101]
    np.testing.assert_array_equal(record.result.exact, np.sum(record.quantised, axis=0))
    # the dropped site keeps its round until its next setup: it never sent an input
    assert (members[1].state_dir / FEDERATION / STATE_FILE).exists()


def test_randk_sends_the_shared_coordinates_and_keeps_the_residual(tmp_path, tasks, monkeypatch):
    members = sites(tmp_path, 3)
    record = run_round(monkeypatch, members, tasks, codec="randk:0.25")
    np.testing.assert_array_equal(record.result.exact, np.sum(record.quantised, axis=0))
    size = record.values[0].size
    residual = np.load(members[0].state_dir / FEDERATION / "ef-residual.npy")
    assert residual.size > 3 * size and np.abs(residual).max() > 0  # what was not sent


def test_the_state_file_is_private_round_checked_and_overwritten(tmp_path, tasks):
    run = run_settings()
    [member] = sites(tmp_path, 1)
    settings = SecAggSettings()
    setup = {keys.SECAGG_STAGE: keys.SECAGG_SETUP, **settings.plan(4, 1, 3).entries()}
    first = answer(instruction(setup, run), MODEL, member, run, tasks)
    path = member.state_dir / FEDERATION / STATE_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    share = {**setup, keys.SECAGG_STAGE: keys.SECAGG_SHARE_KEYS,
             **settings.plan(5, 1, 3).entries()}
    with pytest.raises(SecAggError, match="round 5.*round 4"):
        answer(instruction(share, run), MODEL, member, run, tasks)
    again = answer(instruction(setup, run), MODEL, member, run, tasks)
    assert again.secagg[keys.SECAGG_KEY_C] != first.secagg[keys.SECAGG_KEY_C]
    path.unlink()
    with pytest.raises(SecAggError, match="round 4: no secure aggregation round"):
        answer(instruction({**share, **settings.plan(4, 1, 3).entries()}, run), MODEL, member,
               run, tasks)


def test_a_tampered_share_is_refused_before_anything_trains(tmp_path, tasks, monkeypatch):
    import clients.site.secure_round as secure_round

    def no_training(*args, **kwargs):
        raise AssertionError("the site trained on a round whose shares were altered")

    monkeypatch.setattr(secure_round, "train_round", no_training)

    def tamper(name, entries):
        if name == "hospital-1" and entries[keys.SECAGG_STAGE] == keys.SECAGG_COLLECT:
            shares = list(entries[keys.SECAGG_SHARES])
            shares[0] = shares[0][:-3] + bytes([shares[0][-3] ^ 1]) + shares[0][-2:]
            entries[keys.SECAGG_SHARES] = shares

    with pytest.raises(SecAggError, match="share from participant [0-9]+ fails") as info:
        run_round(monkeypatch, sites(tmp_path, 3), tasks, tamper=tamper)
    assert "hospital" not in str(info.value)


def _collect(run, reference: float, a_floor: float = 0.0, codec: str = "none"):
    plan = SecAggSettings(clip=0.5, bits=8).plan(2, 1, 3)
    return instruction({keys.SECAGG_STAGE: keys.SECAGG_COLLECT, **plan.entries()}, run,
                       codec=codec, reference=reference, a_floor=a_floor)


@pytest.mark.parametrize("steps, coefficient", [(10, 0.5 * 5 / 10), (3, 0.5)])
def test_fednova_weighs_by_the_sites_own_a_norm_floored(steps, coefficient):
    run = run_settings(momentum=0.0)  # plain SGD: a_i = steps
    local = LocalUpdate([], frozenset(), {keys.NUM_EXAMPLES: 6, keys.STEPS: steps})
    assert coefficient_of(local, _collect(run, 12.0, a_floor=5.0), run) == pytest.approx(
        coefficient)
    assert coefficient_of(local, _collect(run, 4.0), run) == 1.0  # FedAvg: min(1, n / r)


def test_the_vector_is_weighted_then_clipped_and_skips_integer_buffers(tmp_path):
    run = run_settings()
    delta = [np.array([0.2, -0.4, 3.0, -3.0], np.float32), np.array(7, np.int64),
             np.array([[0.8]], np.float32)]
    local = LocalUpdate(delta, frozenset({1}), {keys.NUM_EXAMPLES: 6, keys.STEPS: 3})
    values = secure_values(local, _collect(run, 12.0), run, tmp_path)
    np.testing.assert_allclose(values, [0.1, -0.2, 0.5, -0.5, 0.4], rtol=1e-6)
    assert not (tmp_path / FEDERATION).exists()  # no codec, no residual
    with pytest.raises(SecAggError, match="secagg-weight-reference"):
        collect = _collect(run, 12.0)
        entries = replace(collect.part(SecureInstruction), secagg={})
        coefficient_of(local, replace(collect, parts=(entries,)), run)


def test_a_round_left_behind_expires_with_its_federation(tmp_path, tasks):
    run = run_settings()
    [member] = sites(tmp_path, 1)
    setup = {keys.SECAGG_STAGE: keys.SECAGG_SETUP, **SecAggSettings().plan(1, 1, 3).entries()}
    answer(instruction(setup, run), MODEL, member, run, tasks)  # the site then drops out
    folder = member.state_dir / FEDERATION
    then = time.time() - 40 * 86400.0
    for path in [folder, *folder.iterdir()]:
        os.utime(path, (then, then))
    assert expire_federation_states(member.state_dir, 30.0) == [folder]  # its secrets too
