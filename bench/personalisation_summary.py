"""The JSON of ``bench/personalisation.py``: per-seed records, summary rows, kept sets, table.

Per run and method the per-site metric is averaged over the sites (unweighted); a
row's ``mean`` / ``sd`` are over seeds of that average (:mod:`stats`: one seed has
sd ``None``) and ``gain_vs_fedavg_global`` is the paired per-seed difference to
``fedavg-global``. Reptile is recorded per meta step size: the variant
``per-fedavg-reptile@<alpha>`` of the per-seed records is the row
``{"method": "per-fedavg-reptile", "alpha": <alpha>}``. The output file holds every
set measured so far: a run replaces the sets it measures, and ``--resume`` keeps a
set's seeds and variants measured under the same protocol and set settings.
"""

from __future__ import annotations

from pathlib import Path

from report import Column, print_table
from stats import defined, mean, mean_sd, pm

__all__ = ["METHODS", "REPTILE", "variant", "variants", "split_variant", "summarise",
           "seed_record", "kept_sets", "print_rows"]

#: The methods, as the JSON names them.
METHODS = ("fedavg-global", "finetune", "per-fedavg-reptile", "per-fedavg-fo", "fedbn",
           "local-only")
REPTILE = "per-fedavg-reptile"


def variant(method: str, alpha: float) -> str:
    """The per-seed record's key of ``method``: Reptile's carries its ``alpha``."""
    return f"{REPTILE}@{alpha:g}" if method == REPTILE else method


def variants(alphas: tuple[float, ...]) -> list[str]:
    """Every method variant of a run measuring Reptile at ``alphas``, in :data:`METHODS` order."""
    return [variant(m, a) for m in METHODS for a in (alphas if m == REPTILE else (0.0,))]


def split_variant(key: str) -> tuple[str, float | None]:
    """``(method, alpha)`` of a variant key (``alpha`` None but for Reptile)."""
    method, _, alpha = key.partition("@")
    return method, float(alpha) if alpha else None


def _row_order(key: str) -> tuple[int, float]:
    method, alpha = split_variant(key)
    return METHODS.index(method), alpha or 0.0


def summarise(name: str, metrics: tuple[str, ...], per_seed: list[dict]) -> list[dict]:
    """One row per method variant of set ``name``: ``mean`` / ``sd`` over seeds of the
    site-averaged main metric (``metrics[0]``), the other metrics, the paired gain over
    ``fedavg-global``, and the local training work (passes: equal for every method by
    design; examples: differ only where a site holds fewer items than a batch)."""
    rows = []
    for key in sorted({k for run in per_seed for k in run["methods"]}, key=_row_order):
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
        if metrics[0] not in found:
            continue
        main = found[metrics[0]]
        method, alpha = split_variant(key)
        rows.append({"set": name, "method": method, **({"alpha": alpha} if alpha else {}),
                     "metric": metrics[0], "mean": main["mean"], "sd": main["sd"],
                     "seeds": len(seeds), "gain_vs_fedavg_global": main["gain_vs_fedavg_global"],
                     "gain_sd": main["gain_sd"], "metrics": found,
                     "seed_values": [run["seed"] for run in seeds],
                     "local_passes": [run["methods"][key]["passes"] for run in seeds],
                     "local_examples": [run["methods"][key]["examples"] for run in seeds]})
    return rows


def seed_record(result: dict, metrics: tuple[str, ...]) -> dict:
    """The per-seed record of one variant's ``result`` (each site's ``personal`` and
    ``global`` metrics, the ``fallback`` sites, the work, time and sites of each round):
    the metrics averaged over the sites where each is defined, unweighted."""
    def site_mean(per_site: dict, metric: str) -> float | None:
        return mean(defined(m.get(metric) for m in per_site.values()))

    return {"mean": {m: site_mean(result["personal"], m) for m in metrics},
            "global_mean": {m: site_mean(result["global"], m) for m in metrics},
            **{k: result[k] for k in ("passes", "examples", "seconds", "sampled")},
            "fallback_sites": result["fallback"], "sites": result["personal"]}


def kept_sets(kept: dict, payload: dict, running: list[str], resume: bool,
              output: Path) -> None:
    """Copy into ``payload`` what ``kept`` (the output file's JSON) holds: every set not in
    ``running`` as it is, and with ``resume`` the per-seed records of a running set measured
    with the settings ``payload["sets"]`` holds. Raises ValueError (naming ``output``) if
    ``kept`` was measured under another protocol."""
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


def print_rows(rows: list[dict]) -> None:
    """The summary rows as the command prints them."""
    print_table("mean +- sd over seeds of the site-averaged metric (val split; hospitals: test)", [
        Column("set", "<15", lambda r: r["set"]), Column("method", "<19", lambda r: r["method"]),
        Column("alpha", "<6", lambda r: f"{r['alpha']:g}" if "alpha" in r else ""),
        Column("metric", "<8", lambda r: r["metric"]), Column("mean", "7.3f", lambda r: r["mean"]),
        Column("sd", ">6", lambda r: pm(r["sd"], None, ".3f")),
        Column("gain", "+7.3f", lambda r: r["gain_vs_fedavg_global"]),
        Column("seeds", "5d", lambda r: r["seeds"])], rows)
