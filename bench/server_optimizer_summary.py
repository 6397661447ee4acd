"""The JSON of ``bench/server_optimizers.py``: tuning choice, summary rows and the issue's goal.

**Tuning (validation only).** Each method's settings
(:func:`server_optimizer_methods.settings_grid`) run with the tuning seed; a
setting's score is the mean over the last ``tail`` rounds of the
site-averaged ``val`` metric, and the best score is chosen (:func:`choose`).
The chosen setting then runs with every seed.

**Rows** (:func:`summarise`, one per set and method): ``final_metric`` is the
site-averaged (unweighted) ``test`` metric after the last round, mean over the
seeds, ``sd`` its sample standard deviation (``None`` for one seed, :mod:`stats`);
``rounds_to_target`` the first round whose test metric reaches ``target``
(``fraction`` x pooled's ``final_metric`` on the set), mean over the seeds that
reach it (``None`` if none does; ``seeds_at_target`` counts them).

**Goal** (:func:`goals`, issue 34): the best federated method closes at least
half of the gap between FedAvg and pooled training,
``gap_closed = (best - fedavg) / (pooled - fedavg) >= 0.5``.
"""

from __future__ import annotations

from collections.abc import Sequence

from server_optimizer_methods import FEDERATED, METHODS
from stats import defined, mean, mean_sd

__all__ = ["val_score", "choose", "rounds_to", "summarise", "goals"]


def val_score(val_curve: Sequence[float | None], tail: int) -> float | None:
    """Mean of the last ``tail`` rounds' defined values of ``val_curve`` (``None``: none)."""
    return mean(defined(val_curve[-tail:]))


def choose(trials: list[dict], tail: int) -> dict:
    """The trial (``{"setting", "val"}``) with the best :func:`val_score`; ties: the first.

    Raises
    ------
    ValueError
        If no trial has a defined validation metric.
    """
    scored = [(val_score(t["val"], tail), i) for i, t in enumerate(trials)]
    scored = [(s, i) for s, i in scored if s is not None]
    if not scored:
        raise ValueError("no tuning run has a validation metric (every round undefined)")
    return trials[max(scored, key=lambda pair: (pair[0], -pair[1]))[1]]


def rounds_to(curve: Sequence[float | None], target: float) -> int | None:
    """The first round (1-based) whose value reaches ``target``; ``None`` if none does."""
    return next((r for r, v in enumerate(curve, start=1) if v is not None and v >= target), None)


def summarise(name: str, metric: str, per_seed: list[dict], fraction: float) -> list[dict]:
    """One row per method of set ``name`` (:data:`METHODS` order) from its per-seed records
    (``{"set", "method", "seed", "setting", "test", ...}``); see the module docstring."""
    runs = [r for r in per_seed if r["set"] == name]
    finals: dict[str, list[float]] = {}
    for method in METHODS:
        finals[method] = defined([r["test"][-1] for r in runs if r["method"] == method])
    pooled = mean(finals.get("pooled", []))
    target = None if pooled is None else fraction * pooled
    rows = []
    for method, values in finals.items():
        if not values:
            continue
        mine = [r for r in runs if r["method"] == method]
        reached = [] if target is None else defined([rounds_to(r["test"], target) for r in mine])
        final, sd = mean_sd(values)
        rows.append({"set": name, "method": method, "metric": metric, "final_metric": final,
                     "sd": sd, "seeds": len(values), "seed_values": [r["seed"] for r in mine],
                     "rounds_to_target": mean(reached),
                     "seeds_at_target": len(reached), "target": target,
                     "setting": mine[0]["setting"], "regime": METHODS[method].regime})
    return rows


def goals(rows: list[dict]) -> dict[str, dict]:
    """Per set: FedAvg, pooled, the best federated method and the share of the gap it closes
    (``None`` without both ends or when pooled is not above FedAvg: no gap to close)."""
    out = {}
    for name in dict.fromkeys(r["set"] for r in rows):
        mine = {r["method"]: r["final_metric"] for r in rows if r["set"] == name}
        federated = {m: v for m, v in mine.items() if METHODS[m].regime == FEDERATED}
        best = max(federated, key=federated.get) if federated else None
        fedavg, pooled = mine.get("fedavg"), mine.get("pooled")
        gap = None if fedavg is None or pooled is None else pooled - fedavg
        closed = (federated[best] - fedavg) / gap if gap and gap > 0 and best else None
        out[name] = {"fedavg": fedavg, "pooled": pooled, "best_federated": best,
                     "best_metric": federated.get(best), "gap": gap, "gap_closed": closed,
                     "goal_met": None if closed is None else closed >= 0.5,
                     "methods_measured": sorted(mine)}
    return out
