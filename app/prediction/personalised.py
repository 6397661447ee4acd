"""A site's personalised model for ``make predict PERSONAL=...`` (issue 16, item 2).

With personalisation (:mod:`clients.training.personalisation`) each site ends a federation with
its own model, which never leaves the site. At that site, ``make predict`` can apply
it instead of the global model:

* ``fedbn``: the logged (global) model with the site's own normalisation layers,
  read from ``<state-dir>/<federation>/fedbn-local-layers.npy``
  (:class:`~clients.training.personalisation.local_layers.LocalLayers`), where the
  site saved them after its last training round;
* ``finetune``, ``per-fedavg-reptile``, ``per-fedavg-fo``: the logged model adapted
  at predict time, ``personalisation.finetune-steps`` local steps on the site's
  training split, exactly as the site adapts it for its personalised evaluation
  (:meth:`~clients.training.personalisation.site_personalisation.SitePersonalisation.personalised`),
  seeded by the run's
  ``seed``, round ``num-server-rounds + 1`` and the site's name: the seed of the
  end-of-federation test evaluation. Applied to the selected model
  (``<experiment>-best``), this is the model whose ``personalised-test-<metric>``
  the site reported. Nothing is kept: adapting takes seconds, and a model saved at
  the end would belong to one global model only.

The federation is the MLflow run that logged the model (its id keys the site's
state); the method and the adaptation's settings are that run's params
(``personalisation.*``, ``lr``, ``momentum``, ``optimizer``, ``seed``,
``num-server-rounds``), read from the tracking store only when the site holds no
FedBN layers for the federation. ``PERSONAL`` is the site as its SuperNode sees it:
its node-config TOML file (``data-path``, ``state-dir``, ``site-name``; deployment)
or its site folder (state in ``<folder>/.fedmed-state``, named after the folder: the
simulation's layout), resolved by :class:`~app.config.site_config.SiteConfig`.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from app.config.run_config import RunConfig
from app.config.site_config import SiteConfig
from app.model_source import LoggedModel
from app.tracking.model_store import require_store
from clients.registry import task_class
from clients.site.decoded_cache import CACHE_DIR_NAME, load_task
from clients.site.instruction import SiteRunSettings
from clients.site.state_store import SiteStateStore
from clients.training.trainer import ComputeDevice
from clients.training.personalisation.local_layers import LOCAL_LAYERS, LocalLayers
from clients.training.personalisation.site_personalisation import site_personalisation
from strategies.wire.errors import ConfigError
from strategies.wire.personalisation_options import CHOICE_KEY, PERSONALISATION

__all__ = ["Personalised", "federation_of", "personalise", "run_config_from_params",
           "site_of"]

#: Params of the run are strings: how each run-config type is read back.
_BOOLS = {"True": True, "False": False, "true": True, "false": False}


@dataclass(frozen=True)
class Personalised:
    """The site's personalised model and what it is.

    Attributes
    ----------
    model : nn.Module
        The model to predict with.
    method : str
        The federation's ``personalisation.method``.
    note : str
        One line for the user: the method and the file or data it came from.
    """

    model: nn.Module
    method: str
    note: str


def site_of(path: Path) -> SiteConfig:
    """The site ``PERSONAL`` names: a node-config TOML file or a site folder.

    Raises
    ------
    ConfigError
        If ``path`` is neither, or the node config is unreadable or incomplete.
    """
    path = Path(path).expanduser().resolve()
    if path.is_dir():
        return SiteConfig.from_node_config({"data-path": str(path)}, "")
    if not path.is_file():
        raise ConfigError(f"PERSONAL {path}: no such site folder or node-config file")
    try:
        node_config = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"PERSONAL {path}: not a readable node-config TOML file ({exc})") from exc
    if "data-path" not in node_config:
        raise ConfigError(f"PERSONAL {path}: the node config has no 'data-path' (the site folder)")
    return SiteConfig.from_node_config(node_config, "")


def _parsed(key: str, text: str, kind: type) -> Any:
    """The run param ``key`` = ``text`` as a ``kind`` value."""
    try:
        if kind is bool:
            return _BOOLS[text]
        return kind(text)
    except (KeyError, ValueError):
        raise ConfigError(f"run param {key!r} = {text!r} is not a {kind.__name__}") from None


def run_config_from_params(params: Mapping[str, str]) -> RunConfig:
    """The run config an MLflow run's params record (:meth:`RunConfig.as_params`).

    Keys this version does not know are left out (a site's policy fingerprint),
    keys the run lacks keep their defaults.

    Raises
    ------
    ConfigError
        If a param does not read as its key's type, or the config is invalid (names the key).
    """
    defaults = RunConfig().as_params()
    return RunConfig.from_mapping({key: _parsed(key, params[key], type(default))
                                   for key, default in defaults.items() if key in params})


def federation_of(logged: LoggedModel) -> tuple[str, Callable[[], dict[str, str]]]:
    """The id of the MLflow run that logged ``logged``, and a reader of its params.

    The run id comes with the model (its ``MLmodel``); the params are read from
    MLflow's current tracking store only when called, and a local store that does not
    exist is an error naming it, never created.

    Raises
    ------
    ConfigError
        If the model records no run; the reader, if the store does not exist or the run
        is not in it (names the run and the store).
    """
    if not logged.run_id:
        raise ConfigError(f"MODEL {logged.uri}: the model records no MLflow run; a site's "
                          "personalised state is keyed by the federation's run id")
    run_id = logged.run_id

    def params() -> dict[str, str]:
        import mlflow  # here: importing MLflow costs seconds
        from mlflow.tracking import MlflowClient

        store = mlflow.get_tracking_uri()
        require_store(store, f"PERSONAL: run {run_id}'s params ({CHOICE_KEY}, ...)")
        try:
            return dict(MlflowClient().get_run(run_id).data.params)
        except Exception as exc:  # noqa: BLE001 - a missing run, an unreachable store
            raise ConfigError(f"MODEL {logged.uri}: run {run_id} is not readable from the tracking "
                              f"store {store} ({type(exc).__name__}); PERSONAL needs "
                              f"its params ({CHOICE_KEY}, ...)") from exc

    return run_id, params


def personalise(logged: LoggedModel, site: SiteConfig, federation: str,
                params: Callable[[], Mapping[str, str]],
                compute: ComputeDevice) -> Personalised:
    """``logged``'s personalised model at ``site`` in ``federation`` (see the module docstring).

    Parameters
    ----------
    logged : LoggedModel
        The federation's model; left as it is.
    site : SiteConfig
        The site: its state dir, data folder and name.
    federation : str
        The MLflow run id of the federation that logged the model.
    params : callable
        The run's params (read only when the site holds no FedBN layers).
    compute : ComputeDevice
        Where the adapting methods take their steps.

    Raises
    ------
    ConfigError
        If the run had no personalisation, the FedBN layers file is missing (named),
        or the site has no training items to adapt on (its folder named).
    """
    layers_file = site.state_dir / federation / f"{LOCAL_LAYERS}.npy"
    store = SiteStateStore(site.state_dir)
    if layers_file.is_file():
        model = copy.deepcopy(logged.model)  # the logged one stays the global model
        LocalLayers(store, federation).restore(model)
        return Personalised(model, "fedbn", f"fedbn: the site's normalisation layers from "
                                            f"{layers_file}")
    config = run_config_from_params(params())
    method = config.personalisation
    rules = PERSONALISATION.get(method)
    if not rules.personalises:
        raise ConfigError(f"PERSONAL: federation {federation} ran with {CHOICE_KEY} = "
                          f"{method!r}: there is no personalised model; predict without PERSONAL")
    if rules.keeps_local_layers:
        raise ConfigError(f"PERSONAL: {layers_file}: no such file; site {site.name!r} kept no "
                          f"{method} layers for federation {federation} (is this its state dir, "
                          "and did it train in that federation?)")
    cache = site.state_dir / CACHE_DIR_NAME if site.cache_decoded else None
    task = load_task(task_class(logged.task), site.data_path, logged.settings, cache,
                     exclude=[site.state_dir])
    personal = site_personalisation(config.personalisation_options, None, "")
    model = personal.personalised(task, logged.model, compute, SiteRunSettings.from_run_config(config.as_params()), site.name,
                                  config.num_server_rounds + 1)
    if model is None:
        raise ConfigError(f"PERSONAL: site folder {site.data_path} has no training item to "
                          f"adapt the model on ({method})")
    steps, examples = config.personalisation_options.finetune_steps, len(task.train_set)
    return Personalised(model, method, f"{method}: the model adapted {steps} step(s) on "
                                       f"{examples} training example(s) of {site.data_path}")
