"""The federation's figures, from hand-made round reports: right data, labels and names."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure

from app.tracking.figures import (
    SELECTION_LEGEND,
    federation_figures,
    matrix_figure,
    selection_figure,
    tau_figure,
    traffic_figure,
    validation_figure,
)
from strategies.rounds.round_report import RoundReport


def _reports() -> list[RoundReport]:
    """Two rounds, given out of order: a trains both, b only round 1 (dropped in round 2)."""
    second = RoundReport(
        2, train={"a": {"steps": 6.0}}, train_dropped={"b": "site reported an error"},
        evaluate={"a": {"val-dice": 0.6}, "b": {"val-dice": 0.4}},
        evaluate_aggregate={"val-dice": 0.5}, schedule_tau=6,
        strategy={"bytes-up": 100.0, "bytes-down": 300.0, "tau-eff": 5.5},
        selection={"selected": ["a", "b"], "candidates": [], "losses": {}})
    first = RoundReport(
        1, train={"a": {"steps": 8.0}, "b": {"steps": 4.0}},
        evaluate={"a": {"val-dice": 0.3}, "b": {"val-dice": 0.1}},
        evaluate_aggregate={"val-dice": 0.2}, schedule_tau=8,
        strategy={"bytes-up": 200.0, "bytes-down": 400.0, "tau-eff": 6.0},
        selection={"selected": ["a", "b"], "candidates": [], "losses": {}})
    return [second, first]


def _lines(figure: Figure) -> dict[str, tuple[list, list]]:
    (axes,) = figure.axes
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
            for line in axes.get_lines()}


def test_validation_figure_has_one_line_per_site_in_round_order_and_the_mean():
    figure = validation_figure(_reports(), "val-dice")
    lines = _lines(figure)
    assert set(lines) == {"a", "b", "weighted mean"}
    assert lines["a"] == ([1, 2], [0.3, 0.6])
    assert lines["weighted mean"] == ([1, 2], [0.2, 0.5])
    assert figure.axes[0].get_ylabel() == "val-dice" and figure.axes[0].get_xlabel() == "round"


def test_traffic_figure_bars_bytes_down_and_up_per_round():
    (axes,) = traffic_figure(_reports()).axes
    heights = {container.get_label(): [bar.get_height() for bar in container]
               for container in axes.containers}
    assert heights == {"bytes-down": [400.0, 300.0], "bytes-up": [200.0, 100.0]}
    assert axes.get_ylabel() == "bytes"


def test_tau_figure_shows_the_schedule_the_steps_done_and_tau_eff():
    lines = _lines(tau_figure(_reports()))
    assert lines["schedule tau"][1] == [8, 6]
    assert lines["a steps"][1] == [8.0, 6.0]
    assert lines["b steps"][0] == [1, 2] and np.isnan(lines["b steps"][1][1])
    assert lines["tau_eff"][1] == [6.0, 5.5]


def test_selection_heatmap_codes_rounds_by_sites():
    figure = selection_figure(_reports())
    axes = figure.axes[0]
    grid = np.asarray(axes.images[0].get_array())
    assert grid.tolist() == [[2, 2], [2, 1]]  # round 2: b selected but dropped
    assert [t.get_text() for t in axes.get_xticklabels()] == ["a", "b"]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["1", "2"]
    colorbar_labels = [t.get_text() for t in figure.axes[1].get_yticklabels()]
    assert colorbar_labels == list(SELECTION_LEGEND.values())


def test_matrix_figure_writes_every_cell_and_nan_as_na():
    matrix = np.array([[0.5, np.nan], [0.7, 0.2]])
    figure = matrix_figure(["global", "a-finetuned"], ["a", "b"], matrix, "test-dice")
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.texts] == ["0.500", "n/a", "0.700", "0.200"]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["global", "a-finetuned"]
    assert "test-dice" in axes.get_title()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")  # renders without pyplot or a display
    assert buffer.getvalue().startswith(b"\x89PNG")


def test_federation_figures_names_and_what_is_left_out():
    figures = federation_figures(_reports(), "val-dice")
    assert sorted(figures) == ["figures/bytes.png", "figures/selections.png", "figures/tau.png",
                               "figures/validation.png"]
    bare = federation_figures([RoundReport(1, schedule_tau=4)], "val-dice")
    assert sorted(bare) == ["figures/tau.png"]
    assert federation_figures([], "val-dice") == {}
