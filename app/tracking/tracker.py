"""MLflow as the system of record: one MLflow run per federation, never in a round's way.

The experiment is per task (``fedmed-<task>`` unless the run config names one);
it carries the tag ``mlflow.experimentKind = custom_model_development``
(:data:`EXPERIMENT_TAGS`, also added to an existing experiment that lacks it), so
MLflow's UI opens it on its training runs rather than its GenAI traces view.
The run holds the run config as params, per round the aggregated and per-site
train loss and validation Dice, the round wall time and dropped replies (a site
that refused a request under its site policy also gets ``site/<name>/refused`` = 1),
each site's policy fingerprint as the param ``site/<name>/policy``, the metrics
a site withheld under its policy as the artifact ``rounds/round-NNN-withheld.json``
(``{site: "withheld by site policy (<rule>)"}``: no NaN metric), and at
the end the best and the final model, registered
(:mod:`app.tracking.federation_models`). The store is the tracking
URI of the run config, else ``MLFLOW_TRACKING_URI``; `make simulate` points it
at the project's sqlite file.

Rounds go through an :class:`~app.tracking.outbox.Outbox`: :meth:`record`
appends a round (to disk), :meth:`flush` sends what is pending in step order
with MLflow's HTTP retries off and a short request timeout
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES = 0``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``), and
never raises: while MLflow is unreachable a round costs at most one failed
request and its record waits for the next flush.

MLflow down at the start does not stop the federation either: :meth:`start`
asks once (bounded) and, without an answer, gives the federation an id of its
own and keeps the start as a :class:`~app.tracking.run_start.RunStart`
(``tracking-run.json``); the first flush that reaches MLflow opens the run
before it sends the rounds. :attr:`federation` is the federation's id (its
checkpoint folder), :attr:`run_id` its MLflow run (empty until opened); they
are the same when MLflow answered at the start.

MLflow refuses a name over 250 characters, with other characters than its own
rules allow, or that would resolve to another name as a path
(``mlflow.utils.validation``). A site's name is part of the product's metric
names (``site/<name>/val-dice``), so a reply could otherwise make MLflow refuse a
whole round: every metric and param name is checked before it is queued
(:func:`mlflow_name_problem`, :func:`without_refused_names`), those MLflow would
refuse are set aside with the reason (:meth:`Outbox.set_aside`), the rest of
the round goes on. A record MLflow refuses anyway (``INVALID_PARAMETER_VALUE``
or ``BAD_REQUEST``, not a connection error) is set aside the same way and the
flush goes on with the next one: no record blocks the rounds after it.

A federation that aggregated nothing is recorded as such. A round aggregated an
update when at least one train reply was accepted and the new global model
replaced the old one (:attr:`RoundReport.aggregation_failed` empty). When no
round did (every site refused, failed or was dropped in every round), the global
model is still the initial one: the ServerApp marks the MLflow run ``FAILED``,
registers nothing and raises :class:`FederationError` naming the drops counted
by policy rule (:func:`strategies.rounds.withheld.refused_rule`;
:func:`require_aggregation`: the run's ``refusals`` tag and ``refusals.json``).
A resumed federation is checked over all its rounds: the checkpoint counts the
rounds that aggregated before it (``ServerCheckpoint.aggregated_rounds``); one
written before they were counted is not checked.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from logging import DEBUG, WARNING
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import mlflow
from flwr.supercore import log
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import (
    MAX_ENTITY_KEY_LENGTH,
    bad_character_message,
    path_not_unique,
    validate_param_and_metric_name,
)

from app.tracking.outbox import OUTBOX_FILE, Outbox, RoundRecord
from app.tracking.run_start import RunStart, experiment_id, new_federation_id
from strategies.rounds.round_report import RoundReport
from strategies.rounds.withheld import refused_rule, withheld_text
from strategies.wire import message_keys as keys
from strategies.wire.errors import FederationError
from strategies.wire.personalisation_gain import PERSONALISED, personalisation_gains

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["DROPPED", "EXPERIMENT_TAGS", "FLUSH_TIMEOUT_SECONDS", "NO_REPLY", "REFUSALS_ARTIFACT",
           "REFUSALS_TAG", "FederationTracker", "aggregated_any", "bounded_requests",
           "metric_key", "mlflow_name_problem", "policy_params", "refusal_counts",
           "refusals_text", "require_aggregation", "round_aggregated", "round_record",
           "without_refused_names"]


_UNSAFE = re.compile(r"[^0-9A-Za-z_\-./ ]")

#: Seconds one MLflow request of a flush may take (MLflow's own default is 120 s,
#: with 7 retries and exponential backoff: minutes per call while it is down).
FLUSH_TIMEOUT_SECONDS = 5
#: The metric whose history tells which steps MLflow has (logged last in a step).
_STEP_MARKER = "round-seconds"
#: Tags of every experiment the product creates (or finds without them): MLflow's UI
#: opens such an experiment on its training runs, not on its GenAI traces view.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
#: MLflow error codes of a request it refuses (as opposed to one that never reached it).
_REFUSED = frozenset({"INVALID_PARAMETER_VALUE", "BAD_REQUEST"})
#: The run tag and the artifact that hold the counts of a run that aggregated nothing.
REFUSALS_TAG, REFUSALS_ARTIFACT = "refusals", "refusals.json"
#: The count of train replies dropped for a reason other than a policy rule.
DROPPED = "dropped"
#: The count of selected sites that sent no train reply before the round closed.
NO_REPLY = "no reply"


def metric_key(*parts: str) -> str:
    """MLflow-safe metric name such as ``site/hospital-00/val-dice``."""
    return "/".join(_UNSAFE.sub("_", p) for p in parts)


def mlflow_name_problem(name: str) -> str | None:
    """Why MLflow would refuse ``name`` as a metric or param name (``None``: it would not).

    MLflow's rules (``mlflow.utils.validation``): at most ``MAX_ENTITY_KEY_LENGTH``
    (250) characters, its allowed characters, and a path that does not normalise
    to another name.
    """
    shown = repr(name[:60]) + ("..." if len(name) > 60 else "")
    if len(name) > MAX_ENTITY_KEY_LENGTH:
        return (f"MLflow name rule: {shown} has {len(name)} characters, at most "
                f"{MAX_ENTITY_KEY_LENGTH}")
    if not validate_param_and_metric_name(name):
        return f"MLflow name rule: {shown}: {bad_character_message()}"
    if path_not_unique(name):
        return f"MLflow name rule: {shown} would resolve to another name as a path"
    return None


def without_refused_names(record: RoundRecord) -> tuple[RoundRecord, str] | None:
    """Move the metrics and params of ``record`` that MLflow would refuse out of it.

    Returns them as a record of their own with the reasons (``None``: none).
    """
    problems = {name: mlflow_name_problem(name) for name in [*record.metrics, *record.params]}
    refused = {name: problem for name, problem in problems.items() if problem is not None}
    if not refused:
        return None
    aside = RoundRecord(step=record.step, timestamp_ms=record.timestamp_ms,
                        metrics={k: record.metrics.pop(k) for k in refused
                                 if k in record.metrics},
                        params={k: record.params.pop(k) for k in refused
                                if k in record.params})
    return aside, "; ".join(sorted(set(refused.values())))


def _gains(values: Mapping[str, float]) -> dict[str, float]:
    """:func:`personalisation_gains` of ``values``; empty, without entering it, when they hold
    no personalised metric (a run without personalisation)."""
    if not any(name.startswith(PERSONALISED) for name in values):
        return {}
    return personalisation_gains(values)


def round_record(report: RoundReport) -> RoundRecord:
    """The MLflow metrics and JSON artifacts of one round."""
    step = report.server_round
    metrics: dict[str, float] = {"replies-accepted": float(len(report.train)),
                                 "replies-dropped": float(len(report.train_dropped)),
                                 "replies-late": float(report.missing.get("train", 0)),
                                 "late-arrivals": float(len(report.late_arrivals)),
                                 "strategy/schedule-tau": float(report.schedule_tau)}
    groups = [("strategy", report.strategy), ("train", report.train_aggregate),
              ("eval", report.evaluate_aggregate),
              ("eval", _gains(report.evaluate_aggregate))]
    for prefix, values in groups:
        metrics.update({metric_key(prefix, name): value for name, value in values.items()})
    for per_site in (report.train, report.evaluate, report.traffic, report.reply_seconds):
        for site, values in per_site.items():
            metrics.update({metric_key("site", site, name): value
                            for name, value in values.items()})
    for site, values in report.evaluate.items():  # personalised - global (personalisation)
        metrics.update({metric_key("site", site, name): value
                        for name, value in _gains(values).items()})
    metrics.update({metric_key("site", site, "failed"): 0.0 for site in report.train})
    metrics.update({metric_key("site", site, "failed"): 1.0 for site in report.train_dropped})
    for site, reason in {**report.evaluate_dropped, **report.train_dropped}.items():
        if keys.POLICY_RULE_PREFIX in reason:
            metrics[metric_key("site", site, "refused")] = 1.0
    for site, count in report.times_selected.items():
        metrics[metric_key("site", site, "times-selected")] = count
    for site, loss in report.selection.get("losses", {}).items():
        metrics[metric_key("site", site, "query-loss")] = loss
    metrics[_STEP_MARKER] = report.seconds  # last: its presence means the step is complete
    artifacts: dict[str, dict[str, Any]] = {}
    dropped = {f"train/{s}": r for s, r in report.train_dropped.items()}
    dropped.update({f"evaluate/{s}": r for s, r in report.evaluate_dropped.items()})
    if report.selection.get("candidates"):
        artifacts[f"rounds/round-{step:03d}-selection.json"] = report.selection
    if report.late_arrivals:
        dropped["late-arrivals"] = ", ".join(report.late_arrivals)
    if dropped:
        artifacts[f"rounds/round-{step:03d}-dropped.json"] = dropped
    if report.evaluate_withheld:
        artifacts[f"rounds/round-{step:03d}-withheld.json"] = {
            site: withheld_text(rules) for site, rules in sorted(report.evaluate_withheld.items())}
    return RoundRecord(step=step, timestamp_ms=int(time.time() * 1000),
                       metrics={k: float(v) for k, v in metrics.items()}, artifacts=artifacts)


def policy_params(report: RoundReport, known: dict[str, str]) -> dict[str, str]:
    """Params for the site-policy fingerprints of ``report`` not in ``known`` (updated).

    ``site/<name>/policy`` the first time a site is seen, then
    ``site/<name>/policy-round-<r>`` in a round where its fingerprint changed
    (an MLflow param cannot change its value).
    """
    params: dict[str, str] = {}
    for site, fingerprint in sorted(report.policies.items()):
        if known.get(site) == fingerprint:
            continue
        name = "policy" if site not in known else f"policy-round-{report.server_round}"
        params[metric_key("site", site, name)] = fingerprint
        known[site] = fingerprint
    return params


@contextmanager
def bounded_requests(timeout: int = FLUSH_TIMEOUT_SECONDS) -> Iterator[None]:
    """MLflow HTTP calls inside fail fast: no retries, ``timeout`` seconds per request.

    MLflow reads ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` and
    ``MLFLOW_HTTP_REQUEST_TIMEOUT`` at every request
    (``mlflow.utils.rest_utils.http_request``); the previous values are restored.
    """
    names = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout)}
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class FederationTracker:
    """Logs one federation to MLflow.

    Parameters
    ----------
    task : str
        Task name, used for the default experiment ``fedmed-<task>``.
    tracking_uri : str
        MLflow tracking URI; empty uses ``MLFLOW_TRACKING_URI`` or MLflow's default.
    artifact_root : str
        Artifact location for a newly created experiment (absolute path);
        empty lets the tracking server decide.
    experiment : str
        Experiment name; empty gives ``fedmed-<task>``.
    """

    def __init__(self, task: str, tracking_uri: str = "", artifact_root: str = "",
                 experiment: str = "") -> None:
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        if uri:
            mlflow.set_tracking_uri(uri)
        self.tracking_uri = mlflow.get_tracking_uri()
        self.experiment_name = experiment or f"fedmed-{task}"
        self.artifact_root = artifact_root
        try:  # bounded: a federation starts while MLflow is down (RunStart)
            with bounded_requests():
                self.experiment_id = experiment_id(self.experiment_name, artifact_root,
                                                   EXPERIMENT_TAGS)
        except Exception as exc:  # noqa: BLE001 - tracking must never stop the federation
            log(WARNING, "MLflow at %s not reachable (%s); the experiment '%s' is made when "
                "it answers", self.tracking_uri, type(exc).__name__, self.experiment_name)
            self.experiment_id = ""
        self.run_id = self.federation = ""
        self.run_start: RunStart | None = None
        self.outbox = Outbox()
        self._policies: dict[str, str] = {}

    @classmethod
    def of_run(cls, run_id: str, tracking_uri: str, experiment: str,
               outbox_dir: Path) -> FederationTracker:
        """The tracker of the existing run ``run_id`` with its outbox in ``outbox_dir``, made
        without asking MLflow anything (``make tracking-flush``, :mod:`app.tracking.flush`);
        a start still waiting in ``outbox_dir`` (``run_id`` empty) is opened by the flush."""
        tracker = cls.__new__(cls)
        tracker.tracking_uri, tracker.experiment_name = tracking_uri, experiment
        tracker.experiment_id, tracker.artifact_root = "", ""
        tracker.run_start = RunStart.load(outbox_dir)
        tracker.run_id = run_id or (tracker.run_start.mlflow_run_id if tracker.run_start else "")
        tracker.federation = Path(outbox_dir).name
        tracker.outbox = Outbox(Path(outbox_dir) / OUTBOX_FILE)
        tracker._policies = {}
        return tracker

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, str],
              outbox_dir: Path | None = None) -> str:
        """Open the federation's MLflow run and log its params; returns the federation's id.

        The id is the MLflow run's id; while MLflow does not answer it is one of
        our own (:func:`new_federation_id`) and the start waits as a
        :class:`RunStart` (in ``tracking-run.json`` once the outbox has a folder),
        opened by the first flush that reaches MLflow. ``outbox_dir`` (the
        federation's checkpoint folder) keeps rounds not yet in MLflow on disk;
        see :meth:`use_outbox` when it depends on the id.
        """
        self.run_start = RunStart("", self.experiment_name, self.artifact_root, run_name,
                                  {k: str(v) for k, v in params.items()}, dict(tags),
                                  dict(EXPERIMENT_TAGS))
        try:
            with bounded_requests():
                self.run_id = self.federation = self.run_start.open()
        except Exception as exc:  # noqa: BLE001 - the federation starts anyway
            self.run_id = self.run_start.mlflow_run_id  # set: opened, its params not sent
            self.run_start.federation = self.federation = self.run_id or new_federation_id()
            log(WARNING, "MLflow at %s not reachable (%s); federation %s starts without its "
                "MLflow run, which is opened when MLflow answers", self.tracking_uri,
                type(exc).__name__, self.federation)
        else:
            self.run_start = None  # opened: nothing waits
        if outbox_dir is not None:
            self.use_outbox(outbox_dir)
        return self.federation

    def use_outbox(self, folder: Path) -> None:
        """Keep pending rounds (and a start MLflow has not had) in ``folder`` from now on."""
        pending = self.outbox.pending
        self.outbox = Outbox(Path(folder) / OUTBOX_FILE)
        for record in pending:
            self.outbox.append(record)
        if self.run_start is not None:
            self.run_start.folder = Path(folder)
            self.run_start.save()

    def resume(self, run_id: str, after_round: int, flwr_run_id: str,
               outbox_dir: Path | None = None) -> str:
        """Reopen the federation ``run_id``'s MLflow run after a crash; returns ``run_id``.

        Rounds of the outbox past ``after_round`` (not checkpointed: they run
        again) and steps MLflow already has are dropped, so no step is logged
        twice; the others are sent now. A federation started while MLflow was
        down has its MLflow run in ``tracking-run.json`` (:class:`RunStart`), or,
        still not opened, keeps waiting for it.
        """
        self.federation = run_id
        resumed = {f"resumed-after-round-{after_round}": flwr_run_id, "flwr.run-id": flwr_run_id}
        self.run_start = None if outbox_dir is None else RunStart.load(outbox_dir)
        # Not opened, or opened and crashed before its params: the flush opens the rest.
        if self.run_start is not None and not self.run_start.params_sent:
            self.run_start.tags.update(resumed)  # sent with the run when MLflow answers
            self.run_start.save()
            self.outbox = Outbox(Path(outbox_dir) / OUTBOX_FILE)
            self.outbox.keep(after_round, set())
            self.flush()
            return run_id
        mlflow_run = self.run_start.mlflow_run_id if self.run_start else run_id
        self.run_start = None
        run = mlflow.start_run(run_id=mlflow_run)
        self.run_id = run.info.run_id
        mlflow.set_tags(resumed)
        if outbox_dir is not None:
            self.outbox = Outbox(Path(outbox_dir) / OUTBOX_FILE)
            history = MlflowClient(self.tracking_uri).get_metric_history(self.run_id,
                                                                         _STEP_MARKER)
            self.outbox.keep(after_round, {m.step for m in history})
            self.flush()
        return run_id

    def record(self, report: RoundReport) -> None:
        """Queue one round for MLflow (on disk before this returns)."""
        record = round_record(report)
        record.params = policy_params(report, self._policies)
        self.queue(record)

    def queue(self, record: RoundRecord) -> None:
        """Queue ``record`` for MLflow (on disk before this returns); the names MLflow
        would refuse are set aside first."""
        refused = without_refused_names(record)
        if refused is not None:
            self.outbox.set_aside(*refused)
        self.outbox.append(record)

    def keep_figure(self, record: RoundRecord, artifact: str, figure: Figure) -> None:
        """Save ``figure`` as the PNG that becomes ``artifact`` when ``record`` is sent."""
        path = self.outbox.file_for(record.step, artifact)
        figure.savefig(path)
        record.files[artifact] = str(path)

    def flush(self, timeout: int = FLUSH_TIMEOUT_SECONDS, quiet: bool = False) -> bool:
        """Send the pending rounds in order; ``True`` when none is left.

        Never raises and never retries: a failure (MLflow down, a store
        error) is logged (a warning; ``quiet``: at debug level, for a retry
        loop that warns once) and the rest waits for the next flush. A record
        MLflow refuses is set aside (:meth:`Outbox.set_aside`) and the flush
        goes on.
        """
        client, sent = MlflowClient(self.tracking_uri), 0
        pending = self.outbox.pending
        try:
            with bounded_requests(timeout):
                self._open_waiting_run()
                for record in pending:
                    try:
                        self._send(client, record)
                    except MlflowException as exc:
                        if exc.error_code not in _REFUSED:
                            raise
                        self.outbox.set_aside(record, f"{exc.error_code}: "
                                              f"{str(exc).splitlines()[0][:300]}")
                    sent += 1
        except Exception as exc:  # noqa: BLE001 - tracking must never stop the federation
            log(DEBUG if quiet else WARNING, "MLflow at %s not reachable (%s: %s); %d round(s) "
                "wait in %s",
                self.tracking_uri, type(exc).__name__, str(exc).splitlines()[0] if str(exc)
                else "", len(pending) - sent, self.outbox.path or "memory")
        finally:
            if sent:
                self.outbox.done(sent)
        return not self.outbox.pending and self.run_start is None

    def _open_waiting_run(self) -> None:
        """Open the MLflow run of a federation started while MLflow was down (raises what
        MLflow raises; the start keeps waiting then)."""
        if self.run_start is None:
            return
        self.run_id = self.run_start.open()
        self.run_start = None
        log(WARNING, "MLflow answers: federation %s is MLflow run %s from now on",
            self.federation, self.run_id)

    def _send(self, client: MlflowClient, record: RoundRecord) -> None:
        """Log one record: its params, tags, artifacts, tables and files, then its metrics
        (step marker last)."""
        self._log_params(client, record.params)
        if record.tags:
            client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in record.tags.items()])
        for artifact, content in record.artifacts.items():
            client.log_dict(self.run_id, content, artifact)
        for artifact, table in record.tables.items():
            client.log_table(self.run_id, table, artifact)
        for artifact, file in record.files.items():
            if not Path(file).is_file():
                log(WARNING, "%s (MLflow artifact %s) is gone; not sent", file, artifact)
                continue
            folder = PurePosixPath(artifact).parent.as_posix()
            client.log_artifact(self.run_id, file, None if folder == "." else folder)
        client.log_batch(self.run_id, metrics=[
            Metric(key, value, record.timestamp_ms, record.step)
            for key, value in record.metrics.items()])

    def _log_params(self, client: MlflowClient, params: dict[str, str]) -> None:
        """Log ``params``; one MLflow already holds with another value (after a resume) is skipped."""
        if not params:
            return
        try:
            client.log_batch(self.run_id, params=[Param(k, v) for k, v in params.items()])
        except MlflowException as exc:
            if exc.error_code != "INVALID_PARAMETER_VALUE":
                raise
            log(WARNING, "MLflow keeps the first value of %s (%s)", sorted(params),
                str(exc).splitlines()[0] if str(exc) else "")

    def log_round(self, report: RoundReport) -> None:
        """Record one round and send what is pending (:meth:`record` + :meth:`flush`)."""
        self.record(report)
        self.flush()

    def finish(self, status: str = "FINISHED") -> None:
        """Send what is pending and close the run with ``FINISHED`` or ``FAILED``.

        With MLflow unreachable the run stays open and the rounds stay in the
        outbox (a resume sends them); nothing raises.
        """
        if mlflow.active_run() is None and self.run_start is None:
            return
        if not self.flush():
            log(WARNING, "MLflow run %s left open: %d round(s) not sent, kept in %s",
                self.run_id, len(self.outbox.pending), self.outbox.path or "memory")
            return
        try:
            with bounded_requests():
                mlflow.end_run(status=status)
        except Exception as exc:  # noqa: BLE001 - the federation's result is already safe
            log(WARNING, "could not close MLflow run %s (%s)", self.run_id, exc)


def round_aggregated(report: RoundReport) -> bool:
    """Whether the round accepted a train reply and updated the global model."""
    return bool(report.train) and not report.aggregation_failed


def aggregated_any(reports: Mapping[int, RoundReport]) -> bool:
    """Whether any round accepted a train reply and updated the global model."""
    return any(round_aggregated(report) for report in reports.values())


def refusal_counts(reports: Mapping[int, RoundReport]) -> dict[str, int]:
    """Dropped train replies over all rounds, by policy rule (``dropped``: no rule named;
    ``no reply``: a selected site that never answered), in name order."""
    counts: Counter[str] = Counter()
    for report in reports.values():
        for reason in report.train_dropped.values():
            counts[refused_rule(reason) or DROPPED] += 1
        counts[NO_REPLY] += report.missing.get("train", 0)
    return {rule: count for rule, count in sorted(counts.items()) if count}


def refusals_text(counts: Mapping[str, int]) -> str:
    """``apps: 2, min-batch-size: 1`` (``none``: no drop recorded)."""
    return ", ".join(f"{rule}: {count}" for rule, count in counts.items()) or "none"


def require_aggregation(reports: Mapping[int, RoundReport], earlier: int | None = 0) -> None:
    """Raise :class:`FederationError` when no round of the federation aggregated an update:
    none of ``reports`` and none of the ``earlier`` rounds (a resume's checkpointed rounds
    that aggregated; ``None``: not counted, then nothing is checked).

    The active MLflow run first gets the counts as its ``refusals`` tag and
    ``refusals.json`` artifact (bounded requests; an unreachable store is a
    warning, never a different error).

    Raises
    ------
    FederationError
        Naming the rounds run and the train drops counted by rule.
    """
    if earlier is None or earlier > 0 or aggregated_any(reports):
        return
    counts = refusal_counts(reports)
    text = refusals_text(counts)
    try:
        if mlflow.active_run() is not None:  # set_tag would otherwise start a run of its own
            with bounded_requests():
                mlflow.set_tag(REFUSALS_TAG, text)
                mlflow.log_dict(counts, REFUSALS_ARTIFACT)
    except Exception as exc:  # noqa: BLE001 - the FederationError below is what matters
        log(WARNING, "could not record the refusals in MLflow (%s)", exc)
    raise FederationError(
        f"no round aggregated any update in {len(reports)} round(s): every train reply was "
        f"refused, failed or dropped (by rule: {text}); nothing registered")
