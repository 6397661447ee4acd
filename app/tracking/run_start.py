"""The start of a federation's MLflow run, kept on the server's disk until MLflow answers.

A federation must start while its MLflow server is down (issue 47, item 4): the
ServerApp does not wait for MLflow at the start any more than it does in a round.
When MLflow does not answer when the federation starts, its run cannot be created
yet, so the federation gets an id of its own (:func:`new_federation_id`, 32 hex
digits like MLflow's run ids), which names its checkpoint folder and its
federation at the sites as an MLflow run id would. What the start would have sent
(experiment, run name, params, tags) waits in ``tracking-run.json`` in that folder
(:meth:`RunStart.save`); the first flush that reaches MLflow opens the run
(:meth:`RunStart.open`) and writes its MLflow run id into the same file, before
the rounds of the outbox go out. Once written, the id is the federation's MLflow
run for good: a resume (``RESUME=1``) and ``make tracking-flush`` read it from the
file (:meth:`RunStart.load`), so one federation stays one MLflow run.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from clients.site.atomic_file import write_atomic

__all__ = ["RUN_FILE", "RunStart", "experiment_id", "new_federation_id"]

#: The pending (or, once opened, the resolved) start of the run in the federation's folder.
RUN_FILE = "tracking-run.json"


def new_federation_id() -> str:
    """A federation id for a run whose MLflow run does not exist yet (MLflow's format)."""
    return uuid.uuid4().hex


def experiment_id(name: str, artifact_root: str, tags: dict[str, str]) -> str:
    """The id of experiment ``name``, created (at ``artifact_root``, with ``tags``) when
    missing; an existing one lacking ``tags`` gets them. Raises what MLflow raises."""
    client = MlflowClient()
    found = client.get_experiment_by_name(name)
    if found is None:
        location = Path(artifact_root).as_uri() if artifact_root else None
        return client.create_experiment(name, artifact_location=location, tags=tags)
    for key, value in tags.items():
        if found.tags.get(key) != value:
            client.set_experiment_tag(found.experiment_id, key, value)
    return found.experiment_id


@dataclass
class RunStart:
    """What opening the federation's MLflow run sends, and the run once it is open.

    Attributes
    ----------
    federation : str
        The federation's id (its checkpoint folder's name).
    experiment, artifact_root : str
        The experiment's name and the artifact location of a new experiment.
    run_name : str
        The MLflow run's name.
    params, tags : dict[str, str]
        The run's params (the run config) and tags.
    experiment_tags : dict[str, str]
        Tags every experiment the product creates carries.
    mlflow_run_id : str
        The MLflow run, once opened (empty: MLflow has not answered yet).
    params_sent : bool
        Whether MLflow has the params (and the tags) of the opened run.
    folder : Path or None
        The federation's checkpoint folder holding ``tracking-run.json`` (``None``:
        memory only, lost with the process as the outbox is).
    """

    federation: str
    experiment: str
    artifact_root: str
    run_name: str
    params: dict[str, str]
    tags: dict[str, str]
    experiment_tags: dict[str, str] = field(default_factory=dict)
    mlflow_run_id: str = ""
    params_sent: bool = False
    folder: Path | None = None

    def open(self) -> str:
        """Create the experiment if needed and the run (the active MLflow run from now on),
        log its params, then save its id; returns it. Raises what MLflow raises; called
        again after a failure, it goes on from the part MLflow lacks."""
        if not self.mlflow_run_id:
            found = experiment_id(self.experiment, self.artifact_root, self.experiment_tags)
            run = mlflow.start_run(experiment_id=found, run_name=self.run_name,
                                   tags=self.tags)
            self.mlflow_run_id = run.info.run_id
            self.save()  # before the params: a crash now must not open a second run
        active = mlflow.active_run()
        if active is None or active.info.run_id != self.mlflow_run_id:
            mlflow.start_run(run_id=self.mlflow_run_id)
        if not self.params_sent:
            mlflow.set_tags(self.tags)  # a resume's tags added while the run waited
            mlflow.log_params(self.params)
            self.params_sent = True
            self.save()
        return self.mlflow_run_id

    def save(self) -> None:
        """Write ``tracking-run.json`` atomically (nothing without a folder)."""
        if self.folder is None:
            return
        described = {k: v for k, v in asdict(self).items() if k != "folder"}
        write_atomic(self.folder / RUN_FILE, lambda h: h.write(json.dumps(described).encode()))

    @classmethod
    def load(cls, folder: Path) -> RunStart | None:
        """The start ``folder`` holds (``None``: its run was opened at the start)."""
        path = Path(folder) / RUN_FILE
        if not path.is_file():
            return None
        return cls(**json.loads(path.read_text(encoding="utf-8")), folder=Path(folder))
