"""Personalised test metrics of the end-of-federation evaluation in MLflow (issue 16, item 3).

A site under personalisation answers the test-split evaluation with its
personalised model's ``personalised-test-<metric>`` beside ``test-<metric>``;
MLflow gets it per site next to the global one, with the gain, and
example-weighted under ``test/``.
"""

from __future__ import annotations

import pytest

from app.cross_site_report import cross_site_metrics
from strategies.rounds.cross_site import CrossSiteResult


def test_personalised_test_metrics_per_site_and_weighted():
    sites = {"a": {"test-dice": 0.4, "personalised-test-dice": 0.5, "num-examples": 10.0},
             "b": {"test-dice": 0.6, "num-examples": 30.0}}  # b: no personalised metric
    result = CrossSiteResult(metric="test-dice", sites=sites, weighted={
        "test-dice": 0.55, "personalised-test-dice": 0.5, "num-examples": 40.0})
    metrics = cross_site_metrics(result)
    assert metrics["site/a/test-dice"] == 0.4
    assert metrics["site/a/personalised-test-dice"] == 0.5
    assert metrics["site/a/personalised-gain-test-dice"] == pytest.approx(0.1)
    assert metrics["test/dice"] == 0.55
    assert metrics["test/personalised-dice"] == 0.5
    assert metrics["test/personalised-gain-dice"] == pytest.approx(-0.05)
    assert not [k for k in metrics if k.startswith("site/b/personalised")]
    assert not [k for k in metrics if "test-personalised" in k or "personalised-test-" in k
                and k.startswith("test/")]
