"""The end-of-run summary reads the selection metric from the run, without importing the task;
the bytes of a round read "dense" when nothing was compressed (issue #17, item 5)."""

from __future__ import annotations

from app.tooling.federation_summary import _selection_metric
from app.round_progress import ratio_phrase, round_traffic


def test_the_metric_the_best_round_was_selected_by():
    metrics = {"best-round": 2.0, "best-val-auc": 0.81, "eval/val-auc": 0.8,
               "eval/val-loss": 0.4, "eval/val-accuracy": 0.7}
    assert _selection_metric(metrics) == "val-auc"


def test_without_a_best_round_the_first_validation_metric_that_is_not_a_loss():
    assert _selection_metric({"eval/val-loss": 1.0, "eval/val-dice": 0.2,
                              "site/hospital-00/val-dice": 0.1}) == "val-dice"
    assert _selection_metric({"train/train-loss": 1.0}) == "val-loss"


def test_an_uncompressed_round_reads_dense_not_x1_smaller() -> None:
    # codec none: each reply is the dense update plus the payload header and framing
    strategy = {"bytes-up": 2 * 830_120.0, "bytes-down": 2 * 831_000.0, "dense-bytes": 830_000.0}
    traffic = {"a": {"bytes-up": 830_120.0, "bytes-down": 831_000.0},
               "b": {"bytes-up": 830_120.0, "bytes-down": 831_000.0}}
    line = round_traffic(strategy, traffic)
    assert line == " | up 1660 kB (dense), down 1662 kB (dense)"


def test_a_compressed_uplink_reads_its_ratio() -> None:
    strategy = {"bytes-up": 2 * 7_250.0, "bytes-down": 831_000.0, "dense-bytes": 830_000.0}
    traffic = {"a": {"bytes-up": 7_250.0, "bytes-down": 415_500.0},
               "b": {"bytes-up": 7_250.0, "bytes-down": 415_500.0}}
    assert round_traffic(strategy, traffic) == (
        " | up 14 kB (x114 smaller than dense), down 831 kB (x2.0 smaller than dense)")
    assert round_traffic({}, {}) == ""
    assert ratio_phrase(100.0, 0.0) == "nothing sent"


def test_the_printed_commands_name_the_store_the_run_used(mlflow_store, tmp_path, capsys):
    """Found (issue 28, 6): the summary's ``make predict`` and ``make mlflow-ui`` hints omitted
    the store, so as printed they failed or showed an empty store."""
    import shlex

    import mlflow

    from app.model_source import load_logged_model
    from app.tooling.federation_summary import print_summary
    from app.tracking.model_logging import log_task_model, model_metadata, register_version
    from clients.registry import task_class
    from clients.training.site_task import TaskSettings

    previous = mlflow.get_tracking_uri()
    store, root = mlflow_store(tmp_path / "a store"), tmp_path / "a store" / "artifacts"
    mlflow.set_tracking_uri(store)
    try:
        experiment = mlflow.create_experiment("fedmed-cxr-cls", artifact_location=root.as_uri())
        settings = TaskSettings(image_size=16)
        task = task_class("cxr-cls")
        with mlflow.start_run(experiment_id=experiment, tags={"flwr.run-id": "7"}):
            mlflow.set_tag("best-round", "2")
            mlflow.log_metric("best-val-auc", 0.75)
            uri = log_task_model(task.model_for(settings), "best-model",
                                 task.example_input(settings),
                                 model_metadata("cxr-cls", settings, False, "auc"))
            register_version(uri, "fedmed-cxr-cls-best", {"run-id": mlflow.active_run().info.run_id})
        print_summary(store, 7, 1.0, root)
    finally:
        mlflow.set_tracking_uri(previous)
    lines = capsys.readouterr().out.splitlines()
    quoted = shlex.quote(store)
    assert (f"apply it at a site: make predict MODEL=models:/fedmed-cxr-cls-best/1 "
            f"DATA=/abs/site OUT=/abs/out TRACKING_URI={quoted}") in lines
    assert (f"open it with: make mlflow-ui TRACKING_URI={quoted} "
            f"ARTIFACT_ROOT={shlex.quote(str(root))}") in lines
    assert (f"its runs: http://127.0.0.1:5000/#/experiments/{experiment}?workflowType="
            "machine_learning (MLflow's Model training view; the port: MLFLOW_PORT)") in lines
    handed = next(line for line in lines if line.startswith("or hand its folder to a hospital"))
    folder = shlex.split(handed.split("make predict ", 1)[1])[0].removeprefix("MODEL=")
    assert load_logged_model(folder).task == "cxr-cls"
