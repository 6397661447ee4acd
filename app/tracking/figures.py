"""Figures of a federation, built from its round reports: pictures people look at.

Pure functions from :class:`~strategies.rounds.round_report.RoundReport` values
(and the cross-site matrix) to :class:`matplotlib.figure.Figure` objects; they
are made without ``pyplot`` (no global figure state, no display backend needed)
and logged as PNG artifacts under ``figures/`` (:mod:`app.tracking.cross_site_log`):

* ``validation.png``: the main validation metric per site per round, and the
  example-weighted mean;
* ``bytes.png``: bytes sent down (instructions) and up (replies) per round;
* ``tau.png``: local steps asked (the schedule's tau) and done per site;
* ``selections.png``: rounds x sites, whether a site was selected and whether
  its update was accepted;
* ``cross-site-matrix.png``: the cross-site evaluation matrix
  (:mod:`strategies.rounds.cross_site`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from strategies.rounds.round_report import RoundReport
from strategies.wire import message_keys as keys

__all__ = ["SELECTION_LEGEND", "federation_figures", "matrix_figure", "selection_figure",
           "tau_figure", "traffic_figure", "validation_figure"]

#: Cell values of the selection heatmap.
SELECTION_LEGEND = {0: "not selected", 1: "selected, dropped", 2: "selected, accepted"}


def _ordered(reports: Sequence[RoundReport]) -> list[RoundReport]:
    return sorted(reports, key=lambda report: report.server_round)


def _sites(per_round: Sequence[dict]) -> list[str]:
    return sorted(set().union(*per_round)) if per_round else []


def _round_axes() -> tuple[Figure, Axes]:
    """A figure of one panel for a per-round plot."""
    figure = Figure(figsize=(7, 4), layout="constrained")
    return figure, figure.add_subplot()


def _labelled(figure: Figure, axes: Axes, ylabel: str, title: str) -> Figure:
    """``figure`` with the rounds on x, ``ylabel`` on y, ``title`` and the legend."""
    axes.set(xlabel="round", ylabel=ylabel, title=title)
    axes.legend(fontsize="small")
    return figure


def validation_figure(reports: Sequence[RoundReport], metric: str) -> Figure:
    """``metric`` (e.g. ``val-dice``) per site per round, and the weighted mean (dashed)."""
    reports = _ordered(reports)
    figure, axes = _round_axes()
    rounds = [r.server_round for r in reports]
    for site in _sites([r.evaluate for r in reports]):
        values = [r.evaluate.get(site, {}).get(metric, np.nan) for r in reports]
        axes.plot(rounds, values, marker="o", label=site)
    axes.plot(rounds, [r.evaluate_aggregate.get(metric, np.nan) for r in reports], "k--",
              label="weighted mean")
    return _labelled(figure, axes, metric, f"Validation {metric} per site")


def traffic_figure(reports: Sequence[RoundReport]) -> Figure:
    """Bytes down (train instructions) and up (train replies) per round, all sites together."""
    reports = _ordered(reports)
    figure, axes = _round_axes()
    rounds = np.array([r.server_round for r in reports], dtype=float)
    for offset, name in ((-0.2, "bytes-down"), (0.2, "bytes-up")):
        axes.bar(rounds + offset, [r.strategy.get(name, 0.0) for r in reports], width=0.4,
                 label=name)
    return _labelled(figure, axes, "bytes", "Traffic per round")


def tau_figure(reports: Sequence[RoundReport]) -> Figure:
    """The schedule's tau per round, the steps each site reported, and tau_eff if tracked."""
    reports = _ordered(reports)
    figure, axes = _round_axes()
    rounds = [r.server_round for r in reports]
    axes.step(rounds, [r.schedule_tau for r in reports], "k-", where="mid", label="schedule tau")
    for site in _sites([r.train for r in reports]):
        axes.plot(rounds, [r.train.get(site, {}).get(keys.STEPS, np.nan) for r in reports],
                  marker=".", linestyle=":", label=f"{site} steps")
    if any("tau-eff" in r.strategy for r in reports):
        axes.plot(rounds, [r.strategy.get("tau-eff", np.nan) for r in reports], "r--",
                  label="tau_eff")
    return _labelled(figure, axes, "local steps", "Local steps (tau) per round")


def _selection_grid(reports: Sequence[RoundReport]) -> tuple[list[str], np.ndarray]:
    """Sites and the rounds x sites grid of :data:`SELECTION_LEGEND` codes."""
    chosen = [set(r.selection.get("selected", [])) | set(r.train) for r in reports]
    sites = _sites(chosen)
    grid = np.array([[0 if s not in picked else 2 if s in r.train else 1 for s in sites]
                     for r, picked in zip(reports, chosen)], dtype=float)
    return sites, grid.reshape(len(reports), len(sites))


def selection_figure(reports: Sequence[RoundReport]) -> Figure:
    """Heatmap rounds x sites: not selected, selected but dropped, selected and accepted."""
    reports = _ordered(reports)
    sites, grid = _selection_grid(reports)
    figure = Figure(figsize=(max(4.0, 0.6 * len(sites) + 2), max(3.0, 0.3 * len(reports) + 1.5)),
                    layout="constrained")
    axes = figure.add_subplot()
    colours = ListedColormap(["#eeeeee", "#e6550d", "#3182bd"])
    image = axes.imshow(grid, cmap=colours, vmin=-0.5, vmax=2.5, aspect="auto")
    axes.set_xticks(range(len(sites)), sites, rotation=45, ha="right")
    axes.set_yticks(range(len(reports)), [str(r.server_round) for r in reports])
    axes.set(xlabel="site", ylabel="round", title="Selections per site")
    bar = figure.colorbar(image, ax=axes, ticks=list(SELECTION_LEGEND))
    bar.ax.set_yticklabels(list(SELECTION_LEGEND.values()))
    return figure


def matrix_figure(rows: Sequence[str], columns: Sequence[str], matrix: np.ndarray,
                  metric: str, withheld: Mapping[tuple[int, int], str] | None = None) -> Figure:
    """Heatmap of the cross-site matrix: model (row) at site (column), the values written in;
    a cell in ``withheld`` (``(row, column)`` -> the site policy's rules) says
    ``withheld (<rules>)``, another cell without a value ``n/a``."""
    matrix = np.asarray(matrix, dtype=float).reshape(len(rows), len(columns))
    figure = Figure(figsize=(max(4.0, 1.1 * len(columns) + 2.5), max(3.0, 0.5 * len(rows) + 1.5)),
                    layout="constrained")
    axes = figure.add_subplot()
    image = axes.imshow(np.ma.masked_invalid(matrix), cmap="viridis", aspect="auto")
    axes.set_xticks(range(len(columns)), list(columns), rotation=45, ha="right")
    axes.set_yticks(range(len(rows)), list(rows))
    for (i, j), value in np.ndenumerate(matrix):
        text = f"{value:.3f}" if not np.isnan(value) else (
            f"withheld\n({withheld[i, j]})" if (i, j) in (withheld or {}) else "n/a")
        axes.text(j, i, text, ha="center",
                  va="center", color="black", fontsize="small",
                  bbox={"facecolor": "white", "alpha": 0.6, "linewidth": 0})
    axes.set(xlabel="test split of site", ylabel="model", title=f"Cross-site {metric}")
    figure.colorbar(image, ax=axes, label=metric)
    return figure


def federation_figures(reports: Sequence[RoundReport], metric: str) -> dict[str, Figure]:
    """The per-round figures by artifact path (``figures/<name>.png``); none without rounds.

    The traffic figure is left out when no round recorded bytes, the validation
    figure when no site evaluated, the selections when no site was selected.
    """
    if not reports:
        return {}
    figures = {"figures/tau.png": tau_figure(reports)}
    if any(r.train or r.selection.get("selected") for r in reports):
        figures["figures/selections.png"] = selection_figure(reports)
    if any(r.evaluate for r in reports):
        figures["figures/validation.png"] = validation_figure(reports, metric)
    if any("bytes-up" in r.strategy or "bytes-down" in r.strategy for r in reports):
        figures["figures/bytes.png"] = traffic_figure(reports)
    return figures
