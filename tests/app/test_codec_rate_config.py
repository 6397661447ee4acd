"""The adaptive compression rate in the run config, the built strategy, MLflow and the progress line."""

from __future__ import annotations

import pytest

from app.config.run_config import RunConfig
from app.round_progress import progress_line
from app.server_app import build_strategy
from app.tracking.tracker import round_record
from strategies.plugins.schedules.codec_rate import AdaptiveCodecRate, FixedCodecRate
from strategies.rounds.round_report import RoundReport
from strategies.wire.errors import ConfigError


def test_adaptive_rate_is_built_from_its_section_and_warmup_from_the_constructor() -> None:
    config = RunConfig.from_mapping({"strategy.codec": "topk:0.01", "strategy.codec-rate":
                                     "adaptive", "codec-rate.min": 0.002,
                                     "codec-rate.link-mbps": 10})
    rate = build_strategy(config).codec_rate
    assert isinstance(rate, AdaptiveCodecRate) and rate.link_mbps == 10.0
    assert config.as_params()["codec-rate.min"] == 0.002
    warm = build_strategy(RunConfig.from_mapping({"strategy.codec": "topk:0.01",
                                                  "strategy.codec-warmup-rounds": 2}))
    assert isinstance(warm.codec_rate, FixedCodecRate)
    assert warm.uplink.codec_for(1) != "topk:0.01" and warm.uplink.codec_for(3) == "topk:0.01"


@pytest.mark.parametrize(("values", "message"), [
    ({"strategy.codec": "qsgd:16", "strategy.codec-rate": "adaptive"},
     "'strategy.codec-rate' = 'adaptive' needs a codec that keeps a fraction"),
    ({"strategy.codec": "topk:0.01", "strategy.codec-rate": "adaptive",
      "strategy.codec-warmup-rounds": 3}, "cannot be combined with 'strategy.codec-warmup"),
    ({"strategy.codec-rate": "sometimes"}, "'strategy.codec-rate' must be one of "
                                           "\\['adaptive', 'fixed'\\]"),
    ({"codec-rate.min": 0.0}, "'codec-rate.min' must be in \\(0, 1\\]"),
    ({"codec-rate.interval": 0}, "'codec-rate.interval' must be an int >= 1"),
])
def test_nonsense_rate_settings_are_refused_naming_the_key(values, message) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_mapping(values)


def test_the_rate_reaches_mlflow_and_theprogress_line() -> None:
    report = RoundReport(3, strategy={"codec-rate": 0.0123, "codec-rate-seconds": 4.0})
    metrics = round_record(report).metrics
    assert metrics["strategy/codec-rate"] == 0.0123
    assert metrics["strategy/codec-rate-seconds"] == 4.0
    assert ", rate 0.0123 |" in progress_line(report, 5, "val-dice")
    assert "rate" not in progress_line(RoundReport(3), 5, "val-dice")
