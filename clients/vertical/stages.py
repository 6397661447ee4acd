"""The site's side of a vertical federation: one stage in, the site's rules, one reply out.

No Flower: the ClientApp's ``train.vertical`` handler (:mod:`app.client_app`) turns the
message into a :class:`VerticalRequest` and calls :func:`answer_vertical`; a test calls it
alike. A vertical federation's messages carry per-patient data (a local encoder of the
shared patients, a batch's cut-layer activations), so a site answers none of them unless
its policy file says ``[vertical] allowed = true``
(:class:`~clients.site.policy.VerticalRules`); each stage's handler is registered by name
in :data:`VERTICAL_STAGES` (``"module:function"``, imported on first use) and applies the
rest of the rules (the fewest shared patients, labels that may leave).

A site folder may say which of its tasks and which department it is in a vertical
federation, in ``vertical-site.toml`` (written by the vertical sets' converters)::

    task = "tabular-cls"
    department = "cath-lab"

Without it the run config's ``task`` and the site's name are used.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clients.datagen.vertical_sets import SITE_FILE
from clients.registry import TASKS
from clients.site.policy import PolicyRefusal, VerticalRules
from clients.site.instruction import SiteRunSettings
from clients.site.site import Site
from clients.site.site_round import SiteTasks
from clients.site.state_store import SiteStateStore
from clients.training.trainer import ComputeDevice
from clients.training.site_task import SiteTask, TaskSettings
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from strategies.wire.registry import Registry
from strategies.wire.vertical_options import VerticalOptions

__all__ = ["SITE_FILE", "VERTICAL_STAGES", "StageHandler", "VerticalReply", "VerticalRequest",
           "declared_site",
           "VerticalSite", "answer_vertical", "describe", "vertical_site"]



@dataclass
class VerticalSite:
    """What a stage handler may use of the site (its data, its state, its rules)."""

    name: str
    #: The site folder.
    data_path: Path
    #: ``<state-dir>/<federation>/vertical/``: what the site keeps between stages (exists).
    state_dir: Path
    rules: VerticalRules
    #: The site's own task (``vertical-site.toml``, else the run config's ``task``).
    task_name: str
    #: The site's department (``vertical-site.toml``, else its name); sent to the coordinator.
    department: str
    settings: TaskSettings
    lr: float
    optimizer: str
    momentum: float
    seed: int
    tasks: SiteTasks = field(repr=False)
    site: Site = field(repr=False)

    def task(self) -> SiteTask:
        """The site's task, loaded once per process (bad items skipped and counted)."""
        return self.tasks.task(self.site, self.task_name, self.settings)

    @property
    def compute(self) -> ComputeDevice:
        """The process's compute device (CUDA with AMP where present)."""
        return self.tasks.compute()


@dataclass(frozen=True)
class VerticalRequest:
    """One vertical message as the site reads it."""

    stage: str
    #: The federation: salt of the PSI, key of the site's state folder.
    federation: str
    server_round: int
    #: The stage's scalar entries (beyond the stage, federation and round).
    config: Mapping[str, bool | int | float | str]
    #: The stage's arrays (bytes travel as uint8 arrays).
    arrays: Mapping[str, np.ndarray]
    options: VerticalOptions
    site: VerticalSite


@dataclass
class VerticalReply:
    """What a stage sends back: named arrays, numbers, short strings."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, int | float] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)


StageHandler = Callable[[VerticalRequest], VerticalReply]

#: Every stage a site answers, by name: ``"module:function"`` of a :data:`StageHandler`.
VERTICAL_STAGES: Registry[StageHandler] = Registry("vertical stage", keys.VERTICAL_STAGE)
VERTICAL_STAGES.add_path("describe", "clients.vertical.stages:describe")
VERTICAL_STAGES.add_path("psi-request", "clients.vertical.psi_stages:psi_request")
VERTICAL_STAGES.add_path("psi-step", "clients.vertical.psi_stages:psi_step")
VERTICAL_STAGES.add_path("pvfed-local", "clients.vertical.pvfed_site:pvfed_local")
VERTICAL_STAGES.add_path("pvfed-round", "clients.vertical.pvfed_site:pvfed_round")
VERTICAL_STAGES.add_path("split-train", "clients.vertical.split_site:split_train")
VERTICAL_STAGES.add_path("split-head", "clients.vertical.split_site:split_head")
VERTICAL_STAGES.add_path("split-eval-forward", "clients.vertical.split_site:split_eval_forward")
VERTICAL_STAGES.add_path("split-eval-finish", "clients.vertical.split_site:split_eval_finish")


def describe(request: VerticalRequest) -> VerticalReply:
    """The site's department and task name (the coordinator's names for its rows)."""
    return VerticalReply(info={"department": request.site.department,
                               "task": request.site.task_name})


def declared_site(data_path: Path) -> dict[str, str]:
    """``vertical-site.toml`` of the site folder (empty without one).

    Raises
    ------
    ConfigError
        Naming the file: not TOML, an unknown key, a value that is no string, an unknown task.
    """
    path = data_path / SITE_FILE
    if not path.is_file():
        return {}
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable or not TOML ({exc})") from exc
    unknown = sorted(set(table) - {"task", "department"})
    if unknown or not all(isinstance(v, str) and v for v in table.values()):
        raise ConfigError(f"{path}: keys must be 'task' and 'department' (non-empty strings), "
                          f"got {table!r}")
    if "task" in table and table["task"] not in TASKS:
        raise ConfigError(f"{path}: task {table['task']!r} is not one of {sorted(TASKS)}")
    return table


def vertical_site(site: Site, run: SiteRunSettings, federation: str,
                  tasks: SiteTasks) -> VerticalSite:
    """The :class:`VerticalSite` of ``site`` in ``federation`` (its state folder created)."""
    declared = declared_site(Path(site.data_path))
    digest = hashlib.sha256(federation.encode()).hexdigest()[:16]
    state = SiteStateStore(site.state_dir).folder(federation) / f"vertical-{digest}"
    state.mkdir(parents=True, exist_ok=True)
    return VerticalSite(
        name=site.name, data_path=Path(site.data_path), state_dir=state,
        rules=site.policy.vertical, task_name=declared.get("task", run.task),
        department=declared.get("department", site.name), settings=run.sizes, lr=run.lr,
        optimizer=run.optimizer, momentum=run.momentum, seed=run.seed, tasks=tasks, site=site)


def answer_vertical(request: VerticalRequest) -> VerticalReply:
    """Answer one vertical stage under the site's rules.

    Raises
    ------
    PolicyRefusal
        Rule ``vertical.allowed``: the site's policy does not allow vertical federations;
        rule ``allowed-tasks``: the site's task is not allowed; the handlers' own rules.
    ConfigError
        An unknown stage (naming it and the known ones).
    """
    site = request.site
    if not site.rules.allowed:
        raise PolicyRefusal("vertical.allowed", "this site's policy does not allow vertical "
                            "federations (their messages carry per-patient vectors)")
    if not site.site.policy.allows_task(site.task_name):
        raise PolicyRefusal("allowed-tasks", f"task {site.task_name!r} is not allowed")
    return VERTICAL_STAGES.get(request.stage)(request)
