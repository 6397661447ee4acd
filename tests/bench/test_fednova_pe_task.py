"""``bench/fednova_pe_task.py`` through the in-process engine on three tiny PE hospitals.

tau (1, 3, 3) by each site's node_config ``local-steps-cap``, plain SGD, two
rounds: every site runs the steps its cap allows and reports ``a-norm`` =
tau (plain SGD); both rules start from the same model (the same first
objective values); FedNova's weights on the deltas are
``tau_eff p_i / a_i`` and the two rules reach different models.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import fednova_pe_task as bench
import runner
from tests.integration.conftest import write_small_hospitals

TAUS = (1, 3, 3)


@pytest.fixture(scope="module")
def result(tmp_path_factory, mlflow_store):
    tmp = tmp_path_factory.mktemp("fednova-pe")
    write_small_hospitals(tmp / "pe", seed=6, num_sites=3)
    mlflow_store(tmp / "work")
    out = tmp / "out.json"
    assert bench.main(["--rounds", "2", "--tail", "1", "--taus", *map(str, TAUS),
                       "--homogeneous-tau", "2", "--eval-slabs", "0", "--batch-size", "4",
                       "--data-root", str(tmp / "pe"), "--workdir", str(tmp / "work"),
                       "--output", str(out)]) == 0
    return json.loads(out.read_text())


def test_each_site_runs_its_own_tau_and_reports_its_a_norm(result):
    assert result["engine"] == "in-process"
    curves = result["curves"]
    assert sorted(curves) == ["fedavg/het/sgd-m0", "fedavg/hom/sgd-m0", "fednova/het/sgd-m0"]
    for name in ("fedavg/het/sgd-m0", "fednova/het/sgd-m0"):
        assert curves[name]["steps"] == [list(TAUS)] * 2
        assert curves[name]["a_norms"] == [list(TAUS)] * 2  # plain SGD: ||a_i||_1 = tau_i
        assert curves[name]["dropped"] == [{}, {}]
    assert curves["fedavg/hom/sgd-m0"]["steps"] == [[2, 2, 2]] * 2


def test_fednova_weights_and_a_different_model(result):
    runs, curves = result["summary"]["runs"], result["curves"]
    p = np.asarray(curves["fednova/het/sgd-m0"]["p"])
    a = np.asarray(TAUS, dtype=float)
    np.testing.assert_allclose(runs["fednova/het/sgd-m0"]["delta_weights"], (p @ a) * p / a)
    np.testing.assert_allclose(runs["fedavg/het/sgd-m0"]["delta_weights"], p)
    np.testing.assert_allclose(runs["fedavg/het/sgd-m0"]["surrogate_weights_fedavg"],
                               p * a / (p @ a))
    # the first query sees the same initial model; after a round the rules differ
    avg, nova = curves["fedavg/het/sgd-m0"]["F_sites"], curves["fednova/het/sgd-m0"]["F_sites"]
    assert avg[0] == nova[0] and avg[1] != nova[1]
    assert "ratio_F_fednova_over_fedavg" in result["summary"]["comparisons"]["sgd-m0"]


def test_the_runner_builds_the_stored_run_configs(tmp_path):
    """Every run of bench/results/fednova_pe_task.json: the runner, given the stored setup,
    hands the engine the stored run config (site folders aside), and ``fednova.min-steps-
    fraction``, which the script has added to every run since those runs."""
    stored = json.loads((Path(bench.BENCH) / "results" / "fednova_pe_task.json").read_text())
    setup = stored["config"]
    args = runner.parser(bench.STUDY).parse_args([
        "--rounds", str(setup["rounds"]), "--taus", *map(str, setup["taus"]),
        "--momenta", *map(str, setup["momenta"]), "--eval-slabs", str(setup["eval_slabs"]),
        "--seed", str(setup["seed"]), "--data-root", str(tmp_path)])
    federation = bench.STUDY.federation("pe", args)
    arms = bench.build_arms(args)
    assert [a.name for a in arms] == list(stored["curves"])
    for arm in arms:
        taus = arm.fields["taus"]
        assert [c["local-steps-cap"] for c in arm.site_config] == taus
        assert runner.run_config(bench.STUDY, federation, arm, setup["seed"],
                                 bench.STUDY.schedule(args, None)) == {
            **stored["curves"][arm.name]["run_config"],
            "fednova.min-steps-fraction": min(taus) / max(taus)}
