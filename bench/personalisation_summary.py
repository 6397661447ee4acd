"""The JSON of ``bench/personalisation.py``: per-seed records, summary rows, kept results.

Per run and method the per-site metric is averaged over the sites
(unweighted); a row's ``mean`` / ``sd`` are over seeds of that average (one seed: sd
``None``, :mod:`stats`) and ``gain_vs_fedavg_global`` is the paired per-seed difference
to ``fedavg-global``. Reptile is recorded per meta step size: the variant
``per-fedavg-reptile@<alpha>`` of the per-seed records is the row
``{"method": "per-fedavg-reptile", "alpha": <alpha>}``.

The output file holds every set measured so far: a run replaces only the sets
it measures, and ``--resume`` keeps a set's seeds and method variants that
were measured with the same protocol and set settings (the missing variants
of a kept seed are measured and added).
"""

from __future__ import annotations

from pathlib import Path

from personalisation_rounds import SiteOutcome
from stats import defined, mean, mean_sd

__all__ = ["METHODS", "REPTILE", "variant", "variants", "split_variant", "site_mean",
           "summarise", "seed_record", "kept_sets"]

#: The methods, as the JSON names them.
METHODS = ("fedavg-global", "finetune", "per-fedavg-reptile", "per-fedavg-fo", "fedbn",
           "local-only")
REPTILE = "per-fedavg-reptile"


def variant(method: str, alpha: float) -> str:
    """The per-seed record's key of ``method``: Reptile's carries its ``alpha``."""
    return f"{REPTILE}@{alpha:g}" if method == REPTILE else method


def variants(alphas: tuple[float, ...]) -> list[str]:
    """Every method variant of a run measuring Reptile at ``alphas``, in :data:`METHODS` order."""
    out: list[str] = []
    for method in METHODS:
        out += [variant(method, a) for a in alphas] if method == REPTILE else [method]
    return out


def split_variant(key: str) -> tuple[str, float | None]:
    """``(method, alpha)`` of a variant key (``alpha`` None but for Reptile)."""
    method, _, alpha = key.partition("@")
    return method, float(alpha) if alpha else None


def site_mean(outcomes: list[SiteOutcome], metric: str, personal: bool) -> float | None:
    """Unweighted mean over the sites where ``metric`` is defined; ``None`` where it is nowhere."""
    values = [(o.personal_metrics if personal else o.global_metrics).get(metric)
              for o in outcomes]
    return mean(defined(values))


def _row_order(key: str) -> tuple[int, float]:
    method, alpha = split_variant(key)
    return METHODS.index(method), alpha or 0.0


def summarise(name: str, metrics: tuple[str, ...], per_seed: list[dict]) -> list[dict]:
    """One row per method variant of set ``name``: ``mean`` / ``sd`` over seeds of the
    site-averaged main metric (``metrics[0]``), the other metrics, the paired gain over
    ``fedavg-global``, and the local training work (passes: equal for every method by
    design; examples: differ only where a site holds fewer items than a batch)."""
    rows = []
    main_metric = metrics[0]
    keys = sorted({k for run in per_seed for k in run["methods"]}, key=_row_order)
    for key in keys:
        seeds = [run for run in per_seed if key in run["methods"]]
        found = {}
        for metric in metrics:
            pairs = [(run["methods"][key]["mean"].get(metric),
                      run["methods"]["fedavg-global"]["mean"].get(metric)) for run in seeds]
            values = [v for v, _ in pairs if v is not None]
            gains = [v - g for v, g in pairs if v is not None and g is not None]
            if values and gains:
                (average, sd), (gain, gain_sd) = mean_sd(values), mean_sd(gains)
                found[metric] = {"mean": average, "sd": sd, "per_seed": values,
                                 "gain_vs_fedavg_global": gain, "gain_sd": gain_sd}
        if main_metric not in found:
            continue
        main = found[main_metric]
        method, alpha = split_variant(key)
        rows.append({"set": name, "method": method, **({"alpha": alpha} if alpha else {}),
                     "metric": main_metric, "mean": main["mean"], "sd": main["sd"],
                     "seeds": len(seeds), "gain_vs_fedavg_global": main["gain_vs_fedavg_global"],
                     "gain_sd": main["gain_sd"], "metrics": found,
                     "seed_values": [run["seed"] for run in seeds],
                     "local_passes": [run["methods"][key]["passes"] for run in seeds],
                     "local_examples": [run["methods"][key]["examples"] for run in seeds]})
    return rows


def seed_record(results: dict, metrics: tuple[str, ...]) -> dict:
    """The per-seed record of every variant in ``results`` (``{variant: {"outcomes",
    "work", "seconds", "sampled"}}``): site-averaged metrics, work, time, the sites that
    trained in each round and each site's metrics."""
    methods = {}
    for key, result in results.items():
        outcomes = result["outcomes"]
        methods[key] = {
            "mean": {m: site_mean(outcomes, m, True) for m in metrics},
            "global_mean": {m: site_mean(outcomes, m, False) for m in metrics},
            "passes": result["work"].passes, "examples": result["work"].examples,
            "seconds": result["seconds"], "sampled": result["sampled"],
            "fallback_sites": [o.site for o in outcomes if o.fallback],
            "sites": {o.site: o.personal_metrics for o in outcomes}}
    return methods


def kept_sets(kept: dict, payload: dict, running: list[str], resume: bool,
              output: Path) -> None:
    """Copy into ``payload`` what ``kept`` (the output file's JSON) holds: every set not in
    ``running`` as it is, and with ``resume`` the per-seed records of a running set measured
    with the same settings (``payload["sets"]`` holds the running sets' settings).

    Raises
    ------
    ValueError
        If ``kept`` was measured under another protocol (the message names ``output``).
    """
    if not kept:
        return
    if kept["protocol"] != payload["protocol"]:
        raise ValueError(f"{output} holds sets measured under another protocol "
                         f"({kept['protocol']}); write to another --output")
    for name, settings in kept["sets"].items():
        if name not in running:
            payload["sets"][name] = settings
            payload["per_seed"][name] = kept["per_seed"][name]
            payload["runs"] += [r for r in kept["runs"] if r["set"] == name]
            payload["skipped"] += [s for s in kept["skipped"] if s["set"] == name]
        elif resume and settings == payload["sets"][name]:
            payload["per_seed"][name] = kept["per_seed"][name]
    payload["commands"] = kept["commands"] + payload["commands"]
