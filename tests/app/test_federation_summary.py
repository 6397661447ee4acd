"""The end-of-run summary reads the selection metric from the run, without importing the task;
the bytes of a round read "dense" when nothing was compressed (issue #17, item 5)."""

from __future__ import annotations

from app.tooling.federation_summary import _selection_metric
from app.tracking.traffic_text import ratio_phrase, round_traffic


def test_the_metric_the_best_round_was_selected_by():
    metrics = {"best-round": 2.0, "best-val-auc": 0.81, "eval/val-auc": 0.8,
               "eval/val-loss": 0.4, "eval/val-accuracy": 0.7}
    assert _selection_metric(metrics) == "val-auc"


def test_without_a_best_round_the_first_validation_metric_that_is_not_a_loss():
    assert _selection_metric({"eval/val-loss": 1.0, "eval/val-dice": 0.2,
                              "site/hospital-00/val-dice": 0.1}) == "val-dice"
    assert _selection_metric({"train/train-loss": 1.0}) == "val-loss"


def test_an_uncompressed_round_reads_dense_not_x1_smaller() -> None:
    # codec none: each reply is the dense update plus the payload header and framing
    strategy = {"bytes-up": 2 * 830_120.0, "bytes-down": 2 * 831_000.0, "dense-bytes": 830_000.0}
    traffic = {"a": {"bytes-up": 830_120.0, "bytes-down": 831_000.0},
               "b": {"bytes-up": 830_120.0, "bytes-down": 831_000.0}}
    line = round_traffic(strategy, traffic)
    assert line == " | up 1660 kB (dense), down 1662 kB (dense)"


def test_a_compressed_uplink_reads_its_ratio() -> None:
    strategy = {"bytes-up": 2 * 7_250.0, "bytes-down": 831_000.0, "dense-bytes": 830_000.0}
    traffic = {"a": {"bytes-up": 7_250.0, "bytes-down": 415_500.0},
               "b": {"bytes-up": 7_250.0, "bytes-down": 415_500.0}}
    assert round_traffic(strategy, traffic) == (
        " | up 14 kB (x114 smaller than dense), down 831 kB (x2.0 smaller than dense)")
    assert round_traffic({}, {}) == ""
    assert ratio_phrase(100.0, 0.0) == "nothing sent"
