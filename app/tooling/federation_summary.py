"""The summary printed after ``make simulate`` / ``make federate``, read back from MLflow.

Every command it prints names the store the run used (``TRACKING_URI``, and
``ARTIFACT_ROOT`` for ``make mlflow-ui``), so it works as printed; where the model's
folder is on this machine, it is printed too: the folder a hospital is handed and
applies with ``make predict MODEL=/folder`` without any store.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from urllib.parse import unquote, urlparse

from app.round_progress import ratio_phrase
from strategies.rounds.site_coverage import (BEST_UNREGISTERED_TAG, CONTRIBUTED_TAG,
                                             MISSING_TAG, PARTIAL_TAG, REQUIRED_TAG, SITES_TAG)

__all__ = ["MODEL_TRAINING_VIEW", "print_summary"]

#: The query that opens MLflow's UI (3.17) in its "Model training" view. Its view is one
#: switch for the whole UI (this query, else the browser's last choice, else "GenAI", where
#: an experiment shows an empty traces overview); the experiment tag
#: ``mlflow.experimentKind`` does not choose it.
MODEL_TRAINING_VIEW = "workflowType=machine_learning"


def print_summary(tracking_uri: str, flwr_run_id: int, seconds: float,
                  artifact_root: str | Path) -> bool | None:
    """Per-round validation metric, the selected model and its held-out test, the MLflow
    location and the commands that open it and apply the model: read back from MLflow.

    MLflow is asked with bounded requests (no retries, :func:`bounded_requests`); when it
    does not answer, one line says so and names ``make tracking-flush`` (the federation's
    result waits in its checkpoint folder, :mod:`app.tracking.run_end`): never an error.

    Returns whether the run was *partial* (its final model from fewer sites than run config
    ``federation.min-contributing-sites`` asks, the run's tag ``federation.partial``,
    :mod:`strategies.rounds.site_coverage`); ``None`` when MLflow did not tell.

    Parameters
    ----------
    tracking_uri : str
        The store the federation used (``TRACKING_URI``).
    flwr_run_id : int
        Flower's run id (the MLflow run's ``flwr.run-id`` tag).
    seconds : float
        The federation's wall time.
    artifact_root : str or Path
        The store's default artifact root (``ARTIFACT_ROOT``), for ``make mlflow-ui``.
    """
    from mlflow.exceptions import MlflowException  # noqa: PLC0415 - heavy import

    from app.tracking.tracker import bounded_requests  # noqa: PLC0415

    try:
        with bounded_requests():
            return _print_from_mlflow(tracking_uri, flwr_run_id, seconds, artifact_root)
    except MlflowException as exc:
        print(f"\nMLflow at {tracking_uri} does not answer ({str(exc).splitlines()[0][:200]}): "
              "no summary. What the federation left for it waits in its checkpoint folder; "
              "once MLflow answers, send it with the command the ServerApp printed: make "
              f"tracking-flush RUN_DIR=<that folder> TRACKING_URI={shlex.quote(tracking_uri)}")
        return None


def _print_from_mlflow(tracking_uri: str, flwr_run_id: int, seconds: float,
                       artifact_root: str | Path) -> bool | None:
    """:func:`print_summary`'s lines and partial flag, read from MLflow (raises what MLflow
    raises)."""
    import mlflow  # noqa: PLC0415 - heavy import, only needed at the end
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient()
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list",
                              filter_string=f"tags.`flwr.run-id` = '{flwr_run_id}'")
    print("\n=== Federation summary ===")
    print(f"wall time: {seconds:.1f} s")
    if not runs:
        print(f"no MLflow run found with tag flwr.run-id={flwr_run_id} in {tracking_uri}")
        return None
    run = runs[0]
    metric = run.data.tags.get("selection-metric") or _selection_metric(run.data.metrics)
    for key, label in ((f"eval/{metric}", metric), ("train/train-loss", "train loss")):
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        values = ", ".join(f"r{m.step} {m.value:.4f}" for m in history)
        print(f"{label:>10} per round: {values}")
    totals = {key: sum(m.value for m in client.get_metric_history(run.info.run_id, key))
              for key in ("strategy/bytes-up", "strategy/bytes-down", "strategy/dense-bytes")}
    rounds = len(client.get_metric_history(run.info.run_id, "strategy/bytes-up"))
    if rounds:
        up, down = totals["strategy/bytes-up"], totals["strategy/bytes-down"]
        dense = totals["strategy/dense-bytes"] / rounds
        sent = {direction: sum(len(client.get_metric_history(run.info.run_id, key))
                               for key in run.data.metrics
                               if key.startswith("site/") and key.endswith(f"/bytes-{direction}"))
                for direction in ("up", "down")}
        print(f"bytes on the wire over {rounds} rounds: up {up / 1e6:.2f} MB "
              f"({ratio_phrase(dense * sent['up'], up)}), down {down / 1e6:.2f} MB "
              f"({ratio_phrase(dense * sent['down'], down)}); one dense fp32 update: "
              f"{dense / 1e6:.2f} MB")
    experiment = client.get_experiment(run.info.experiment_id)
    partial = _print_sites_line(run.data.tags)
    _print_model_lines(client, run, experiment.name, metric, tracking_uri)
    skipped = {key.split("/")[1]: int(value) for key, value in run.data.metrics.items()
               if key.startswith("site/") and key.endswith("/studies-skipped")}
    if skipped:
        detail = ", ".join(f"{site} {count}" for site, count in sorted(skipped.items()))
        print(f"studies skipped by the readers: {sum(skipped.values())} ({detail}; "
              "reasons in each site's log)")
    print(f"MLflow: experiment '{experiment.name}', run {run.info.run_id} "
          f"({run.info.run_name}), store {tracking_uri}")
    print(f"open it with: make mlflow-ui TRACKING_URI={shlex.quote(tracking_uri)} "
          f"ARTIFACT_ROOT={shlex.quote(str(artifact_root))}")
    print(f"its runs: http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}?"
          f"{MODEL_TRAINING_VIEW} (MLflow's Model training view; the port: MLFLOW_PORT)")
    return partial


def _print_sites_line(tags: dict[str, str]) -> bool | None:
    """``sites: partial: 1 of 2 sites contributed (missing: site-b; ...)`` or ``complete``,
    from the run's coverage tags; whether the run was partial (``None``: a run without them)."""
    if PARTIAL_TAG not in tags:
        return None
    sites = [s for s in tags.get(SITES_TAG, "").split(",") if s]
    contributed = [s for s in tags.get(CONTRIBUTED_TAG, "").split(",") if s]
    partial = tags[PARTIAL_TAG] == "true"
    counted = f"{len(contributed)} of {len(sites)} sites contributed to the final model"
    if partial:
        print(f"sites: partial: {counted} (missing: {tags.get(MISSING_TAG) or 'none'}; "
              f"federation.min-contributing-sites needs {tags.get(REQUIRED_TAG, '?')})")
    else:
        print(f"sites: complete: {counted}")
    if BEST_UNREGISTERED_TAG in tags:
        print(f"best model not registered: {tags[BEST_UNREGISTERED_TAG]}")
    return partial


def _selection_metric(metrics: dict[str, float]) -> str:
    """``val-<main metric>`` of the task, read from a run without the ``selection-metric``
    tag the ServerApp sets (no task import: torch takes ~10 s).

    The best round is logged as ``best-val-<metric>``; a run without one (no
    evaluation yet) falls back to its first ``eval/val-*`` metric that is not a loss.
    """
    for prefix in ("best-val-", "eval/val-"):
        found = sorted(key.split("/")[-1].removeprefix("best-") for key in metrics
                       if key.startswith(prefix) and not key.endswith("-loss"))
        if found:
            return found[0]
    return "val-loss"


def _print_model_lines(client, run, experiment: str, metric: str, tracking_uri: str) -> None:
    """The best round and its registered version, its test metric per site, how to apply it
    (from this store, and from the model's folder where it is on this machine)."""
    best = run.data.tags.get("best-round")
    if best is None:  # no round was evaluated (or nothing aggregated): no best model
        final = _run_version(client, f"{experiment}-final", run.info.run_id)
        if final:
            print(f"no best round (no round released {metric}: fraction-evaluate = 0?), none "
                  f"registered as {experiment}-best; final model {final}")
        _print_test_lines(run, metric)
        if final:
            _print_apply_line(final, tracking_uri)
        return
    uri = (_run_version(client, f"{experiment}-best", run.info.run_id)
           or f"runs:/{run.info.run_id}/best-model")
    value = run.data.metrics.get(f"best-{metric}")
    rule = run.data.tags.get("selection-aggregate", "")
    label = "the round's value" if rule in ("site-vote", "mean") else f"the sites' {rule}"
    score = (f"{metric} {value:.4f}{f', {label}; rule {rule}' if rule else ''}"
             if value is not None else f"no round released {metric}")
    print(f"best round: r{best} ({score}), model {uri}")
    _print_test_lines(run, metric)
    _print_apply_line(uri, tracking_uri)
    folder = _model_folder(client, run)
    if folder is not None:
        print(f"or hand its folder to a hospital (weights + metadata; no store needed there): "
              f"make predict MODEL={shlex.quote(str(folder))} DATA=/abs/site OUT=/abs/out")


def _print_test_lines(run, metric: str) -> None:
    """The held-out test metric per site, or the sites' policy rules that withheld it."""
    name = metric.removeprefix("val-")
    sites = {key.split("/")[1]: value for key, value in run.data.metrics.items()
             if key.startswith("site/") and key.endswith(f"/test-{name}")}
    if f"test/{name}" in run.data.metrics:
        detail = ", ".join(f"{site} {v:.4f}" for site, v in sorted(sites.items()))
        print(f"held-out test {name}: {run.data.metrics[f'test/{name}']:.4f} ({detail}); "
              "cross-site matrix: MLflow artifact cross-site/matrix.png")
    elif "test/withheld" in run.data.tags:  # no site released it (app.cross_site_report)
        print(f"held-out test {name}: withheld by site policy ({run.data.tags['test/withheld']})")


def _run_version(client, name: str, run_id: str) -> str:
    """``models:/<name>/<version>``: the newest version of ``name`` made by run ``run_id``
    (``""``: none)."""
    versions = [int(v.version) for v in client.search_model_versions(f"name='{name}'")
                if v.tags.get("run-id") == run_id]
    return f"models:/{name}/{max(versions)}" if versions else ""


def _print_apply_line(uri: str, tracking_uri: str) -> None:
    print(f"apply it at a site: make predict MODEL={uri} DATA=/abs/site OUT=/abs/out "
          f"TRACKING_URI={shlex.quote(tracking_uri)}")


def _model_folder(client, run) -> Path | None:
    """The local folder of the run's latest ``best-model``; None when its artifacts are remote."""
    models = client.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"name = 'best-model' AND source_run_id = '{run.info.run_id}'")
    if not models:
        return None
    location = max(models, key=lambda m: m.creation_timestamp).artifact_location
    parsed = urlparse(location)
    if parsed.scheme not in ("", "file"):
        return None
    folder = Path(unquote(parsed.path))
    return folder if (folder / "MLmodel").is_file() else None
