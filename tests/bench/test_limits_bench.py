"""bench/limits.py's parts: the round's split, the growth fit, memory, throughput, decode.

A federation of the product takes minutes on the CI's two cores (``python
bench/limits.py --quick`` is the end-to-end run), so these tests exercise the
parts that turn a federation's round reports into the JSON, on small inputs.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import numpy as np
import pytest

from strategies.rounds.round_report import RoundReport
from strategies.wire.errors import ConfigError, FederationError


def _limits():
    return importlib.import_module("limits")


def _worker():
    return importlib.import_module("limits_worker")


def test_round_parts_project_the_sites_side_by_side_from_the_serial_round():
    report = RoundReport(server_round=2, seconds=10.0,
                         train={"a": {"train-seconds": 3.0}, "b": {"train-seconds": 4.0}},
                         traffic={"a": {"bytes-down": 1e6, "bytes-up": 1e6},
                                  "b": {"bytes-down": 1e6, "bytes-up": 0.5e6}})
    timed = {"a": SimpleNamespace(seconds={(2, "train"): 3.5, (2, "evaluate"): 1.0,
                                           (1, "train"): 99.0}),
             "b": SimpleNamespace(seconds={(2, "train"): 4.5, (2, "evaluate"): 0.5})}
    parts = _worker().round_parts(report, timed, link_mbps=8.0)  # 1 MB/s: 2 s for site a
    assert parts["server_s"] == pytest.approx(10.0 - 9.5)
    assert parts["transfer_s"] == pytest.approx(2.0)
    assert parts["slowest_site_train_s"] == 4.0
    assert parts["projected_round_s"] == pytest.approx(4.5 + 1.0 + 0.5 + 2.0)
    assert parts["ratio"] == pytest.approx(8.0 / 6.0)
    assert parts["in_process_ratio"] == pytest.approx(10.0 / 7.0)


def test_a_round_without_an_accepted_train_reply_is_named():
    with pytest.raises(ConfigError, match="round 3 has no accepted train reply"):
        _worker().round_parts(RoundReport(server_round=3, train_dropped={"a": "late"}), {}, 100.0)


def test_growth_fit_states_the_slope_and_tells_linear_from_faster():
    fit = _limits().growth_fit([{"sites": n, "round_s": 1.0 + 0.5 * n,
                                 "server_peak_mb": 600.0 + 2.0 * n} for n in (3, 10, 25, 50)])
    assert fit["round_s"]["s_per_site"] == pytest.approx(0.5)
    assert fit["server_peak_mb"]["mb_per_site"] == pytest.approx(2.0)
    assert fit["linear_or_better"]
    faster = _limits().growth_fit([{"sites": n, "round_s": 0.1 * n * n, "server_peak_mb": 600.0}
                                   for n in (3, 10, 25, 50)])
    assert faster["round_s"]["growth_ratio"] > 2
    assert not faster["linear_or_better"]
    with pytest.raises(FederationError, match="at least two"):
        _limits().growth_fit([{"sites": 3, "round_s": 1.0, "server_peak_mb": 1.0}])


def test_the_sampler_charges_a_site_what_its_message_adds():
    sampler = _worker().RssSampler()
    sampler.sample()
    sampler.enter()
    block = np.ones(48 << 20, dtype=np.uint8)  # 48 MB touched inside the "message"
    sampler.sample()
    sampler.leave()
    assert sampler.site_peak_mb >= 40
    assert sampler.server_peak_mb > 0
    del block


def test_server_throughput_times_the_codecs_and_fedavg_against_numpy_sum():
    arrays = [np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32),
              np.zeros(8, np.float32), np.array(3, np.int64)]
    result = _worker().server_throughput(arrays, sites=3, repeats=1, specs=("none", "fp16"))
    assert [row["spec"] for row in result["codecs"]][:2] == ["none", "fp16"]
    assert result["aggregate"]["updates"] == 3
    ratios = [result["aggregate"]["fedavg_vs_numpy_sum"]] + [
        row[key] for row in result["codecs"] for key in ("encode_vs_numpy_sum",
                                                         "decode_vs_numpy_sum")]
    assert all(np.isfinite(r) and r > 0 for r in ratios)
    assert result["min_ratio"] == pytest.approx(min(ratios))


def test_study_decode_reads_the_series_it_wrote(tmp_path):
    decode = _limits().study_decode(tmp_path, image_size=32, repeats=1)
    assert decode["slices"] == 64 and decode["shape"][1:] == [32, 32]
    assert decode["decode_over_read"] == pytest.approx(decode["decode_s"] / decode["read_s"])


def test_presets_state_their_reduced_scale():
    (default,) = _limits().presets(quick=True)
    assert default.name == "pe-seg-default"
    assert default.data_scale["local-steps"] == [2, 200]
    assert default.data_scale["step_fraction"] == pytest.approx(0.01)
    assert default.overrides["task"] == "pe-seg"
    with pytest.raises(FederationError, match="cannot scale"):
        _limits().Preset(default.path, {"lr": 1})
