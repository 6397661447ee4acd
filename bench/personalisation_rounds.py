"""The in-process personalised federation of ``bench/personalisation.py``: rounds, site metrics.

The product's own site code, without Flower: every round a seeded sample of
``max(1, round(r N))`` of the ``N`` sites (the seed paper's fraction ``r``;
Xia & Cui 2022, Algorithm 2) receives the global model; each runs the run
config's personalisation through
:class:`clients.training.personalisation.site_personalisation.SitePersonalisation`
(``receive`` - FedBN's own layers; ``train`` - Reptile's tasks, Per-FedAvg-FO's
steps or plain local SGD; ``keep_local`` - FedBN's zeros) on its
:class:`~clients.training.site_task.SiteTask` and replies
``delta = x_global - x_local`` in state-dict order, as the ClientApp does; the
server applies FedAvg, :func:`strategies.aggregation.fedavg_delta`
(``p_i = n_i / sum_j n_j`` over the replies; McMahan et al. 2017), and
``x <- x - Delta``. At the end every site evaluates on its ``val`` split the
global model and its personalised model
(:meth:`SitePersonalisation.metrics`, i.e. ``personalised-val-<metric>``);
"local only" trains one model per site from the same initial weights and
evaluates it on that site. Site ``i``'s batches in round ``r`` are seeded by
:func:`round_seeds.round_seed` (the same draws for every method).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.config.run_config import RunConfig
from app.site_settings import site_settings
from clients.training.personalisation.site_personalisation import (SitePersonalisation,
                                                                    site_personalisation)
from clients.training.device import ComputeDevice
from clients.training.site_task import SiteTask
from model_arrays import load_arrays, state_arrays
from round_seeds import round_seed
from strategies.aggregation import fedavg_delta
from strategies.plugins.personalisation.gain import PERSONALISED

__all__ = ["FEDERATION", "Federation", "LocalWork", "SiteOutcome", "sampled_sites",
           "train_federation", "site_outcomes", "local_only"]

#: The federation name under which FedBN's layers are kept in each site's state dir.
FEDERATION = "bench-personalisation"
#: Salt of the sampling stream and of local-only training's seeds.
_SAMPLE_SALT, _LOCAL_SALT = 0x5A3F, 0x10CA1


@dataclass(frozen=True)
class Federation:
    """The sites and the protocol of one benchmark federation.

    Attributes
    ----------
    tasks : list of SiteTask
        One per site, in site order.
    rounds : int
        Server rounds ``R``.
    fraction : float
        Share ``r`` of the sites sampled per round.
    compute : ComputeDevice
        Where training and evaluation run (the benchmark: CPU, one thread).
    state_root : Path
        Parent of the sites' state dirs (FedBN's layers), one folder per run.
    """

    tasks: list[SiteTask]
    rounds: int
    fraction: float
    compute: ComputeDevice
    state_root: Path

    @property
    def per_round(self) -> int:
        """Sites sampled per round, ``max(1, round(r N))``."""
        return max(1, round(self.fraction * len(self.tasks)))


@dataclass
class LocalWork:
    """The local training a run did, over all sites and rounds.

    Attributes
    ----------
    passes : int
        Forward/backward passes of a training batch: one per SGD step, two per
        Per-FedAvg-FO step (:mod:`clients.training.personalisation.per_fedavg_fo`).
    examples : int
        Training examples in those batches.
    """

    passes: int = 0
    examples: int = 0

    def add(self, steps: int, examples: int, passes_per_step: int = 1) -> None:
        """Count one local training of ``steps`` steps over ``examples`` examples."""
        self.passes += steps * passes_per_step
        self.examples += examples


@dataclass(frozen=True)
class SiteOutcome:
    """What one site measures at the end of a run, on its ``val`` split.

    Attributes
    ----------
    site : str
        The site folder's name.
    global_metrics : dict
        The global model's metrics (empty for local only: there is none).
    personal_metrics : dict
        The personalised model's metrics (local only: the site's own model).
    fallback : bool
        True when the method gave no personalised model (a FedBN site never sampled
        keeps the global model): ``personal_metrics`` are then the global model's.
    """

    site: str
    global_metrics: dict[str, float]
    personal_metrics: dict[str, float]
    fallback: bool = False


def sampled_sites(num_sites: int, per_round: int, seed: int, server_round: int) -> list[int]:
    """The ``per_round`` sites of round ``server_round`` (uniform without replacement, seeded)."""
    rng = np.random.default_rng([seed, server_round, _SAMPLE_SALT])
    return sorted(int(i) for i in rng.choice(num_sites, size=per_round, replace=False))


def _state_dir(fed: Federation, config: RunConfig, task: SiteTask) -> Path:
    return fed.state_root / f"{config.personalisation}-seed{config.seed}" / task.site_dir.name


def train_federation(fed: Federation, config: RunConfig
                     ) -> tuple[nn.Module, list[SitePersonalisation], LocalWork]:
    """``fed.rounds`` FedAvg rounds under ``config``'s personalisation.

    Returns
    -------
    tuple
        The final global model, each site's :class:`SitePersonalisation` (FedBN's
        layers in its state dir) and the sites' local training work.
    """
    torch.manual_seed(config.seed)
    global_model = fed.tasks[0].build_model()
    names = list(global_model.state_dict())
    sites = [site_personalisation(config.personalisation_options, _state_dir(fed, config, task),
                                  FEDERATION)
             for task in fed.tasks]
    work = LocalWork()
    per_step = 2 if config.personalisation == "per-fedavg-fo" else 1
    for server_round in range(1, fed.rounds + 1):
        x_global = state_arrays(global_model)
        deltas, counts = [], []
        for i in sampled_sites(len(fed.tasks), fed.per_round, config.seed, server_round):
            task, personal = fed.tasks[i], sites[i]
            local = copy.deepcopy(global_model)
            personal.receive(local)
            result = personal.train(task, local, config.local_steps,
                                    round_seed(config.seed, server_round, i), None,
                                    lr=config.lr, momentum=config.momentum, compute=fed.compute,
                                    optimizer=config.optimizer,
                                    label=f"{task.site_dir.name} round {server_round}")
            work.add(result.steps_done, result.num_examples, per_step)
            delta = [np.asarray(g - x, dtype=g.dtype)
                     for g, x in zip(x_global, state_arrays(local))]
            deltas.append(personal.keep_local(local, delta, names))
            counts.append(len(task.train_set))
        update = fedavg_delta(deltas, counts)
        load_arrays(global_model, [g - d for g, d in zip(x_global, update)])
    return global_model, sites, work


def site_outcomes(fed: Federation, config: RunConfig, global_model: nn.Module,
                  sites: list[SitePersonalisation]) -> list[SiteOutcome]:
    """Every site's global and personalised metrics on ``val`` after the last round."""
    prefix = f"{PERSONALISED}val-"
    outcomes = []
    for task, personal in zip(fed.tasks, sites):
        base = task.evaluate(global_model, fed.compute, split="val").metrics
        values = personal.metrics(task, global_model, fed.compute, "val", site_settings(config),
                                  task.site_dir.name, fed.rounds)
        own = {k[len(prefix):]: v for k, v in values.items()
               if k.startswith(prefix) and k != f"{prefix}loss"}
        outcomes.append(SiteOutcome(task.site_dir.name, dict(base), own or dict(base),
                                    fallback=not values))
    return outcomes


def local_only(fed: Federation, config: RunConfig, steps: int
               ) -> tuple[list[SiteOutcome], LocalWork]:
    """Each site alone: ``steps`` steps of ``config``'s optimiser from the federation's
    initial weights, evaluated on its own ``val`` split; and the training work."""
    outcomes, work = [], LocalWork()
    for i, task in enumerate(fed.tasks):
        torch.manual_seed(config.seed)
        model = task.build_model()
        result = task.train(model, steps, config.lr, config.momentum, fed.compute,
                            seed=round_seed(config.seed, 0, i, _LOCAL_SALT),
                            optimizer=config.optimizer, label=f"{task.site_dir.name} local")
        work.add(result.steps_done, result.num_examples)
        own = task.evaluate(model, fed.compute, split="val").metrics
        outcomes.append(SiteOutcome(task.site_dir.name, {}, dict(own)))
    return outcomes, work
