"""Run the real ServerApp against virtual sites in this process: :func:`run_federation`.

What ``flwr run`` does for the ServerApp, without the SuperLink: the run config
is completed from pyproject.toml's ``[tool.flwr.app.config]`` (Flower's
simulation leaves it empty when the ServerApp is called by hand), checked by
:class:`app.config.run_config.RunConfig` before anything starts, and handed to
:func:`app.server_app.federate` with an :class:`~app.engine.grid.InProcessGrid`
over the given sites, under the task identity Flower sets for a ServerApp
(messages take their run and source node from it).

Benchmarks and tests use it so that every figure comes from the product's own
round: reply intake, defence, size caps, downlink, site policy, tracking.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from flwr.app import Context, RecordDict
from flwr.common.config import flatten_dict, get_project_config
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from app.config.product_paths import PROJECT_ROOT
from app.config.roster import load_roster
from app.config.run_config import RunConfig, RunConfigError
from app.engine.grid import InProcessGrid
from app.engine.virtual_site import VirtualSite

if TYPE_CHECKING:  # the ServerApp imports torch and MLflow: loaded when a federation runs
    from app.server_app import FederationOutcome

__all__ = ["PROJECT_ROOT", "full_run_config", "new_run_id", "run_federation", "server_identity"]



def full_run_config(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """pyproject.toml's run config with ``overrides``, checked as the ServerApp checks it.

    Parameters
    ----------
    overrides : Mapping
        Run-config keys as in pyproject.toml (``local-steps``, ``strategy.aggregator``)
        with typed values (TOML types: bool, int, float, str).

    Returns
    -------
    dict
        The complete, flat run config the ServerApp and the ClientApp receive.

    Raises
    ------
    RunConfigError
        A key pyproject.toml does not declare (named), or a value
        :meth:`RunConfig.from_mapping` refuses (its message names the key).
    strategies.wire.errors.ConfigError
        A plug-in option or the roster file (``federation.roster``) is invalid.
    """
    defaults = flatten_dict(get_project_config(PROJECT_ROOT)["tool"]["flwr"]["app"]["config"])
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise RunConfigError(f"unknown run-config keys {unknown} (not in pyproject.toml's "
                             "[tool.flwr.app.config])")
    values = {**defaults, **overrides}
    config = RunConfig.from_mapping(values)
    if config.federation_roster:
        load_roster(config.federation_roster)
    return values


def new_run_id() -> int:
    """A fresh Flower run id (a random positive 63-bit integer, as the SuperLink draws one)."""
    return uuid4().int >> 65


@contextmanager
def server_identity(run_id: int) -> Iterator[None]:
    """Flower's task identity of a ServerApp in run ``run_id``, restored afterwards."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def run_federation(run_config: Mapping[str, Any], sites: Sequence[VirtualSite], *,
                   run_id: int | None = None) -> FederationOutcome:
    """Run one federation of the product against ``sites`` in this process.

    Parameters
    ----------
    run_config : Mapping
        Overrides of pyproject.toml's run config (:func:`full_run_config`);
        paths (``data-root``, ``tracking-uri``, ``checkpoint-dir`` ...) absolute.
    sites : sequence of VirtualSite
        The federation's sites (:func:`app.engine.partition_sites` for
        ``<data-root>/hospital-NN``, :meth:`VirtualSite.folder` for any site
        folder); after the run each ``site.context.state`` holds what that site kept.
    run_id : int or None
        The Flower run id (tagged ``flwr.run-id`` on the MLflow run); a fresh one
        when ``None``.

    Returns
    -------
    app.server_app.FederationOutcome
        The MLflow run id, final arrays, round reports, best round, logged models
        and the cross-site result.

    Raises
    ------
    strategies.wire.errors.ConfigError
        The run config is invalid (before any site is asked anything).
    """
    from app.server_app import federate  # noqa: PLC0415 - torch loads with the ServerApp

    config = full_run_config(run_config)
    run_id = run_id if run_id is not None else new_run_id()
    grid = InProcessGrid(sites, config, run_id)
    context = Context(run_id=run_id, node_id=SUPERLINK_NODE_ID, node_config={},
                      state=RecordDict(), run_config=config)
    with server_identity(run_id):
        return federate(grid, context)
