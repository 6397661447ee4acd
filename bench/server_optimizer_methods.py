"""The methods of ``bench/server_optimizers.py`` as run configs of the product, and one run.

A :class:`Method` is a set of run-config keys of the product plus a small grid
of its own knob(s); every method also tunes the sites' learning rate over its
set's grid (:attr:`server_optimizer_sets.BenchSet.lrs`). Three regimes, all through
the in-process engine
(:func:`engine_runs.run_product`: the real ServerApp and ClientApp, the
default norm-bound defence, the site policy), plain SGD at the sites (no
momentum: FedProx and FedNova ask for it, SCAFFOLD too) and the same
seeded initial model:

``federated``
    The ``K`` sites train, ``R`` rounds of ``tau`` local steps; their test views
    (:func:`server_optimizer_sets.test_view`) only evaluate.
``pooled``
    Centralised training: one site holding every site's items trains ``R``
    rounds of ``K x tau`` steps (the federation's total), the ``K`` sites and
    their test views only evaluate.
``local``
    Local only: ``K`` runs; in the ``k``-th site ``k`` trains ``R`` rounds of
    ``tau`` steps alone (what it trains in the federation) and is measured on
    its own ``val`` and ``test`` splits; the per-round curves are the mean over
    the ``K`` runs.

The test views are connected nodes that refuse training under their policy: SCAFFOLD's
``N`` leaves them out (a site that refuses a train instruction under its policy is not
counted, :mod:`strategies.plugins.control_variates.scaffold`), so its server control
variate is the mean of the ``K`` training sites' ``c_i``.

A method is *available* when the product declares its keys
(:func:`unavailable`): the server optimizers and SCAFFOLD are being added
(issue 34), and a method whose key pyproject.toml lacks is refused by name.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine_runs import run_product
from federation_sites import folder_sites
from server_optimizer_sets import BenchSet, Folders

__all__ = ["Method", "METHODS", "FEDERATED", "settings_grid", "unavailable",
           "Curves", "run_method"]

@dataclass(frozen=True)
class Method:
    """A method: its fixed run-config keys, its knobs' grid and its regime."""

    keys: dict = field(default_factory=dict)
    grid: dict[str, tuple] = field(default_factory=dict)
    regime: str = "federated"


METHODS: dict[str, Method] = {
    "fedavg": Method(),
    "fedavgm": Method({"strategy.server-opt": "avgm"}, {"server-opt.momentum": (0.5, 0.9)}),
    "fedadam": Method({"strategy.server-opt": "adam"}, {"server-opt.eta": (0.01, 0.1)}),
    "fedyogi": Method({"strategy.server-opt": "yogi"}, {"server-opt.eta": (0.01, 0.1)}),
    "fedprox": Method({}, {"proximal-mu": (0.1, 1.0)}),
    # FedNova's server momentum (Wang et al. 2020, Sec. 5) is FedAvgM's step with eta 1
    # (#45); momentum 0 is plain FedNova, x - Delta.
    "fednova": Method({"strategy.aggregator": "fednova", "strategy.server-opt": "avgm"},
                      {"server-opt.momentum": (0.0, 0.5)}),
    "scaffold": Method({"strategy.control-variates": "scaffold"}),
    "pooled": Method(regime="pooled"),
    "local-only": Method(regime="local"),
}
#: The regime of the federated methods (the goal's "best federated method" is one of them).
FEDERATED = "federated"


def settings_grid(method: Method, lrs: Sequence[float] = (0.1,)) -> list[dict]:
    """Every tuned setting of ``method``: ``lr`` x its knobs, each a dict of run-config keys."""
    names = ["lr", *method.grid]
    return [dict(zip(names, values))
            for values in itertools.product(lrs, *method.grid.values())]


def unavailable(name: str) -> str | None:
    """Why the product cannot run method ``name`` yet (a key or value it refuses), or ``None``.

    Raises
    ------
    KeyError
        If ``name`` is no method of :data:`METHODS` (the message names it).
    """
    from app.engine import full_run_config  # noqa: PLC0415 - the engine loads Flower
    from strategies.wire.errors import ConfigError  # noqa: PLC0415

    if name not in METHODS:
        raise KeyError(f"unknown method {name!r} (known: {', '.join(METHODS)})")
    method = METHODS[name]
    try:
        for setting in settings_grid(method):
            full_run_config({"optimizer": "sgd", "momentum": 0.0, **method.keys, **setting})
    except ConfigError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Curves:
    """Per round (round 1 first), the site-averaged (unweighted) ``val`` and ``test`` metric;
    ``None`` for a round where no site defined it. ``seconds``: the runs' wall time."""

    val: list[float | None]
    test: list[float | None]
    seconds: float


def _site_curve(outcome, sites: Sequence[str], key: str) -> list[float | None]:
    """Per round, the unweighted mean of ``key`` over the evaluate replies of ``sites``."""
    curve = []
    for server_round in sorted(outcome.reports):
        evaluate = outcome.reports[server_round].evaluate
        values = [evaluate[s][key] for s in sites if key in evaluate.get(s, {})]
        curve.append(statistics.fmean(values) if values else None)
    return curve


def _mean_curves(curves: list[list[float | None]]) -> list[float | None]:
    """Round by round, the mean of the defined values of ``curves``."""
    out = []
    for values in zip(*curves):
        defined = [v for v in values if v is not None]
        out.append(statistics.fmean(defined) if defined else None)
    return out


def _trained(outcome, trained: Sequence[str]) -> None:
    """Check that a site of ``trained`` had its train reply accepted in every round.

    Raises
    ------
    RuntimeError
        Naming the round and the reasons its train replies were dropped.
    """
    for server_round in sorted(outcome.reports):
        report = outcome.reports[server_round]
        if not set(report.train) & set(trained):
            reasons = {s: r for s, r in report.train_dropped.items() if s in trained}
            raise RuntimeError(f"round {server_round}: no train reply of {list(trained)} was "
                               f"accepted ({reasons})")


def _config(bench_set: BenchSet, method: Method, setting: dict, seed: int, steps: int,
            sites: int) -> dict:
    return {"task": bench_set.task, **bench_set.settings, "optimizer": "sgd", "momentum": 0.0,
            **method.keys, **setting, "seed": seed, "local-steps": steps,
            "num-server-rounds": bench_set.rounds, "min-nodes": sites,
            "experiment": f"bench-server-optimizers-{bench_set.name}"}


def run_method(bench_set: BenchSet, folders: Folders, name: str, setting: dict, seed: int,
               workdir: Path) -> Curves:
    """Run method ``name`` with ``setting`` (``lr`` and its knobs) and ``seed``; its curves."""
    method = METHODS[name]
    names = [f.name for f in folders.sites]
    tests = [f.name for f in folders.tests]
    metric = f"val-{bench_set.metric}"
    tau = bench_set.steps
    workdir.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="state-", dir=workdir))  # fresh site state per run
    if method.regime == "local":
        vals, held, seconds = [], [], 0.0
        for site, view in zip(folders.sites, folders.tests):
            sites = folder_sites([site, view], evaluate_only=[view], state_root=state)
            outcome, took = run_product(_config(bench_set, method, setting, seed, tau, 2),
                                        sites, workdir)
            _trained(outcome, [site.name])
            vals.append(_site_curve(outcome, [site.name], metric))
            held.append(_site_curve(outcome, [view.name], metric))
            seconds += took
        return Curves(_mean_curves(vals), _mean_curves(held), seconds)
    if method.regime == "pooled":
        trained, tau = [folders.pooled], tau * len(folders.sites)
        measuring = [*folders.sites, *folders.tests]
    else:
        trained, measuring = list(folders.sites), list(folders.tests)
    sites = folder_sites([*trained, *measuring], evaluate_only=measuring, state_root=state)
    outcome, seconds = run_product(_config(bench_set, method, setting, seed, tau, len(sites)),
                                   sites, workdir)
    _trained(outcome, [f.name for f in trained])
    return Curves(_site_curve(outcome, names, metric), _site_curve(outcome, tests, metric),
                  seconds)
