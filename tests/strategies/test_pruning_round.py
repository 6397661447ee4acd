"""Pruning's round feature (strategies/plugins/pruning/pruning_round.py): what travels compacted,
who gets the mask, the squared gradients summed, the new model expanded and masked."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType

from strategies.compression import encode
from strategies.plugins.pruning.prunefl import PruneFL
from strategies.plugins.pruning.pruning_round import PruningRound, squared_gradients
from strategies.rounds.reply_intake import TrainReply
from strategies.rounds.instructions import Instructions
from strategies.rounds.round_report import RoundReport
from strategies.wire import message_keys as keys
from strategies.wire.model_layout import unpack_model
from strategies.wire.pruning_mask import MASK_BITS_KEY

NAMED = {"w": np.arange(1.0, 7.0, dtype=np.float32).reshape(2, 3),
         "b": np.array([0.5, -0.5], np.float32)}
STRUCTURE = {"mode": "unstructured", "groups": [{"name": "w", "array": "w"}]}


def _round(density: float = 0.5, interval: int = 2) -> tuple[PruningRound, ArrayRecord]:
    rounds = PruningRound(PruneFL(initial_density=density, interval=interval,
                                  report_codec="none"))
    record = ArrayRecord({k: Array(v) for k, v in NAMED.items()})
    start, _ = rounds.start(record, STRUCTURE)
    return rounds, start


def _reply(node: int, version: int, sqgrad: np.ndarray | None = None) -> TrainReply:
    return TrainReply(node_id=node, site=f"s{node}", delta=[], num_examples=1, steps=1,
                      train_loss=0.0, metrics={keys.PRUNING_VERSION: float(version)},
                      channels={} if sqgrad is None else {keys.PRUNING_SQGRAD: sqgrad})


def test_the_initial_model_is_pruned_and_travels_compacted():
    rounds, start = _round()
    w = start["w"].numpy()
    np.testing.assert_array_equal(w, [[0, 0, 0], [4, 5, 6]])  # the 3 largest kept
    sent = rounds.outgoing(start)
    np.testing.assert_array_equal(sent["w"].numpy(), [4, 5, 6])  # kept values only
    np.testing.assert_array_equal(sent["b"].numpy(), NAMED["b"])  # not covered: whole


def test_the_mask_goes_to_a_node_until_an_accepted_reply_acknowledges_it():
    rounds, start = _round()
    packed = rounds.outgoing(start)
    records = rounds.with_mask([1, 2], {1: packed, 2: packed})
    assert MASK_BITS_KEY in records[1] and MASK_BITS_KEY in records[2]
    assert MASK_BITS_KEY not in packed  # the shared record is left as it was
    rounds.acknowledge([_reply(1, 1), _reply(2, 0)], asked=[1, 2])  # 2 trained another mask
    records = rounds.with_mask([1, 2], {1: packed, 2: packed})
    assert MASK_BITS_KEY not in records[1] and MASK_BITS_KEY in records[2]
    rounds.acknowledge([], asked=[1])  # 1's reply was refused (it may have lost its mask)
    assert MASK_BITS_KEY in rounds.with_mask([1], {1: packed})[1]


def test_the_squared_gradients_of_the_replies_are_summed_in_full_shapes():
    vector = np.arange(8, dtype=np.float32)  # w (6) then b (2), model order
    replies = [_reply(1, 1, encode(vector, "none")), _reply(2, 1, encode(vector, "none")),
               _reply(3, 1), _reply(4, 1, encode(-vector - 1, "none"))]  # 4: negative, left out
    summed, info = squared_gradients(replies, NAMED, "none")
    np.testing.assert_array_equal(summed["w"], 2 * vector[:6].reshape(2, 3))
    np.testing.assert_array_equal(summed["b"], 2 * vector[6:])
    assert info["pruning-reports"] == 2 and "pruning-clip-factor/s4" not in info
    assert squared_gradients([_reply(3, 1)], NAMED, "none") == (None, {})


def test_a_re_pruning_round_expands_the_new_model_and_zeroes_what_the_new_mask_prunes():
    rounds, start = _round(interval=1)
    sent = rounds.outgoing(start)
    updated = [sent["w"].numpy() + 1.0, sent["b"].numpy()]
    # every weight's squared gradient large at (0, 0): PruneFL adds it back, at 0
    sq = np.zeros(8, np.float32)
    sq[0] = 100.0
    new, info = rounds.conclude(RoundReport(1), ["w", "b"], updated,
                                [_reply(1, 1, encode(sq, "none"))])
    assert rounds.pruning.masks["w"][0, 0] and info["pruning-version"] == 2
    np.testing.assert_array_equal(new[0][0], [0, 0, 0])  # added back at 0, others pruned
    np.testing.assert_array_equal(new[0][1] != 0, rounds.pruning.masks["w"][1])


def test_evaluate_instructions_carry_the_compacted_model_and_the_mask_to_who_lacks_it(
        server_identity):
    rounds, start = _round()
    rounds.acknowledge([_reply(1, 1)], asked=[1])
    draft = Instructions(MessageType.EVALUATE, 3, [1, 2], rounds.outgoing(start),
                         {node: {keys.FEDERATION: "fed"} for node in (1, 2)})
    messages = draft.messages(ConfigRecord({"x": 1}), [rounds])
    by_node = dict(zip([1, 2], messages))  # one message per node, in order
    for node, message in by_node.items():
        config = message.content[keys.CONFIG]
        assert config[keys.PRUNING_VERSION] == 1 and config[keys.PRUNING_REPORT] == ""
        assert config[keys.FEDERATION] == "fed" and config["x"] == 1
        arrays = {k: v.numpy() for k, v in message.content[keys.ARRAYS].items()}
        assert (MASK_BITS_KEY in arrays) == (node == 2)  # 1 holds version 1 already
        model = unpack_model({k: v for k, v in arrays.items() if not k.startswith("pruning-")})
        np.testing.assert_array_equal(model["w"], [4, 5, 6])
