"""The kept fraction's warm-up over the first rounds (DGC); the round's spec reaches the site."""

from __future__ import annotations

import pytest

from strategies.compression import CodecError, check_warmup, parse_spec, warmup_spec
from strategies.rounds.instructions import TrainPlan, Uplink
from strategies.wire import message_keys as keys


def test_four_warmup_rounds_to_topk_0_001_follow_dgcs_sparsity_schedule() -> None:
    # f_t = 0.001 ** (t / 5): 25.1%, 6.31%, 1.58%, 0.398%, then 0.1% (DGC: 75%, 93.75%,
    # 98.4375%, 99.6% sparsity, then 99.9%)
    fractions = [warmup_spec("topk:0.001", t, 4).fraction for t in range(1, 7)]
    assert fractions == pytest.approx([0.25119, 0.063096, 0.015849, 0.0039811, 0.001, 0.001],
                                      rel=1e-4)
    assert str(warmup_spec("topk:0.001", 5, 4)) == "topk:0.001"


def test_the_warmup_keeps_the_per_tensor_option_and_leaves_other_codecs_alone() -> None:
    spec = warmup_spec("topk:0.01:layer", 1, 1)
    assert spec.per_tensor and spec.fraction == pytest.approx(0.1)
    assert parse_spec(str(spec)) == spec  # the string sent to the site parses back
    assert warmup_spec("qsgd:16", 1, 3) == parse_spec("qsgd:16")
    assert warmup_spec("topk:0.01", 1, 0) == parse_spec("topk:0.01")


def test_a_warmup_needs_a_codec_with_a_fraction_and_a_count_of_rounds() -> None:
    assert check_warmup("randk:0.05", 3).fraction == 0.05
    with pytest.raises(CodecError, match="strategy.codec-warmup-rounds = 2 needs a codec"):
        check_warmup("sign", 2)
    with pytest.raises(CodecError, match="must be an int >= 0"):
        check_warmup("topk:0.01", -1)


def test_the_train_instruction_carries_the_rounds_spec() -> None:
    uplink = Uplink(codec="topk:0.01", codec_warmup_rounds=1)
    first = TrainPlan.for_round([7], 5, uplink, server_round=1)
    later = TrainPlan.for_round([7], 5, uplink, server_round=2)
    assert parse_spec(first.settings(7, uplink)[keys.CODEC]).fraction == pytest.approx(0.1)
    assert later.settings(7, uplink)[keys.CODEC] == "topk:0.01"
    assert uplink.codec_for(0) == "topk:0.01"
