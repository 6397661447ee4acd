r"""The arithmetic of ``bench/pruning.py``: to the target per seed, means over seeds, goals.

A *row* is one federation (one set, seed and variant = pruning method plus
update codec): its primary validation metric per round (``curve``), the
round reports' wall seconds (``seconds_per_round``) and bytes up and down of
all sites per round, and the kept fraction of the model's parameters at the
end (``params_kept``) and the kept fraction of its forward pass's FLOPs
(``flops_kept``, of the network that runs: without its pruned channels when
structured). Against the ``dense`` row of the same set and seed
(:func:`compare_seeds`, built on :func:`bytes_to_target.compare`):

* ``final_metric`` = mean of the last ``tail`` rounds; ``relative_to_dense``
  = ``final / final_dense``;
* the target is ``fraction`` (95%) of dense's final metric; the first round
  ``r`` whose metric reaches it ends the count: ``bytes_to_target`` = bytes up
  + down of all sites over rounds ``1..r``, ``seconds_to_target`` = the sum of
  those rounds' wall seconds (train and evaluate); ``None`` if never reached;
* ``bytes_ratio`` and ``seconds_ratio`` = dense's value / ours (the speed-up);
  ``train_seconds_to_target`` / ``train_seconds_ratio`` the same on the
  sites' own training seconds (``train_seconds_per_round``: the sum of their
  ``train-seconds``), without the rounds' start-up, transport and evaluation;
  ``up_ratio`` / ``down_ratio``: dense's bytes per site and round / ours, up
  and down, whatever the rounds to the target.

:func:`summarise` gives, per (set, variant), means and sample standard
deviations over seeds (to-target values over the seeds that reached it);
:func:`goals` checks the issue's goals on those means (issue 32, item 4).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bytes_to_target import compare
from stats import at_least, group, markdown_table as table, over_seeds, pm, ratio

__all__ = ["DENSE", "GOALS", "compare_seeds", "summarise", "goals", "markdown_table"]

#: The unpruned reference method: every ratio divides its value.
DENSE = "dense"
#: The issue's goals: parameters kept, final metric vs dense, wall-time and bytes speed-ups.
GOALS = {"params_kept_at_most": 0.2, "relative_to_dense_at_least": 0.99,
         "structured_seconds_ratio_at_least": 1.5, "bytes_ratio_at_least": 5.0}


def _seconds_to(row: dict, rounds: int | None, key: str = "seconds_per_round"
                ) -> float | None:
    """Seconds ``key`` of rounds ``1..rounds`` (``None`` when the target was never reached)."""
    return None if rounds is None else float(np.sum(row[key][:rounds]))


def compare_seeds(rows: Sequence[dict], tail: int = 2, fraction: float = 0.95) -> list[dict]:
    """``rows`` with final metric, target, to-target values and ratios vs dense (same set, seed).

    :func:`bytes_to_target.compare` finds the target round and the bytes to it;
    its reference row is the one whose ``config`` is ``"none"``, here the
    ``dense`` variant. A row without its dense row gets ``None`` values.
    """
    as_configs = [{**row, "config": "none" if row["variant"] == DENSE else row["variant"]}
                  for row in rows]
    compared = compare(as_configs, tail, fraction)
    dense = {(r["set"], r["seed"]): r for r in compared if r["config"] == "none"}
    out = []
    for row, done in zip(rows, compared, strict=True):
        ref = dense.get((row["set"], row["seed"]))
        times = {}
        for name, key in (("seconds", "seconds_per_round"),
                          ("train_seconds", "train_seconds_per_round")):
            ours = _seconds_to(row, done["rounds_to_target"], key)
            dense_time = None if ref is None else _seconds_to(ref, ref["rounds_to_target"], key)
            times.update({f"{name}_to_target": ours, f"{name}_ratio": ratio(dense_time, ours)})
        out.append({**row, "final_metric": done["final_metric"],
                    "relative_to_dense": done["relative_to_dense"], "target": done["target"],
                    "rounds_to_target": done["rounds_to_target"],
                    "bytes_to_target": done["bytes_to_target"],
                    "bytes_ratio": done["bytes_to_target_ratio"], "up_ratio": done["up_ratio"],
                    "down_ratio": done["down_ratio"], **times})
    return out


def summarise(rows: Sequence[dict]) -> list[dict]:
    """Per (set, variant) of compared rows, in first-seen order: the issue's ``runs`` entries.

    ``seeds`` lists the seeds run and ``reached`` how many reached the target;
    ``seconds_to_target`` / ``bytes_to_target`` and their ratios are means over
    those seeds (``None`` if none did).
    """
    out = []
    for (name, variant), seeds in group(rows, lambda r: (r["set"], r["variant"])).items():
        out.append({"set": name, "method": seeds[0]["method"], "codec": seeds[0]["codec"],
                    "variant": variant, "seeds": sorted(r["seed"] for r in seeds),
                    "rounds": sorted({r["rounds"] for r in seeds}),
                    "reached": sum(r["rounds_to_target"] is not None for r in seeds),
                    **over_seeds(seeds, (
                        "params_kept", "flops_kept", "final_metric", "relative_to_dense",
                        "seconds_to_target", "bytes_to_target", "seconds_ratio", "bytes_ratio",
                        "train_seconds_to_target", "train_seconds_ratio", "up_ratio",
                        "down_ratio"))})
    return out


def _all_reached(entry: dict) -> bool:
    return entry["reached"] == len(entry["seeds"])


def goals(summary: Sequence[dict]) -> dict:
    """The issue's goals per set and overall (``met``: on every set measured).

    * ``small_and_accurate``: the pruning variants keeping at most 20% of the
      parameters with a final metric at least 99% of dense's;
    * ``structured_speed``: ``prunefl-structured`` (no codec) reaches the
      target at least 1.5x sooner in wall seconds than dense, on every seed;
    * ``bytes``: the pruning variants without a codec that need at least 5x
      fewer bytes to the target, on every seed; ``bytes_with_codec``: the
      codec variants that do, and with fewer bytes than the same method alone.
    """
    per_set: dict[str, dict] = {}
    alone = {(e["set"], e["method"]): e for e in summary if e["codec"] == "none"}
    for e in summary:
        if e["method"] == DENSE:
            continue
        out = per_set.setdefault(e["set"], {"small_and_accurate": [], "structured_speed": None,
                                            "bytes": [], "bytes_with_codec": []})
        kept = e["params_kept"] is not None and e["params_kept"] <= GOALS["params_kept_at_most"]
        if kept and at_least(e["relative_to_dense"], GOALS["relative_to_dense_at_least"]):
            out["small_and_accurate"].append(e["variant"])
        if e["method"] == "prunefl-structured" and e["codec"] == "none":
            out["structured_speed"] = e["seconds_ratio"] if _all_reached(e) else None
        fewer = _all_reached(e) and at_least(e["bytes_ratio"], GOALS["bytes_ratio_at_least"])
        if fewer and e["codec"] == "none":
            out["bytes"].append(e["variant"])
        same = alone.get((e["set"], e["method"]))
        if fewer and e["codec"] != "none" and same is not None and at_least(
                e["bytes_ratio"], same["bytes_ratio"] or 0.0):
            out["bytes_with_codec"].append(e["variant"])
    met = {
        "small_and_accurate": [bool(s["small_and_accurate"]) for s in per_set.values()],
        "structured_speed": [at_least(s["structured_speed"],
                                       GOALS["structured_seconds_ratio_at_least"])
                             for s in per_set.values()],
        "bytes": [bool(s["bytes"]) for s in per_set.values()],
        "bytes_with_codec": [bool(s["bytes_with_codec"]) for s in per_set.values()]}
    return {"thresholds": dict(GOALS), "per_set": per_set,
            "met": {goal: bool(flags) and all(flags) for goal, flags in met.items()}}


def _megabytes(value: float | None) -> str:
    return "never" if value is None else f"{value / 1e6:.2f} MB"


def markdown_table(summary: Sequence[dict]) -> str:
    """One line per (set, variant) for docs/BENCHMARKS.md: means ± sd over seeds."""
    def cells(e: dict) -> list[str]:
        reached = "" if _all_reached(e) else f" (reached {e['reached']}/{len(e['seeds'])})"
        return [e["set"], e["method"], f"`{e['codec']}`", str(len(e["seeds"])),
                pm(e["params_kept"], None, ".3f", "never"),
                pm(e["flops_kept"], None, ".3f", "never"),
                pm(e["final_metric"], e["final_metric_sd"], ".3f", "never"),
                pm(e["relative_to_dense"], None, ".3f", "never"),
                pm(e["seconds_to_target"], e["seconds_to_target_sd"], ".0f", "never") + reached,
                pm(e["seconds_ratio"], None, ".2f", "never"),
                pm(e["train_seconds_ratio"], None, ".2f", "never"),
                _megabytes(e["bytes_to_target"]), pm(e["bytes_ratio"], None, ".1f", "never")]

    return table(["set", "method", "codec", "seeds", "params kept", "FLOPs kept", "final metric",
                  "rel. to dense", "seconds to target", "x faster", "x faster (training)",
                  "bytes to target", "x fewer bytes"], map(cells, summary))
