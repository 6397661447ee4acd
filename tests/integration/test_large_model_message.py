"""A wide model through the whole pipeline in one process (issue 49, item 2 "Messages").

Each run is :mod:`tests.integration.large_model_run` in a subprocess of its own (its peak
RSS is the run's alone): two synthetic tabular hospitals, a wide MLP, two rounds of one
local step; every message crosses Flower's chunked serialisation (the engine's
``over_the_wire``: ``Array`` cut into 5 MB ``ArrayChunk`` objects, as between processes).
The plain run crosses the ``fp16`` downlink (round 1 dense, round 2 the compressed step),
the ``topk:0.01`` uplink with error feedback, the default ``norm-bound`` defence, the
server checkpoint and MLflow model logging; the SecAgg+ run the masked ``fp16`` uplink
with error feedback (SecAgg+ refuses a defence).

CI runs a 4 MB model (width 1000). The issue's >= 500 MB model (width 11 500, 530 MB)
runs with ``FEDMED_LARGE_MODEL=1``: on the 2-core machine it peaked at 9.1 GB RSS and took
13 minutes (/tmp/h/bigmsg-benchmarks.md), beyond CI's memory and time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from app.config.product_paths import PROJECT_ROOT
from tests.integration.wide_tabular_task import parameter_count

LARGE = os.environ.get("FEDMED_LARGE_MODEL") == "1"
#: Hidden units: 132.6 M float32 parameters (530 MB) with FEDMED_LARGE_MODEL=1, else 1.03 M.
WIDTH = 11_500 if LARGE else 1_000
#: Peak RSS above the process's start, in model sizes, that a 530 MB run may reach (measured
#: 16.1 with the product as of this test: every message serialised and read back in process).
MAX_PEAK_PER_MODEL = 20.0
SITES = ["hospital-00", "hospital-01"]


def _run(tmp_path_factory, mlflow_store, secagg: bool) -> tuple[dict, str]:
    folder = tmp_path_factory.mktemp("secagg" if secagg else "plain")
    store = mlflow_store(folder / "mlflow")
    out = folder / "result.json"
    subprocess.run([sys.executable, "-m", "tests.integration.large_model_run", "--width",
                    str(WIDTH), "--out", str(out), "--tracking-uri", store,
                    *(["--secagg"] if secagg else [])], cwd=PROJECT_ROOT, check=True)
    return json.loads(out.read_text()), store


@pytest.fixture(scope="module")
def plain(tmp_path_factory, mlflow_store):
    return _run(tmp_path_factory, mlflow_store, secagg=False)


@pytest.fixture(scope="module")
def secure(tmp_path_factory, mlflow_store):
    return _run(tmp_path_factory, mlflow_store, secagg=True)


def _rounds_complete(result: dict) -> None:
    assert sorted(result["rounds"]) == ["1", "2"]
    for report in result["rounds"].values():
        assert report["train"] == SITES and not report["dropped"], report
        assert not report["aggregation_failed"] and report["steps"] == [1.0, 1.0]
        assert report["evaluate"] == SITES
    assert result["final_parameters"] == parameter_count(WIDTH)


def test_the_model_is_the_size_asked(plain):
    result, _ = plain
    assert result["parameters"] == parameter_count(WIDTH)
    if LARGE:
        assert result["model_mb"] >= 500


def test_every_stage_of_the_plain_run_is_crossed(plain):
    result, _ = plain
    _rounds_complete(result)
    first, second = result["rounds"]["1"]["strategy"], result["rounds"]["2"]["strategy"]
    assert first["downlink-dense"] == 2  # round 1: the reference starts dense
    assert second["downlink-dense"] == 0 and second["downlink-ratio"] > 1.9  # fp16 step
    assert first["uplink-ratio"] > 50 and second["uplink-ratio"] > 50  # top-k 1 %
    assert first["norm-bound"] > 0 and second["norm-bound"] > 0  # the defence bounded them


def test_the_checkpoint_holds_the_whole_model(plain):
    result, _ = plain
    with np.load(result["checkpoint"], allow_pickle=False) as saved:
        model = [n for n in saved.files if n.startswith("model-")]
        assert sum(saved[n].size for n in model) == parameter_count(WIDTH)


def test_mlflow_logged_and_registered_both_models(plain):
    result, store = plain
    client = MlflowClient(store)
    assert client.get_run(result["mlflow_run_id"]).info.status == "FINISHED"
    assert result["best_round"] == 2
    for name in ("large-model-final", "large-model-best"):
        assert [str(v.version) for v in client.search_model_versions(f"name='{name}'")] == ["1"]


def test_secagg_sums_both_sites_of_the_wide_model(secure):
    result, _ = secure
    _rounds_complete(result)
    for report in result["rounds"].values():
        assert report["strategy"]["secagg-summed"] == 2
        assert report["strategy"]["secagg-dropped"] == 0


@pytest.mark.skipif(not LARGE, reason="the peak is measured against a >= 500 MB model only")
def test_peak_memory_stays_within_its_measured_bound(plain):
    result, _ = plain
    peak = (result["peak_rss_mb"] - result["rss_before_run_mb"]) / result["model_mb"]
    assert peak < MAX_PEAK_PER_MODEL, f"peak {peak:.1f} model sizes"
