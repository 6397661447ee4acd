"""Summary of ``bench/compression_fedavg.py``: bytes, ratios, final metrics and the issue's targets.

Per config: mean uplink bytes per site per round, downlink bytes, uplink ratio
= dense fp32 bytes / uplink bytes, final metric = mean of the last ``tail``
rounds, relative difference vs dense ``(m - m_dense) / m_dense``. Targets:
(a) ``topk:0.01 +EF`` sends >= 100x fewer uplink bytes than dense and its
final metric is at most 2% (relative) below dense; (b) for each top-k
fraction, ``+EF`` ends higher than ``no EF``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stats import markdown_table as table, tail_mean

__all__ = ["summarise", "markdown_table", "targets_text"]


def summarise(task_name: str, metric_names: Sequence[str], rows: Sequence[dict],
              tail: int) -> dict:
    """Per-config bytes, ratios, final metrics and the two targets of the issue.

    ``rows`` are :func:`runner.run_arm` rows of one set and seed (``compression_fedavg``).
    """
    by_name = {r["config"]: r for r in rows}
    dense = by_name.get("none")
    dense_up = dense["up_bytes_per_site_round"] if dense else None
    configs = {}
    for r in rows:
        up = r["up_bytes_per_site_round"]
        row = {
            "label": r["label"], "spec": r["uplink"], "error_feedback": r["error_feedback"],
            "uplink_bytes_per_site_round": up,
            "downlink_bytes_per_site_round": r["down_bytes_per_site_round"],
            "dense_fp32_value_bytes": r["dense_fp32_bytes"],
            "uplink_ratio_vs_dense": (dense_up / up) if dense_up else None,
            "seconds": r["seconds"],
        }
        for m in metric_names:
            final = tail_mean(r["curves"][m], tail)
            row[f"final_{m}"] = final
            if dense:
                ref = tail_mean(dense["curves"][m], tail)
                row[f"rel_diff_{m}"] = (final - ref) / ref if ref else None
        configs[r["config"]] = row

    targets: dict = {}
    ef01 = configs.get("topk:0.01+ef")
    if dense and ef01:
        within = {m: ef01[f"rel_diff_{m}"] is not None and ef01[f"rel_diff_{m}"] >= -0.02
                  for m in metric_names}
        targets["a_topk0.01_ef"] = {
            "uplink_ratio": ef01["uplink_ratio_vs_dense"],
            "ratio_met": ef01["uplink_ratio_vs_dense"] >= 100.0,
            "rel_diff": {m: ef01[f"rel_diff_{m}"] for m in metric_names},
            "metric_within_2pct": within,
            "met": bool(ef01["uplink_ratio_vs_dense"] >= 100.0 and all(within.values())),
        }
    pairs = {}
    for frac in ("0.1", "0.01", "0.001"):
        a, b = configs.get(f"topk:{frac}+ef"), configs.get(f"topk:{frac}")
        if a and b:
            pairs[f"topk:{frac}"] = {
                "bytes": {"ef": a["uplink_bytes_per_site_round"],
                          "no_ef": b["uplink_bytes_per_site_round"]},
                "final": {m: {"ef": a[f"final_{m}"], "no_ef": b[f"final_{m}"]}
                          for m in metric_names},
                "ef_better": {m: a[f"final_{m}"] > b[f"final_{m}"] for m in metric_names},
            }
    if pairs:
        targets["b_ef_beats_no_ef"] = {
            "pairs": pairs,
            "met": all(all(p["ef_better"].values()) for p in pairs.values()),
        }
    spread = None
    if dense:
        m0 = metric_names[0]
        v = np.asarray(dense["curves"][m0], dtype=np.float64)
        if v.size > 2:
            spread = float(np.mean(np.abs(np.diff(v[-max(3, tail + 1):]))))
    return {"task": task_name, "tail_rounds": tail, "primary_metric": metric_names[0],
            "configs": configs, "targets": targets,
            "dense_round_to_round_change_last_rounds": spread}


def markdown_table(summary: dict) -> str:
    """The per-config table of one task."""
    metrics = [k[len("final_"):] for k in next(iter(summary["configs"].values()))
               if k.startswith("final_")]
    head = ["config", "up B/site/round", "down B/site/round", "up ratio"]
    for m in metrics:
        head += [f"final {m}", f"rel. diff {m}"]

    def cells(row: dict) -> list[str]:
        out = [row["label"], f"{row['uplink_bytes_per_site_round']:,.0f}",
               f"{row['downlink_bytes_per_site_round']:,.0f}",
               f"{row['uplink_ratio_vs_dense']:.1f}x" if row["uplink_ratio_vs_dense"] else "-"]
        for m in metrics:
            rel = row.get(f"rel_diff_{m}")
            out += [f"{row[f'final_{m}']:.3f}", f"{rel:+.1%}" if rel is not None else "-"]
        return out

    return table(head, map(cells, summary["configs"].values()))


def targets_text(summary: dict) -> str:
    out = []
    a = summary["targets"].get("a_topk0.01_ef")
    if a:
        rel = ", ".join(f"{m} {v:+.1%}" for m, v in a["rel_diff"].items())
        out.append(f"(a) topk:0.01 +EF: uplink {a['uplink_ratio']:.1f}x fewer bytes "
                   f"(>= 100x: {'met' if a['ratio_met'] else 'NOT met'}); final vs dense {rel} "
                   f"(>= -2%: {'met' if all(a['metric_within_2pct'].values()) else 'NOT met'}) "
                   f"-> {'MET' if a['met'] else 'NOT MET'}")
    b = summary["targets"].get("b_ef_beats_no_ef")
    if b:
        parts = []
        for name, p in b["pairs"].items():
            parts.append(f"{name}: " + ", ".join(
                f"{m} {v['ef']:.3f} vs {v['no_ef']:.3f}" for m, v in p["final"].items())
                + f" ({p['bytes']['ef']:,.0f} vs {p['bytes']['no_ef']:,.0f} B)")
        out.append("(b) EF vs no EF: " + "; ".join(parts)
                   + f" -> {'MET' if b['met'] else 'NOT MET'}")
    if summary.get("dense_round_to_round_change_last_rounds") is not None:
        out.append(f"dense {summary['primary_metric']}: mean |round-to-round change| over the "
                   f"last rounds {summary['dense_round_to_round_change_last_rounds']:.3f} "
                   f"(noise scale of the final numbers)")
    return "\n".join(out)
