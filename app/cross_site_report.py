"""The end of a federation in MLflow: held-out test metrics, the cross-site matrix, figures.

Called by the ServerApp once the rounds are over and the model is logged
(:func:`report_federation_end`). With run config ``final-evaluation`` (default
true) every connected site evaluates the selected model on its ``test`` split
and, with ``cross-site.finetune-steps`` = k > 0, the cross-site matrix of the
global and the sites' k-step fine-tuned models is built
(:func:`strategies.rounds.cross_site.cross_site_evaluation`). Logged to the
federation's MLflow run:

* ``test/<metric>``: the example-weighted test metrics (``test/dice``,
  ``test/loss``, ``test/num-examples``, ``test/studies``);
* ``site/<name>/test-<metric>``: each site's (``site/<name>/test-num-examples``
  for its count);
* with ``personalisation.method`` other than ``none``: ``site/<name>/personalised-test-<metric>``
  and ``site/<name>/personalised-gain-test-<metric>`` (personalised minus global), and
  ``test/personalised-<metric>``, ``test/personalised-gain-<metric>`` (example-weighted
  over the sites that report one);
* ``cross-site/matrix.json`` (an MLflow table: column ``model``, then one per
  site; a cell a site withheld under its policy holds ``withheld by site policy
  (<rule>)``), ``cross-site/matrix.png`` (heatmap), ``cross-site/dropped.json``
  (which site's reply was left out of which stage, and why) and
  ``cross-site/withheld.json`` (``"<stage>/<site>"`` -> what it withheld and under
  which rule; a fine-tune refused by ``share-finetuned-model`` is there);
* the tag ``test/withheld`` (``<site>: <rules>; ...``) when no site released the
  test metric: no NaN is logged;
* ``figures/*.png`` (:mod:`app.tracking.figures`), with
  ``figures/cross-site-matrix.png`` when there is a matrix.

The metrics are logged at step ``num-server-rounds + 1``, the round number the
evaluation's messages carry, as one more record of the tracker's outbox (the
figures as PNG files beside it): an MLflow outage never stops the federation and
loses none of it (it is sent with the rest, :mod:`app.tracking.run_end`). A final
evaluation that finds no site is a warning.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING

from flwr.app import Array, ArrayRecord
from flwr.serverapp import Grid
from flwr.supercore import log
from matplotlib.figure import Figure

from app.config.run_config import RunConfig
from app.tracking import BestRound, FederationTracker, RoundRecord, metric_key
from app.tracking.figures import federation_figures, matrix_figure
from strategies.wire.errors import FederationError
from strategies.wire.personalisation_gain import GAIN, PERSONALISED, personalisation_gains
from strategies.rounds.cross_site import (
    FINETUNED,
    CrossSiteResult,
    CrossSiteSetup,
    cross_site_evaluation,
)
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.rounds.withheld import withheld_summary, withheld_text

__all__ = ["cross_site_artifacts", "cross_site_metrics", "report_federation_end",
           "selected_arrays", "test_line"]

_TEST = "test-"


def selected_arrays(best: BestRound, final: ArrayRecord) -> ArrayRecord:
    """The selected model: the best round's arrays, else (no round evaluated) ``final``."""
    if not best.found:
        return final
    return ArrayRecord({key: Array(value) for key, value in zip(best.keys, best.arrays)})


def _weighted_name(name: str) -> str:
    """The weighted metric's name: ``test-x`` -> ``x``, ``personalised-test-x`` ->
    ``personalised-x``, ``personalised-gain-test-x`` -> ``personalised-gain-x``."""
    for prefix in (GAIN, PERSONALISED, ""):
        if name.startswith(f"{prefix}{_TEST}"):
            return f"{prefix}{name[len(prefix) + len(_TEST):]}"
    return name


def cross_site_metrics(result: CrossSiteResult) -> dict[str, float]:
    """MLflow metrics of the test evaluation: ``test/<m>`` (weighted), ``site/<s>/test-<m>``.

    With personalisation, ``site/<s>/personalised-test-<m>`` and
    ``site/<s>/personalised-gain-test-<m>`` (personalised minus global) beside each
    site's ``test-<m>``, and ``test/personalised-<m>``, ``test/personalised-gain-<m>``
    beside the weighted ``test/<m>``.
    """
    weighted = {**result.weighted, **personalisation_gains(result.weighted)}
    metrics = {metric_key("test", _weighted_name(name)): value for name, value in weighted.items()}
    for site, values in result.sites.items():
        metrics.update({metric_key("site", site, name if name.startswith((_TEST, PERSONALISED))
                                   else f"{_TEST}{name}"): value
                        for name, value in {**values, **personalisation_gains(values)}.items()})
    return {key: float(value) for key, value in metrics.items()}


def cross_site_artifacts(result: CrossSiteResult) -> dict[str, Figure]:
    """The matrix heatmap, under ``cross-site/`` and with the federation's figures."""
    if not result.rows or not result.columns:
        return {}
    cells = result.withheld_cells()
    return {path: matrix_figure(result.rows, result.columns, result.matrix, result.metric, cells)
            for path in ("cross-site/matrix.png", "figures/cross-site-matrix.png")}


def _test_sites_withheld(result: CrossSiteResult) -> dict[str, str]:
    """Site -> the rules under which it withheld its test metrics of the selected model."""
    return {key.split("/", 1)[1]: rules for key, rules in result.withheld.items()
            if key.startswith("test/")}


def _withheld_label(key: str) -> str:
    """``test/<s>`` -> ``<s>``, ``finetune/<s>`` -> ``<s>-finetuned``, ``<row>/<s>`` ->
    ``<row> at <s>``."""
    stage, site = key.split("/", 1)
    return {"test": site, "finetune": f"{site}{FINETUNED}"}.get(stage, f"{stage} at {site}")


def test_line(result: CrossSiteResult) -> str:
    """The end-of-run line: the weighted test metric (or the sites' rules when every site
    withheld it), the sites, examples, what each site withheld and what was dropped."""
    value, test_sites = result.weighted.get(result.metric), _test_sites_withheld(result)
    if value is not None:
        metric = f"{value:.4f}"
    else:
        metric = (withheld_text(withheld_summary(test_sites)) if test_sites
                  else "n/a (no site released it)")
    withheld = "; ".join(f"{_withheld_label(key)}: {withheld_text(rules)}"
                         for key, rules in sorted(result.withheld.items()))
    return (f"test {result.metric}: {metric} over {len(result.sites)} sites "
            f"({int(result.weighted.get('num-examples', 0))} examples); withheld: "
            f"{withheld or 'none'}; dropped: {result.dropped or 'none'}")


def _record(tracker: FederationTracker, result: CrossSiteResult | None,
            figures: dict[str, Figure], step: int) -> None:
    """Queue the metrics, table, tag and figures as one record of the tracker's outbox and
    send what is pending: an MLflow outage loses none of it (it waits on disk)."""
    record = RoundRecord(step=step, timestamp_ms=int(time.time() * 1000), metrics={})
    if result is not None:
        record.metrics = cross_site_metrics(result)
        record.tables["cross-site/matrix.json"] = result.table()
        if result.dropped:
            record.artifacts["cross-site/dropped.json"] = dict(result.dropped)
        if result.withheld:
            record.artifacts["cross-site/withheld.json"] = {
                k: withheld_text(v) for k, v in result.withheld.items()}
        if result.metric not in result.weighted and _test_sites_withheld(result):
            record.tags["test/withheld"] = withheld_summary(_test_sites_withheld(result))
    for path, figure in figures.items():
        tracker.keep_figure(record, path, figure)
    tracker.queue(record)
    tracker.flush()


def report_federation_end(grid: Grid, strategy: FederatedStrategy, arrays: ArrayRecord,
                          tracker: FederationTracker, config: RunConfig,
                          main_metric: str) -> CrossSiteResult | None:
    """Test-evaluate ``arrays`` (the selected model) and log the federation's report.

    Parameters
    ----------
    grid : Grid
        The federation's grid (the sites are still connected).
    strategy : FederatedStrategy
        The strategy that ran the rounds: its policy, site book and reports.
    arrays : ArrayRecord
        The selected model: the best round's arrays, else the final ones.
    tracker : FederationTracker
        The federation's MLflow run (still open).
    config : RunConfig
        ``final-evaluation``, ``cross-site.finetune-steps``, ``num-server-rounds``.
    main_metric : str
        The task's main metric (``dice``, ``auc``).

    Returns
    -------
    CrossSiteResult or None
        ``None`` when the final evaluation is off or found no site.
    """
    step = config.num_server_rounds + 1
    result = None
    if config.final_evaluation:
        try:
            result = cross_site_evaluation(grid, CrossSiteSetup.of(strategy), arrays,
                                           main_metric, config.cross_site_finetune_steps, step)
        except FederationError as exc:
            log(WARNING, "final evaluation skipped: %s", exc)
    figures = federation_figures(list(strategy.reports.values()), f"val-{main_metric}")
    if result is not None:
        figures.update(cross_site_artifacts(result))
        log(INFO, "%s", test_line(result))
    _record(tracker, result, figures, step)
    return result
