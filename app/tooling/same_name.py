"""Before ``make federate`` submits: is a federation of the same name already running?

Two federations under one name log into one MLflow experiment and register the same
``<experiment>-best`` / ``-final`` names, so whichever ends last silently becomes the
newest "best" model (issue 47, walkthrough 6). A federation's name is its MLflow
experiment (run config ``experiment``, default ``fedmed-<task>``,
:class:`app.tracking.FederationTracker`). ``flwr ls`` lists the SuperLink's runs and
their status but not their run config, so the two are joined on the MLflow run's tag
``flwr.run-id``: a run the SuperLink still has active (any status but ``finished:*``)
whose MLflow run is in that experiment is a clash, and ``federate`` refuses
(``ALLOW_SAME_NAME=1``, ``--allow-same-name``, submits anyway). An active run without
an MLflow run yet (pending, starting) has no known name: a warning, not a refusal. When
MLflow or the SuperLink does not answer, the check cannot be made and says so: MLflow
down at the start of a run must not stop it (the ServerApp keeps its records until MLflow
answers), and ``flwr run`` reports an unreachable SuperLink itself.

A resume (``make federate RESUME=1``, ``fedmed federate --resume``) right after the
SuperLink crashed and was restarted finds the lost run still listed as running: the
restarted SuperLink marks it ``finished:failed`` only once its ServerApp's heartbeat
has run out (about a minute in Flower 1.42). A resume therefore checks again every
few seconds for at most :data:`LOST_RUN_WAIT_S` (:func:`wait_for_lost_runs`) and
refuses only a run still active then: one whose ServerApp is alive.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.tooling.errors import FlowerProcessError
from app.tooling.flwr_cli import CONNECTION, cli_error, flwr, json_out

__all__ = ["LOST_RUN_WAIT_S", "NameCheck", "active_runs", "check_same_name",
           "experiment_name", "wait_for_lost_runs"]

#: Seconds a resume waits for a restarted SuperLink to mark a crashed run failed.
LOST_RUN_WAIT_S = 180.0
#: Seconds between two checks while a resume waits.
_RECHECK_S = 5.0


def experiment_name(values: dict) -> str:
    """The federation's name: run config ``experiment``, else ``fedmed-<task>``."""
    return str(values.get("experiment") or f"fedmed-{values['task']}")


def active_runs(flwr_home: Path, connection: str = CONNECTION) -> list[int]:
    """The ids of the SuperLink's runs that have not finished (``flwr ls --format json``)."""
    result = flwr(flwr_home, ["ls", connection, "--format", "json"])
    payload = json_out(result)
    if not isinstance(payload.get("runs"), list):
        raise FlowerProcessError(f"cannot list the SuperLink's runs (flwr ls): "
                                 f"{cli_error(result, payload)}")
    return [int(run["run-id"]) for run in payload["runs"]
            if not str(run.get("status", "")).startswith("finished")]


@dataclass(frozen=True)
class NameCheck:
    """What :func:`check_same_name` found.

    Attributes
    ----------
    clashes : dict[int, str]
        Active Flower runs logging into the experiment, with their MLflow run names.
    unnamed : list of int
        Active Flower runs without an MLflow run anywhere yet (their name unknown).
    unchecked : str
        Why MLflow could not be asked (``""``: it was).
    """

    clashes: dict[int, str]
    unnamed: list[int]
    unchecked: str = ""

    def refusal(self, experiment: str) -> str:
        """The error that names the running federation(s) and the override (``""``: none)."""
        if not self.clashes:
            return ""
        runs = ", ".join(f"run {run_id} (MLflow run {name})"
                         for run_id, name in sorted(self.clashes.items()))
        return (f"a federation named '{experiment}' is already running: {runs}. Both would "
                f"log into MLflow experiment '{experiment}' and register the same "
                f"'{experiment}-best'. Wait for it, stop it (flwr stop <run id>), choose "
                f"another name (RUN_CONFIG=\"experiment=<name>\"), or run anyway with "
                f"ALLOW_SAME_NAME=1 (--allow-same-name)")

    def warnings(self) -> list[str]:
        """What the check could not tell."""
        said = [f"run {run_id} is active on the SuperLink and has no MLflow run yet: its "
                f"name is not known" for run_id in self.unnamed]
        if self.unchecked:
            said.append(f"could not check for a running federation of the same name: "
                        f"{self.unchecked}")
        return said


def check_same_name(flwr_home: Path, tracking_uri: str, experiment: str,
                    connection: str = CONNECTION) -> NameCheck:
    """Which of the SuperLink's active runs log into MLflow experiment ``experiment``."""
    try:
        active = active_runs(flwr_home, connection)
    except (FlowerProcessError, subprocess.TimeoutExpired) as exc:  # flwr run will say more
        return NameCheck({}, [], str(exc))
    if not active:
        return NameCheck({}, [])
    import mlflow  # noqa: PLC0415 - heavy import, only with a run active
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    from app.tracking.tracker import bounded_requests  # noqa: PLC0415

    try:
        with bounded_requests():
            mlflow.set_tracking_uri(tracking_uri)
            runs = [run for run_id in active  # one query each: tags take no IN
                    for run in mlflow.search_runs(
                        search_all_experiments=True, output_format="list",
                        filter_string=f"tags.`flwr.run-id` = '{run_id}'")]
            wanted = mlflow.get_experiment_by_name(experiment)
    except MlflowException as exc:
        return NameCheck({}, [], f"MLflow at {tracking_uri}: {str(exc).splitlines()[0][:200]}")
    named = {int(run.data.tags["flwr.run-id"]) for run in runs}
    clashes = {int(run.data.tags["flwr.run-id"]): run.info.run_name for run in runs
               if wanted is not None and run.info.experiment_id == wanted.experiment_id}
    return NameCheck(clashes, [run_id for run_id in active if run_id not in named])


def wait_for_lost_runs(check: Callable[[], NameCheck], wait_s: float = LOST_RUN_WAIT_S,
                       sleep: Callable[[float], None] = time.sleep,
                       clock: Callable[[], float] = time.monotonic) -> NameCheck:
    """``check()`` again every few seconds while it finds clashes, for at most ``wait_s``
    seconds; returns the last result (clashes left: their ServerApps are alive)."""
    deadline = clock() + wait_s
    found = check()
    while found.clashes and clock() < deadline:
        sleep(min(_RECHECK_S, max(0.0, deadline - clock())))
        found = check()
    return found
