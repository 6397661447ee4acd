"""The personalised federations of ``bench/personalisation.py``, run by the product.

Each method is a run config of the product (``personalisation.*`` keys)
run by the in-process engine (:func:`app.engine.run_federation`) on the set's
site folders: every round the product's uniform selector samples
``selection.m = max(1, round(r N))`` of the ``N`` sites (the seed paper's
fraction ``r``; Xia & Cui 2022, Algorithm 2), each runs the method at its
ClientApp, the server aggregates with FedAvg under the default norm-bound
defence, and every site evaluates on its ``val`` split the global model
(``val-<metric>``) and its personalised model (``personalised-val-<metric>``).
The last round's evaluate replies are the outcome. The product's ``seed``
key and its per-(round, site) seeds give every method the same initial model,
samples and batches. "Local only" is a federation of one site per site.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine_runs import run_product
from federation_sites import folder_sites, site_evaluations, train_totals

__all__ = ["LocalWork", "SiteOutcome", "federated_outcomes", "local_only"]

#: What the product's evaluate reply calls a personalised model's metric (``<prefix><metric>``).
PERSONALISED = "personalised-val-"


@dataclass
class LocalWork:
    """The local training a run did, over all sites and rounds (from the train replies).

    Attributes
    ----------
    passes : int
        Forward/backward passes of a training batch: one per SGD step, two per
        Per-FedAvg-FO step (:mod:`clients.training.personalisation.methods`).
    examples : int
        Nominal training examples in those batches (passes x batch size).
    """

    passes: int = 0
    examples: int = 0


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
        True when the site reported no personalised model (a FedBN site never
        sampled keeps the global model): ``personal_metrics`` are the global model's.
    """

    site: str
    global_metrics: dict[str, float]
    personal_metrics: dict[str, float]
    fallback: bool = False


def _work(outcome, passes_per_step: int, batch_size: int) -> LocalWork:
    passes = int(sum(t["steps"] for t in train_totals(outcome).values())) * passes_per_step
    return LocalWork(passes, passes * batch_size)


def _metrics(values: dict[str, float], prefix: str) -> dict[str, float]:
    return {k[len(prefix):]: v for k, v in values.items()
            if k.startswith(prefix) and not k.endswith("-loss")}


def federated_outcomes(folders: list[Path], overrides: dict, workdir: Path
                       ) -> tuple[list[SiteOutcome], LocalWork, list[list[str]]]:
    """One federation of the product under ``overrides``: every site's last-round outcome,
    the local work and, per round, the sites that trained.

    Raises
    ------
    strategies.wire.errors.ConfigError
        The product refuses the run config (FedBN on a model without local layers).
    """
    outcome, _ = run_product(overrides, folder_sites(folders), workdir)
    outcomes = []
    for site, values in sorted(site_evaluations(outcome).items()):
        base, own = _metrics(values, "val-"), _metrics(values, PERSONALISED)
        outcomes.append(SiteOutcome(site, base, own or dict(base), fallback=not own))
    per_step = 2 if overrides["personalisation.method"] == "per-fedavg-fo" else 1
    sampled = [sorted(outcome.reports[r].train) for r in sorted(outcome.reports)]
    return outcomes, _work(outcome, per_step, overrides["batch-size"]), sampled


def local_only(folders: list[Path], overrides: dict, steps: int, workdir: Path
               ) -> tuple[list[SiteOutcome], LocalWork, list[list[str]]]:
    """Each site alone: a federation of that one site, one round of ``steps`` steps from
    the federation's initial weights, evaluated on its own ``val`` split."""
    alone = {**overrides, "personalisation.method": "none", "num-server-rounds": 1,
             "local-steps": steps, "min-nodes": 1, "selection.m": 0}
    outcomes, work, sampled = [], LocalWork(), []
    for folder in folders:
        outcome, _ = run_product(alone, folder_sites([folder]), workdir)
        done = _work(outcome, 1, overrides["batch-size"])
        work.passes, work.examples = work.passes + done.passes, work.examples + done.examples
        own = _metrics(site_evaluations(outcome)[folder.name], "val-")
        outcomes.append(SiteOutcome(folder.name, {}, own))
        sampled.append([folder.name])
    return outcomes, work, sampled
