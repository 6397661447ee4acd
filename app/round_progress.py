"""The ServerApp's progress lines: one per round, the round's validation metric, and
the bytes on the wire in words.

Bytes up and down are ``dense`` or ``x<N> smaller than dense`` (:func:`ratio_phrase`):
in the round's progress line (:func:`round_traffic`) and in the summary after ``make
simulate`` (:mod:`app.tooling.federation_summary`).

With DP-SGD each site's train reply carries its privacy ledger's ``epsilon`` (spent on
its data by every federation so far) and ``epsilon-left``: the line shows both.

A metric a site withheld under its site policy (``RoundReport.evaluate_withheld``,
:mod:`strategies.rounds.withheld`) is printed as ``withheld by site policy
(<rule>)``, and an aggregate that no site released as withheld with every site's
rules: never as NaN.
"""

from __future__ import annotations

from collections.abc import Mapping

from strategies.rounds.round_report import RoundReport
from strategies.rounds.withheld import withheld_summary, withheld_text
from strategies.wire import message_keys as keys

__all__ = ["DENSE_BELOW", "epsilon_text", "metric_text", "progress_line", "ratio_phrase",
           "round_traffic"]

# A ratio dense / sent below this is an uncompressed transfer (codec ``none``: the
# payload header and Flower's framing make it slightly below 1).
DENSE_BELOW = 1.05


def ratio_phrase(dense: float, sent: float) -> str:
    """``'dense'`` when ``sent`` bytes are not fewer than ``dense`` (nothing compressed),
    else ``'x<dense/sent> smaller than dense'`` (one decimal below x10)."""
    if sent <= 0:
        return "nothing sent"
    ratio = dense / sent
    if ratio < DENSE_BELOW:
        return "dense"
    return f"x{ratio:.1f} smaller than dense" if ratio < 10 else f"x{ratio:.0f} smaller than dense"


def round_traffic(strategy: Mapping[str, float],
                  traffic: Mapping[str, Mapping[str, float]]) -> str:
    """The bytes part of a round's progress line (``''`` when the round counted none).

    ``strategy`` holds the round's ``bytes-up``, ``bytes-down`` and
    ``dense-bytes`` (one update as dense fp32), ``traffic`` the per-site
    ``bytes-up`` / ``bytes-down`` (:func:`strategies.rounds.round_metrics.record_traffic`).
    """
    if "bytes-up" not in strategy:
        return ""
    dense = strategy.get("dense-bytes", 0.0)
    ups = sum(1 for t in traffic.values() if "bytes-up" in t)
    downs = sum(1 for t in traffic.values() if "bytes-down" in t)
    return (f" | up {strategy['bytes-up'] / 1e3:.0f} kB "
            f"({ratio_phrase(dense * ups, strategy['bytes-up'])}), "
            f"down {strategy['bytes-down'] / 1e3:.0f} kB "
            f"({ratio_phrase(dense * downs, strategy['bytes-down'])})")


def _site_value(report: RoundReport, site: str, metric: str) -> str:
    value = report.evaluate.get(site, {}).get(metric)
    if value is not None:
        return f"{site} {value:.3f}"
    withheld = report.evaluate_withheld.get(site)
    return f"{site} {withheld_text(withheld) if withheld else 'n/a'}"


def metric_text(report: RoundReport, metric: str) -> str:
    """``<metric> <value> (<site> <value>, ...)``, or ``<metric> withheld by site policy
    (<site>: <rule>; ...)`` when no site released it; ``<metric> n/a`` when none evaluated."""
    value = report.evaluate_aggregate.get(metric)
    if value is None:
        if report.evaluate_withheld:
            return f"{metric} {withheld_text(withheld_summary(report.evaluate_withheld))}"
        return f"{metric} n/a (no site evaluated)"
    sites = ", ".join(_site_value(report, site, metric) for site in sorted(report.evaluate))
    return f"{metric} {value:.4f} ({sites})"


def epsilon_text(report: RoundReport) -> str:
    """`` | epsilon <site> <spent> (left <left>), ...`` over the train replies that carry the
    site's privacy ledger (DP-SGD: spent on its data by every federation so far); ``""``
    without DP."""
    sites = [f"{site} {m[keys.EPSILON]:.3g}" + (f" (left {m[keys.EPSILON_LEFT]:.3g})"
                                               if keys.EPSILON_LEFT in m else "")
             for site, m in sorted(report.train.items()) if keys.EPSILON in m]
    return f" | epsilon {', '.join(sites)}" if sites else ""


def progress_line(report: RoundReport, num_rounds: int, metric: str) -> str:
    """The round's line: train loss, the validation metric, tau, traffic, selection, the
    sites' epsilon (DP-SGD), time, the dropped replies and why."""
    train = report.train_aggregate.get(keys.TRAIN_LOSS)
    loss = f"train loss {train:.4f}" if train is not None else "train loss n/a"
    dropped = "; ".join(f"{s}: {r}" for s, r in
                        {**report.train_dropped, **report.evaluate_dropped}.items()) or "none"
    taus = ",".join(str(int(m.get(keys.STEPS, 0))) for _, m in sorted(report.train.items()))
    tau_eff = report.strategy.get("tau-eff")
    tau = f"tau {report.schedule_tau} (done {taus}" + (
        f", tau_eff {tau_eff:.1f})" if tau_eff is not None else ")")
    traffic = round_traffic(report.strategy, report.traffic) + (
        f", rate {report.strategy['codec-rate']:.3g}" if "codec-rate" in report.strategy else "")
    selected = ""
    if report.selection.get("candidates"):
        selected = (f" | selected {','.join(report.selection['selected'])} of "
                    f"{len(report.selection['candidates'])} candidates")
    return (f"Round {report.server_round}/{num_rounds}: {loss} | "
            f"{metric_text(report, metric)} | {tau}{traffic}{selected}{epsilon_text(report)} | "
            f"{report.seconds:.1f} s | dropped: {dropped}")
