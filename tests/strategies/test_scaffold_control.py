"""SCAFFOLD's server side (strategies/plugins/control_variates/scaffold.py and
control_variate_round.py): c = (1/N) sum of the Delta c_i received, c down
with the downlink codec and the server's error feedback, Delta c_i decoded with each node's
codec and seed, and the run configs it refuses, naming the keys."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MessageType

from strategies.compression import decode, encode
from strategies.plugins.control_variates.scaffold import Scaffold
from strategies.plugins.run_settings import RunSettings
from strategies.rounds.reply_intake import TrainReply
from strategies.wire import message_keys as keys
from strategies.wire.plugin_options import PluginError
from strategies.plugins.control_variates.control_variate_round import (ControlVariateRound,
                                                                      federation_size)
from strategies.rounds.instructions import Instructions, TrainPlan
from strategies.rounds.site_book import SiteBook

SGD = RunSettings(local_steps=3, num_rounds=2, fraction_train=1.0, min_nodes=2, seed=0,
                  optimizer="sgd")
pytestmark = pytest.mark.usefixtures("server_identity")
#: The model: a float weight (3 values), an integer counter, a float bias (1 value).
REFERENCE = [np.zeros(3, np.float32), np.zeros((), np.int64), np.zeros(1, np.float32)]


def _reply(node: int, control_delta: np.ndarray | None) -> TrainReply:
    return TrainReply(node_id=node, site=f"s{node}", delta=[], num_examples=1, steps=1,
                      train_loss=1.0,
                      channels={} if control_delta is None
                      else {keys.CONTROL_DELTA: control_delta})


def _instructions(nodes: list[int], sites: int) -> Instructions:
    """Train instructions whose nodes share one model record, among ``sites`` named sites."""
    shared = ArrayRecord({"model": Array(np.zeros(2, np.uint8))})
    return Instructions(MessageType.TRAIN, 1, nodes, shared, {node: {} for node in nodes},
                        reference=REFERENCE,
                        sites=SiteBook(names={n: f"s{n}" for n in range(1, sites + 1)}),
                        records={node: shared for node in nodes})


@pytest.mark.parametrize(("change", "key"), [
    ({"optimizer": "adam"}, "optimizer = 'adam'"),
    ({"privacy": True}, "privacy.noise-multiplier"),
    ({"secure_aggregation": "secagg+"}, "strategy.secure-aggregation"),
    ({"pruning": "prunefl"}, "strategy.pruning")])
def test_a_run_option_two_cannot_serve_is_refused_naming_both_keys(change, key):
    with pytest.raises(PluginError, match="'strategy.control-variates' = 'scaffold'") as refused:
        Scaffold.requires(None, replace(SGD, **change))
    assert key in str(refused.value)
    Scaffold.requires(None, SGD)


def test_c_is_the_sum_of_the_delta_c_i_over_n():
    scaffold = Scaffold()
    np.testing.assert_array_equal(scaffold.control(4, sites=3), np.zeros(4))
    scaffold.observe([np.array([3.0, 0, 0, 6.0]), np.array([0, 3.0, 0, 0])], sites=3)
    np.testing.assert_allclose(scaffold.control(4, sites=3), [1.0, 1.0, 0, 2.0])
    scaffold.observe([np.array([0, 0, 3.0, 0])], sites=3)  # one site of three this round
    np.testing.assert_allclose(scaffold.control(4, sites=3), [1.0, 1.0, 1.0, 2.0])
    # a fourth site joins (its c_i = 0): c is the mean over four; N never shrinks
    np.testing.assert_allclose(scaffold.control(4, sites=4), [0.75, 0.75, 0.75, 1.5])
    np.testing.assert_allclose(scaffold.control(4, sites=2), [0.75, 0.75, 0.75, 1.5])


def test_a_site_that_refuses_to_train_under_its_policy_leaves_n_until_it_trains():
    scaffold = Scaffold()
    scaffold.control(2, sites=3)
    refusal = "site reported an error: site s3: policy rule min-local-steps (refused)"
    dropped = {"s3": refusal, "s4": "no reply before the round closed"}
    info = ControlVariateRound(scaffold).add(
        [_reply(1, encode(np.array([2.0, 4.0]), "none")), _reply(2, encode(np.zeros(2), "none"))],
        TrainPlan(tau={1: 3, 2: 3}, codec_seeds={1: 1, 2: 2}, codec="none"),
        [np.zeros(2, np.float32)], 4, dropped)
    assert scaffold.declined == {"s3"} and info["scaffold-sites"] == 3  # s4 only went quiet
    np.testing.assert_allclose(scaffold.control(2, sites=4), [2 / 3, 4 / 3])
    scaffold.decline([], ["s3"])  # its policy changed: it trained
    np.testing.assert_allclose(scaffold.control(2, sites=4), [0.5, 1.0])


def test_n_is_the_roster_else_the_most_sites_seen():
    assert federation_size(SiteBook(roster={"a": 10, "b": 10, "c": 10})) == 3
    book = SiteBook(names={1: "a", 2: "b"})
    book.connected = {1, 2, 3}
    assert federation_size(book) == 3
    book.connected = {1}
    assert federation_size(book) == 2


def test_c_goes_down_with_every_instruction_and_the_method_in_its_config():
    scaffold = Scaffold()
    scaffold.observe([np.array([2.0, 4.0, -2.0, 8.0])], sites=2)
    instructions = _instructions([1, 2], sites=2)
    ControlVariateRound(scaffold).attach(instructions)
    first, second = instructions.packed().values()
    assert first is second and sorted(first) == ["model", keys.CONTROL_C]  # still shared
    sent = decode(first[keys.CONTROL_C].numpy(), "none", 4)
    np.testing.assert_allclose(sent, [1.0, 2.0, -1.0, 4.0])  # over the float arrays only
    for settings in instructions.settings.values():
        assert settings[keys.CONTROL_VARIATES] == "scaffold"
        assert settings[keys.CONTROL_CODEC] == "none"


def test_a_compressed_downlink_sends_c_through_the_servers_error_feedback():
    scaffold = Scaffold()
    scaffold.observe([np.array([5.0, 2.0, 1.0, 8.0])], sites=1)
    rounds = ControlVariateRound(scaffold, "topk:0.5")
    sent = decode(rounds.payload(REFERENCE, sites=1), "topk:0.5", 4)
    np.testing.assert_array_equal(sent, [5.0, 0, 0, 8.0])
    np.testing.assert_array_equal(scaffold.residual, [0, 2.0, 1.0, 0])  # checkpointed with c
    sent = decode(rounds.payload(REFERENCE, sites=1), "topk:0.5", 4)  # c + residual
    np.testing.assert_array_equal(sent, [5.0, 0, 0, 8.0])
    np.testing.assert_array_equal(scaffold.residual, [0, 4.0, 2.0, 0])
    sent = decode(rounds.payload(REFERENCE, sites=1), "topk:0.5", 4)  # the residual gets out
    np.testing.assert_array_equal(sent, [0, 6.0, 0, 8.0])


def test_the_replies_delta_c_i_are_decoded_with_each_nodes_codec_and_seed():
    scaffold = Scaffold()
    plan = TrainPlan(tau={1: 3, 2: 3}, codec_seeds={1: 11, 2: 22}, codec="randk:0.5")
    one, two = np.array([1.0, 2.0, 3.0, 4.0]), np.array([-1.0, 0.5, 0.0, 2.0])
    replies = [_reply(1, encode(one, "randk:0.5", seed=11)),
               _reply(2, encode(two, "randk:0.5", seed=22)),
               _reply(3, None)]  # a reply without Delta c_i: its update counts, nothing else
    info = ControlVariateRound(scaffold).add(replies, plan, REFERENCE, sites=3)
    expected = (decode(encode(one, "randk:0.5", seed=11), "randk:0.5", 4, seed=11)
                + decode(encode(two, "randk:0.5", seed=22), "randk:0.5", 4, seed=22))
    np.testing.assert_allclose(scaffold.total, expected)
    assert info["scaffold-replies"] == 2 and info["scaffold-dc-missing"] == 1
    assert info["scaffold-sites"] == 3
