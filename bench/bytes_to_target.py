r"""Bytes to a target metric: the convergence rule, per-run ratios vs dense, the issue's goals.

A run of ``bench/compression_to_target.py`` is one row: its primary metric per
round (round 1 first) and the bytes every site sent up and received down per
round. Against the dense fp32 row of the same set and seed:

* ``up_ratio`` = dense's mean uplink bytes per site and round / ours (the
  dense row's own wire bytes, so dense is exactly 1); ``down_ratio`` the same
  for the downlink; ``*_vs_fp32`` divide the model as raw float32 instead
  (:func:`strategies.wire.model_layout.dense_bytes`, the product's ``uplink-ratio``);
* ``final_metric`` = mean of the last ``tail`` rounds; ``relative_to_dense`` =
  ``final / final_dense`` and ``rel_diff`` = ``relative_to_dense - 1``;
* the target is ``fraction`` (95%) of dense's final metric; ``bytes_to_target``
  = up + down bytes of all sites summed over rounds ``1..r`` with ``r`` the
  first round whose metric reaches it (a round without evaluation never
  does); ``bytes_to_target_ratio`` = dense's / ours (``None`` if never).
  Round 1's downlink is the initial model to every site, dense in every
  config (a compressed downlink starts with a snapshot), so it bounds that
  ratio by about twice the rounds dense needs; ``bytes_to_target_ratio_updates``
  leaves it out on both sides (sites that start from a model they already
  hold, e.g. one built from a shared seed): the updates alone.

How many rounds dense runs is the product's early stopping
(``early-stopping.patience`` / ``min-delta``); every other config of the set
and seed runs as many.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stats import at_least, defined, group, markdown_table as table, mean, ratio, tail_mean

__all__ = ["traffic_fields", "compare", "summarise", "goals", "markdown_table"]

#: The issue's goals: uplink and downlink ratios, final metric within 2%, bytes to target.
GOAL_UP, GOAL_DOWN, GOAL_REL, GOAL_TARGET = 100.0, 10.0, -0.02, 50.0


def traffic_fields(run) -> dict:
    """The bytes :func:`compare` reads from a row, from an ``engine_runs.RoundSeries``."""
    return {"bytes_up_per_round": [int(sum(b)) for b in run.bytes_up],
            "bytes_down_per_round": [int(sum(b)) for b in run.bytes_down],
            "up_bytes_per_site_round": float(np.mean(run.bytes_up)),
            "down_bytes_per_site_round": float(np.mean(run.bytes_down)),
            "dense_fp32_bytes": run.dense_fp32_bytes}


def _bytes_to(row: dict, target: float, initial: bool = True
              ) -> tuple[int | None, float | None]:
    """First round at ``target`` and the bytes up to it (``initial``: round 1's downlink too)."""
    r = next((i + 1 for i, value in enumerate(row["curve"])
              if value is not None and value >= target), None)
    if r is None:
        return None, None
    total = np.add(row["bytes_up_per_round"], row["bytes_down_per_round"])
    return r, float(np.sum(total[:r])) - (0 if initial else row["bytes_down_per_round"][0])


def compare(rows: Sequence[dict], tail: int = 3, fraction: float = 0.95) -> list[dict]:
    """``rows`` with the ratios vs the dense row (``config == "none"``) of their set and seed.

    A row without its dense row gets ``None`` ratios.
    """
    dense = {(r["set"], r["seed"]): r for r in rows if r["config"] == "none"}
    out = []
    for row in rows:
        row = dict(row)
        ref = dense.get((row["set"], row["seed"]))
        row["final_metric"] = tail_mean(row["curve"], tail)
        row["up_ratio_vs_fp32"] = row["dense_fp32_bytes"] / row["up_bytes_per_site_round"]
        row["down_ratio_vs_fp32"] = row["dense_fp32_bytes"] / row["down_bytes_per_site_round"]
        keys = ("up_ratio", "down_ratio", "relative_to_dense", "rel_diff", "target",
                "rounds_to_target", "bytes_to_target", "bytes_to_target_ratio",
                "bytes_to_target_ratio_updates")
        row.update(dict.fromkeys(keys))
        if ref is not None:
            final = tail_mean(ref["curve"], tail)
            target = fraction * final
            dense_rounds, dense_bytes = _bytes_to(ref, target)
            rounds, spent = _bytes_to(row, target)
            row.update(
                up_ratio=ref["up_bytes_per_site_round"] / row["up_bytes_per_site_round"],
                down_ratio=ref["down_bytes_per_site_round"] / row["down_bytes_per_site_round"],
                relative_to_dense=row["final_metric"] / final,
                rel_diff=row["final_metric"] / final - 1.0, target=target,
                rounds_to_target=rounds, bytes_to_target=spent,
                bytes_to_target_ratio=ratio(dense_bytes, spent),
                bytes_to_target_ratio_updates=ratio(_bytes_to(ref, target, False)[1],
                                                     _bytes_to(row, target, False)[1]))
        out.append(row)
    return out


def _stats(values: list) -> dict:
    """Mean, minimum and maximum of the defined values and their count."""
    got = defined(values)
    return {"mean": mean(got), "min": min(got, default=None), "max": max(got, default=None),
            "n": len(got)}


def summarise(rows: Sequence[dict]) -> list[dict]:
    """Per (set, config), over seeds: mean / min / max of the compared fields.

    ``bytes_to_target_ratio`` is over the seeds that reached the target
    (``reached`` of ``seeds``).
    """
    out = []
    for (name, config), seeds in group(rows, lambda r: (r["set"], r["config"])).items():
        entry = {"set": name, "config": config, "seeds": sorted(r["seed"] for r in seeds),
                 "rounds": sorted({r["rounds"] for r in seeds}),
                 "reached": sum(r["bytes_to_target_ratio"] is not None for r in seeds)}
        for key in ("up_ratio", "down_ratio", "final_metric", "relative_to_dense",
                    "bytes_to_target_ratio", "bytes_to_target_ratio_updates"):
            entry[key] = _stats([r[key] for r in seeds])
        out.append(entry)
    return out


def goals(summary: Sequence[dict]) -> dict:
    """Per set, which configs meet the issue's goals (on the means over seeds).

    ``ratios_and_metric``: up ratio >= 100, down ratio >= 10 and final metric
    at most 2% (relative) below dense; ``bytes_to_target``: >= 50x fewer bytes
    to the target on every seed run (``bytes_to_target_updates``: the same
    without round 1's downlink).
    """
    out: dict = {}
    for entry in summary:
        mean = {k: entry[k]["mean"] for k in ("up_ratio", "down_ratio", "relative_to_dense",
                                              "bytes_to_target_ratio")}
        if mean["up_ratio"] is None:
            continue
        per_set = out.setdefault(entry["set"], {"ratios_and_metric": [], "bytes_to_target": [],
                                                "bytes_to_target_updates": []})
        if (mean["up_ratio"] >= GOAL_UP and mean["down_ratio"] >= GOAL_DOWN
                and mean["relative_to_dense"] - 1.0 >= GOAL_REL):
            per_set["ratios_and_metric"].append(entry["config"])
        for key, field in (("bytes_to_target", "bytes_to_target_ratio"),
                           ("bytes_to_target_updates", "bytes_to_target_ratio_updates")):
            if entry["reached"] == len(entry["seeds"]) and at_least(entry[field]["min"],
                                                                    GOAL_TARGET):
                per_set[key].append(entry["config"])
    for per_set in out.values():
        for key in ("ratios_and_metric", "bytes_to_target", "bytes_to_target_updates"):
            per_set[f"{key}_met"] = bool(per_set[key])
    return out


def _cell(stats: dict, fmt: str) -> str:
    if stats["mean"] is None:
        return "never"
    text = format(stats["mean"], fmt)
    return text if stats["n"] == 1 else f"{text} ({format(stats['min'], fmt)}-" \
        f"{format(stats['max'], fmt)})"


def markdown_table(summary: Sequence[dict]) -> str:
    """One line per (set, config): means over seeds, the range in brackets."""
    def cells(e: dict) -> list[str]:
        target = _cell(e["bytes_to_target_ratio"], ".1f")
        if e["reached"] < len(e["seeds"]):
            target += f", reached {e['reached']}/{len(e['seeds'])}"
        return [e["set"], f"`{e['config']}`", str(len(e["seeds"])),
                "/".join(map(str, e["rounds"])), _cell(e["up_ratio"], ".1f"),
                _cell(e["down_ratio"], ".1f"), _cell(e["final_metric"], ".3f"),
                _cell(e["relative_to_dense"], ".3f"), target,
                _cell(e["bytes_to_target_ratio_updates"], ".1f")]

    return table(["set", "config", "seeds", "rounds", "up ratio", "down ratio", "final metric",
                  "rel. to dense", "bytes-to-target ratio", "same, updates only"],
                 map(cells, summary))
