"""Issue 47, walkthrough 6: make federate refuses a second federation of a running one's name.

``flwr ls --format json`` is faked (a SuperLink's output of four runs); MLflow is a real
sqlite store holding the MLflow runs that the ServerApp would have started for them.
"""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import mlflow
import pytest

from app.tooling import deployment, same_name
from app.tooling.errors import FlowerProcessError
from app.tooling.same_name import NameCheck, check_same_name, experiment_name

#: What ``flwr ls --format json`` printed: run 10 finished, 11-13 active.
LS = {"success": True, "runs": [
    {"run-id": "10", "status": "finished:completed"},
    {"run-id": "11", "status": "running"},
    {"run-id": "12", "status": "running"},
    {"run-id": "13", "status": "pending"}]}


def _fake_ls(monkeypatch, payload: dict) -> None:
    monkeypatch.setattr(same_name, "flwr", lambda home, args, **k: subprocess.CompletedProcess(
        ["flwr", *args], 0, stdout=json.dumps(payload), stderr=""))


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_store):
    """MLflow runs of Flower runs 10 and 11 in fedmed-pe-seg, of run 12 in another one."""
    uri = mlflow_store(tmp_path_factory.mktemp("same-name"))
    client = mlflow.MlflowClient(uri)  # no fluent API: its active experiment is process-global
    for experiment, run_id in (("fedmed-pe-seg", 10), ("fedmed-pe-seg", 11), ("a-study", 12)):
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        run = client.create_run(experiment_id, run_name=f"pe-seg-{run_id}",
                                tags={"flwr.run-id": str(run_id)})
        client.set_terminated(run.info.run_id)
    return uri


def test_an_active_run_of_the_same_experiment_is_a_clash(monkeypatch, store, tmp_path):
    _fake_ls(monkeypatch, LS)
    found = check_same_name(tmp_path, store, "fedmed-pe-seg")
    assert found.clashes == {11: "pe-seg-11"} and found.unnamed == [13]
    refusal = found.refusal("fedmed-pe-seg")
    assert "a federation named 'fedmed-pe-seg' is already running: run 11 (MLflow run " \
           "pe-seg-11)" in refusal and "ALLOW_SAME_NAME=1" in refusal
    assert found.warnings() == ["run 13 is active on the SuperLink and has no MLflow run yet: "
                                "its name is not known"]
    other = check_same_name(tmp_path, store, "a-study")
    assert other.clashes == {12: "pe-seg-12"}
    assert check_same_name(tmp_path, store, "new-study").refusal("new-study") == ""


def test_nothing_active_asks_no_mlflow_and_mlflow_down_is_a_warning(monkeypatch, tmp_path):
    _fake_ls(monkeypatch, {"success": True, "runs": LS["runs"][:1]})
    assert check_same_name(tmp_path, "http://127.0.0.1:9", "x") == NameCheck({}, [])
    _fake_ls(monkeypatch, LS)
    down = check_same_name(tmp_path, "http://127.0.0.1:9", "x")
    assert down.refusal("x") == "" and down.warnings()[-1].startswith(
        "could not check for a running federation of the same name: MLflow at "
        "http://127.0.0.1:9")
    _fake_ls(monkeypatch, {"success": False, "error-message": "SuperLink unavailable"})
    with pytest.raises(FlowerProcessError, match="cannot list the SuperLink's runs"):
        same_name.active_runs(tmp_path)
    unlisted = check_same_name(tmp_path, "http://127.0.0.1:9", "x")
    assert unlisted.refusal("x") == "" and "SuperLink unavailable" in unlisted.warnings()[0]


def _federate_argv(monkeypatch, tmp_path, store: str, values: dict) -> list[str]:
    """``deployment federate``'s argv with its run config ``values`` and a faked submission
    (exit 1: submitted, no run)."""
    monkeypatch.setattr(deployment, "checked_run_config", lambda config: values)
    monkeypatch.setattr(deployment, "_connected_layout",
                        lambda args: SimpleNamespace(superlink_dir=tmp_path))
    monkeypatch.setattr(deployment, "submit_run", lambda *a, **k: SimpleNamespace(
        run_id=None, status="not-started"))
    return ["federate", "--allow-no-roster", "--deploy-dir", str(tmp_path), "--flwr-home",
            str(tmp_path), "--tracking-uri", store, "--artifact-root", str(tmp_path)]


def test_make_federate_refuses_unless_allowed(monkeypatch, store, tmp_path, capsys):
    _fake_ls(monkeypatch, LS)
    argv = _federate_argv(monkeypatch, tmp_path, store, {"experiment": "", "task": "pe-seg"})
    assert deployment.main(argv) == 2
    assert "error: a federation named 'fedmed-pe-seg' is already running" in \
        capsys.readouterr().err
    assert deployment.main([*argv, "--allow-same-name"]) == 1  # submitted (faked: no run)
    assert experiment_name({"experiment": "study", "task": "pe-seg"}) == "study"


def test_make_passes_the_override_only_when_asked():
    from tests.make_dry_run import make_n  # noqa: PLC0415

    assert "--allow-same-name" not in make_n("federate")
    assert "--allow-same-name" in make_n("federate", "ALLOW_SAME_NAME=1")


def test_a_resume_waits_for_the_lost_run_to_be_marked_failed_and_no_longer():
    """Issue 47, item 4: right after a SuperLink crash and restart the lost run is still
    listed as running (until its ServerApp's heartbeat runs out); ``federate --resume``
    refused it as a clash. The resume checks again; a run still active past the bound is
    refused (its ServerApp is alive)."""
    now, answers = [0.0], iter([NameCheck({7: "r"}, []), NameCheck({7: "r"}, []),
                                NameCheck({}, [])])

    def sleep(seconds: float) -> None:
        now[0] += seconds

    found = same_name.wait_for_lost_runs(lambda: next(answers), 60.0, sleep, lambda: now[0])
    assert found.clashes == {} and now[0] == 10.0
    now[0] = 0.0
    alive = same_name.wait_for_lost_runs(lambda: NameCheck({7: "r"}, []), 12.0, sleep,
                                         lambda: now[0])
    assert alive.clashes == {7: "r"} and now[0] == 12.0


def test_federate_resume_submits_once_the_lost_run_is_marked_failed(monkeypatch, store,
                                                                    tmp_path, capsys):
    checks = iter([NameCheck({7: "r"}, []), NameCheck({}, [])])
    monkeypatch.setattr(deployment, "check_same_name", lambda *a: next(checks))
    monkeypatch.setattr(same_name, "_RECHECK_S", 0.0)
    argv = _federate_argv(monkeypatch, tmp_path, store,
                          {"experiment": "", "task": "pe-seg", "resume": True})
    assert deployment.main(argv) == 1  # submitted (faked: no run), not refused (2)
    assert "waiting up to 180 s for the SuperLink to mark run(s) [7] lost" in \
        capsys.readouterr().out
