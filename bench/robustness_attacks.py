"""The attacks, the defences and the server's side of the attack benchmarks (issue #12).

Shared by ``bench/robustness.py`` (simulated least squares) and
``bench/robustness_real.py`` (PneumoniaMNIST, the PE task). One round on the
server, :func:`server_update`, is the product's path for a list of
:class:`strategies.replies.TrainReply` values:

1. the attacking site's reply goes through the attack (:data:`ATTACKS`);
2. a missing reply, or one with a NaN/inf update, never reaches the
   aggregator: the product's reply validation
   (:func:`strategies.replies.parse_train_reply`) drops it;
3. ``num_examples`` is capped at the first value the site declared
   (:meth:`strategies.rounds.site_book.SiteBook.capped`) -- an attacker that
   inflates its count from its first reply sets its own cap, so the cap does
   not stop ``inflated-n`` here;
4. the update is aggregated by the run config's plug-ins
   (:mod:`strategies.plugins.registries`, options at their defaults) behind the chosen
   defence (:func:`strategies.plugins.defences.defended.with_defence`).

Attacks (by one site, every round): ``inflated-n`` (claims ``inflated_n``
examples, honest update), ``bad-a-norm`` (reports 1 local step of the tau it
did, so FedNova divides its update by a-norm 1), ``scaled`` (update x
``scale``), ``sign-flip`` (minus its update), ``nan`` (NaN/inf entries),
``noise`` (standard-normal arrays x ``noise_std`` instead of its update),
``always-fails`` (never replies). ``none`` is the clean run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from report import write_report
from strategies.local_solver import LocalSolver
from strategies.plugins.defences.defended import with_defence
from strategies.plugins.run_settings import RunSettings
from strategies.plugins.registries import AGGREGATORS, DEFENCES, build, default_sections
from strategies.replies import TrainReply
from strategies.rounds.site_book import SiteBook

__all__ = ["ATTACKS", "DEFENCES_RUN", "build_aggregator", "merge_report", "server_update",
           "usable"]

#: Name in the table -> (strategy.defence, strategy.aggregator).
DEFENCES_RUN: dict[str, tuple[str, str]] = {
    "fedavg": ("none", "fedavg"),
    "norm-bound": ("norm-bound", "fedavg"),
    "multi-krum": ("multi-krum", "fedavg"),
    "trimmed-mean": ("none", "trimmed-mean"),
    "median": ("none", "median"),
    "fednova": ("none", "fednova"),
    "norm-bound+fednova": ("norm-bound", "fednova"),
}

Attack = Callable[[TrainReply, np.random.Generator, dict], "TrainReply | None"]


def _map(reply: TrainReply, fn: Callable[[np.ndarray], np.ndarray]) -> TrainReply:
    """``fn`` on every array, sent in the array's dtype (the product refuses another dtype:
    :func:`strategies.update_codec.unpack_update`)."""
    with np.errstate(invalid="ignore"):
        return replace(reply, delta=[np.asarray(fn(np.asarray(a)), dtype=np.asarray(a).dtype)
                                     for a in reply.delta])


def _non_finite(a: np.ndarray) -> np.ndarray:
    """NaN and inf in turn, shaped like ``a``."""
    return np.where(np.arange(a.size) % 2, np.nan, np.inf).reshape(a.shape)


ATTACKS: dict[str, Attack] = {
    "none": lambda r, rng, s: r,
    "inflated-n": lambda r, rng, s: replace(r, num_examples=s["inflated_n"]),
    "bad-a-norm": lambda r, rng, s: replace(r, steps=1, a_norm=LocalSolver().a_norm(1)),
    "scaled": lambda r, rng, s: _map(r, lambda a: a * s["scale"]),
    "sign-flip": lambda r, rng, s: _map(r, lambda a: -a),
    "nan": lambda r, rng, s: _map(r, _non_finite),
    "noise": lambda r, rng, s: _map(r, lambda a: s["noise_std"] * rng.standard_normal(a.shape)),
    "always-fails": lambda r, rng, s: None,
}


def usable(reply: TrainReply | None) -> bool:
    """What reaches the aggregator: a reply that arrived with a finite update."""
    return reply is not None and all(np.isfinite(a).all() for a in reply.delta)


def build_aggregator(defence: str, settings: RunSettings):
    """The run config's aggregator for the table's ``defence`` name (default options)."""
    defence_name, aggregator_name = DEFENCES_RUN[defence]
    sections = default_sections()
    return with_defence(build(DEFENCES, defence_name, sections, settings),
                        build(AGGREGATORS, aggregator_name, sections, settings))


def server_update(aggregator, replies: list[TrainReply], attacker: int, attack: str,
                  rng: np.random.Generator, setup: dict, book: SiteBook) -> list[np.ndarray]:
    """The round's aggregated update after ``attack`` by ``replies[attacker]`` (module doc)."""
    replies = list(replies)
    replies[attacker] = ATTACKS[attack](replies[attacker], rng, setup)
    kept = [replace(r, num_examples=book.capped(r.node_id, r.num_examples))
            for r in replies if usable(r)]
    delta, _ = aggregator.aggregate(kept)
    return delta


def merge_report(path: Path, report: dict) -> dict:
    """Write ``report`` into the JSON at ``path``, replacing only its own sets.

    The file keeps ``{"clean": {set: metric}, "runs": [...], "sets": {set:
    {...}}, ...}``: the clean values, runs and ``sets`` entries of the sets in
    ``report`` replace those of the same names, other sets stay. The rest of
    ``report`` (``setup``, ``environment``, ...) is stored per set under
    ``"details"``. Returns what was written (strict JSON: no NaN).
    """
    path = Path(path)
    merged = json.loads(path.read_text()) if path.is_file() else {}
    names = set(report["clean"])
    merged["clean"] = {**{k: v for k, v in merged.get("clean", {}).items() if k not in names},
                       **report["clean"]}
    merged["runs"] = [r for r in merged.get("runs", []) if r["set"] not in names] + report["runs"]
    merged["sets"] = {**{k: v for k, v in merged.get("sets", {}).items()
                         if k not in names and isinstance(v, dict)}, **report["sets"]}
    rest = {k: v for k, v in report.items() if k not in ("clean", "runs", "sets")}
    details = {k: v for k, v in merged.get("details", {}).items() if k not in names}
    merged["details"] = {**details, **{name: rest for name in sorted(names)}}
    for key in ("setup", "target", "environment"):  # the single-set layout before the merge
        merged.pop(key, None)
    write_report(path, merged, allow_nan=False)
    return merged
