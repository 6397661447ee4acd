"""One message through the hospital's runtime: admitted, charged, run sandboxed, filtered, settled.

The site runner (:mod:`app.site_runtime.site_runner`) has pulled the message and
checked the app bundle against ``[apps]``; :meth:`RuntimeRound.answer` then does, with
the hospital's own code and nothing the bundle can change:

1. **decide** (:func:`app.site_runtime.runtime_gate.admit`): every data rule of the
   policy; a refusal names the rule and the worker never sees the message;
2. **charge** (:func:`app.site_runtime.runtime_ledger.reserve`): the DP-SGD
   computation the message asks for, before the worker runs (``dp.max-epsilon``);
3. **run** the approved app's ClientApp in its warm worker, in the sandbox
   (:mod:`app.site_runtime.sandbox`; fail closed: without bubblewrap no worker starts
   unless the policy says ``sandbox = "off"``), handed only its own view of the site
   (:mod:`app.site_runtime.worker_view`);
4. **filter** the reply (:class:`app.site_runtime.egress_filter.EgressFilter`): a reply
   that breaks a rule is replaced by a refusal naming it; metrics the policy withholds
   are removed (``withheld`` names the rule); the site record's name and policy
   fingerprint are the runtime's;
5. **settle** the ledger: the reply's ``epsilon`` metrics are the runtime's; a reply
   that did not leave releases the reservation.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Error, Message
from flwr.common.constant import SubStatus

from app.config.site_config import SiteConfig
from app.site_errors import error_reply
from app.site_runtime.dataset_census import DatasetCensus
from app.site_runtime.egress_filter import EgressFilter, refusal_reply
from app.site_runtime.installed_app import worker_env
from app.site_runtime.runtime_gate import Admission, SiteFacts, admit
from app.site_runtime.runtime_ledger import Reservation, reserve
from app.site_runtime.sandbox import (SandboxLimits, WorkerMounts, bubblewrap,
                                      sandboxed_command, SANDBOX_SCRIPT, worker_owner)
from app.site_runtime.supernode import SITE_INDEX_FILES
from app.site_runtime.worker_pool import WORKER_SCRIPT, WorkerLaunch, WorkerPool, plain_launch
from app.site_runtime.worker_view import (policy_files, prepare_worker_state, returned_context,
                                          runtime_dir, worker_context, worker_policy_path,
                                          worker_state_dir, write_worker_policy)
from clients.site.policy import SitePolicy, load_policy
from strategies.wire import message_keys as keys
from strategies.wire.errors import FedMedError
from strategies.wire.personalisation_gain import PERSONALISED

__all__ = ["RuntimeAnswer", "RuntimeRound"]

log = logging.getLogger("fedmed.site_runner")

#: The counts a reply keeps when ``min-val-items`` withholds its metrics.
_COUNTS = frozenset({keys.NUM_EXAMPLES, keys.VAL_STUDIES, keys.TEST_STUDIES})


@dataclass
class RuntimeAnswer:
    """The reply to push, its context and status, and what the ledger was charged."""

    reply: Message
    context: Context
    status: str
    details: str
    epsilon: float = 0.0
    #: Seconds of the worker's round trip and of the egress filter (None: not run).
    worker_s: float | None = None
    egress_s: float | None = None

    def parts(self) -> str:
        """`` (worker W s, egress E s)`` for the site's log line ("" when neither ran)."""
        parts = [f"{name} {seconds:.3f} s" for name, seconds in
                 (("worker", self.worker_s), ("egress", self.egress_s)) if seconds is not None]
        return f" ({', '.join(parts)})" if parts else ""


def _failed(message: Message, context: Context, site: str, kind: str) -> RuntimeAnswer:
    reason = f"site {site}: {kind} (details in the site's log)"
    return RuntimeAnswer(Message(Error(code=keys.WORKER_FAILURE_CODE, reason=reason),
                                 reply_to=message), context, SubStatus.FAILED, kind)


def _refused(message: Message, context: Context, exc: Exception) -> RuntimeAnswer:
    return RuntimeAnswer(error_reply(message, context, exc), context, SubStatus.FAILED,
                         type(exc).__name__)


def _withhold(reply: Message, withheld: dict[str, str]) -> None:
    """Remove the metrics ``withheld`` covers (prefix "": all but the counts); name the rules."""
    if not withheld or not reply.has_content() or keys.METRICS not in reply.content:
        return
    metrics = reply.content[keys.METRICS]
    removed = set()
    for rule, prefix in withheld.items():
        names = [name for name in metrics if (name.startswith(prefix) if prefix
                                              else name not in _COUNTS)]
        for name in names:
            del metrics[name]
        if names:
            removed.add(rule)
    if removed:
        site = reply.content[keys.SITE] if keys.SITE in reply.content else ConfigRecord()
        said = {rule for rule in str(site.get(keys.WITHHELD, "")).split(",") if rule}
        site[keys.WITHHELD] = ",".join(sorted(said | removed))
        reply.content[keys.SITE] = site


def data_version(data_path: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, mtime in ns, size) of the site folder's index files (manifest.csv, images.csv,
    ...): a warm worker that loaded another version of them reads the data again (issue 47,
    walkthrough 5: an edited manifest was ignored until the SuperNode restarted)."""
    version = []
    for name in sorted(SITE_INDEX_FILES):
        try:
            stat = (Path(data_path) / name).stat()
        except OSError:
            continue
        version.append((name, stat.st_mtime_ns, stat.st_size))
    return tuple(version)


def worker_key(fab_hash: str, task: str, data_path: Path, sandbox: str) -> tuple:
    """The warm worker a message goes to: bundle, task, data folder, sandbox mode, and the
    version of the data's index files (:func:`data_version`)."""
    return (fab_hash, task, str(data_path), sandbox, data_version(data_path))


class RuntimeRound:
    """The runtime's part of every message (see the module docstring).

    Parameters
    ----------
    limits : SandboxLimits
        What a sandboxed worker may use.
    """

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.egress = EgressFilter()
        self._census: dict[Path, DatasetCensus] = {}
        self._prepared: set[tuple[Path, str]] = set()
        #: (state dir, the policy's fingerprint) -> the fingerprint of the worker's copy.
        self._copies: dict[tuple[Path, str], str] = {}

    def census(self, state_dir: Path) -> DatasetCensus:
        """The dataset counts kept in ``state_dir``'s runtime folder."""
        key = Path(state_dir).resolve()
        if key not in self._census:
            self._census[key] = DatasetCensus(runtime_dir(key))
        return self._census[key]

    def _launch(self, node: SiteConfig, policy: SitePolicy, app_dir: Path,
                policy_copy: Path) -> WorkerLaunch:
        if policy.sandbox == "off":
            return plain_launch(worker_env())
        bubblewrap()  # fail closed: SandboxUnavailable when it is missing
        mounts = WorkerMounts(node.data_path, node.state_dir, worker_state_dir(node.state_dir),
                              app_dir, app_dir.parent.parent, policy_copy, WORKER_SCRIPT)

        def command(fd: int) -> list[str]:
            return sandboxed_command([sys.executable, SANDBOX_SCRIPT, "--fd", str(fd)],
                                     mounts, self.limits, worker_env())

        return WorkerLaunch(command, None, "sandboxed")

    def _prepare(self, node: SiteConfig, policy: SitePolicy) -> Path:
        """The worker's state folder and policy copy, ready for ``policy``'s sandbox mode."""
        key = (Path(node.state_dir).resolve(), policy.sandbox)
        if key not in self._prepared:
            owner = worker_owner(self.limits) if policy.sandbox == "on" else None
            prepare_worker_state(node.state_dir, owner)
            self._prepared.add(key)
        copy = worker_policy_path(node.state_dir)
        written = (key[0], policy.fingerprint)
        if written not in self._copies:  # once per policy in force, not per message
            write_worker_policy(node.state_dir, policy)
            self._copies[written] = load_policy(copy).fingerprint  # what its replies name
        return copy

    def answer(self, message: Message, context: Context, policy: SitePolicy, site: str,
               app_dir: Path, job: dict[str, Any], pool: WorkerPool) -> RuntimeAnswer:
        """The reply to ``message`` (see the module docstring); ``job`` holds the worker job's
        ids (without the message and context), ``pool`` the warm workers."""
        try:
            node = SiteConfig.from_node_config(context.node_config, data_root="")
            facts = SiteFacts(node.name, node.data_path, node.state_dir, node.local_steps_cap)
            admission = admit(message, context, policy, facts, self.census(node.state_dir))
            reservation = (reserve(node.state_dir, node.data_path, policy, admission.spend,
                                   admission.examples, admission.federation)
                           if admission.spend is not None else None)
        except FedMedError as exc:  # a refusal names its rule; the worker never sees it
            return _refused(message, context, exc)
        try:
            answer = self._run(message, context, policy, site, node, app_dir, job, pool,
                               admission)
        except BaseException:
            if reservation is not None:
                reservation.cancel()
            raise
        return self._settle(answer, admission, reservation, site)

    def _run(self, message: Message, context: Context, policy: SitePolicy, site: str,
             node: SiteConfig, app_dir: Path, job: dict[str, Any], pool: WorkerPool,
             admission: Admission) -> RuntimeAnswer:
        try:
            policy_copy = self._prepare(node, policy)
            launch = self._launch(node, policy, app_dir, policy_copy)
        except FedMedError as exc:
            log.error("site %s: no worker can start: %s", site, exc)
            return _failed(message, context, site, type(exc).__name__)
        worker = worker_context(context, node.state_dir, policy_copy, policy_files(policy))
        key = worker_key(job["fab_hash"], str(context.run_config.get("task", "")),
                         node.data_path, policy.sandbox)
        if pool.retire(lambda k: k[:4] == key[:4] and k != key):
            log.warning("site %s: the data's index file changed since its warm worker loaded "
                        "it: the worker was stopped and the data is read again", site)
        started = time.monotonic()
        outcome = pool.run(key, {**job, "message": message, "context": worker}, launch)
        worker_s = time.monotonic() - started
        if outcome[0] != "done":
            kind = {"failed": outcome[1], "crashed": "WorkerCrashed",
                    "timeout": "WorkerTimeout"}[outcome[0]]
            failed = _failed(message, context, site, kind)
            failed.worker_s = worker_s
            return failed
        reply = outcome[1]
        context = returned_context(context, outcome[2])
        started = time.monotonic()
        copied = self._copies[(Path(node.state_dir).resolve(), policy.fingerprint)]
        verdict = self.egress.check(message, reply, context, copied)
        egress_s = time.monotonic() - started
        if not verdict.passed:
            log.warning("site %s: a %s reply was stopped at the egress filter: %s (%s)", site,
                        message.metadata.message_type, verdict.rule, verdict.detail)
            return RuntimeAnswer(refusal_reply(message, site, verdict), context,
                                 SubStatus.FAILED, verdict.rule, worker_s=worker_s,
                                 egress_s=egress_s)
        if reply.has_content():
            _withhold(reply, admission.withheld)
            record = reply.content[keys.SITE] if keys.SITE in reply.content else ConfigRecord()
            record[keys.SITE_NAME] = site
            record[keys.SITE_POLICY] = policy.fingerprint
            reply.content[keys.SITE] = record
        return RuntimeAnswer(reply, context, SubStatus.COMPLETED, "", worker_s=worker_s,
                             egress_s=egress_s)

    @staticmethod
    def _settle(answer: RuntimeAnswer, admission: Admission,
                reservation: Reservation | None, site: str) -> RuntimeAnswer:
        if reservation is None:
            return answer
        reply = answer.reply
        metrics = (reply.content[keys.METRICS]
                   if reply.has_content() and keys.METRICS in reply.content else None)
        released = metrics is not None and (admission.spend.kind != "evaluate-adapt" or any(
            name.startswith(PERSONALISED) for name in metrics))
        if not released:
            reservation.cancel()
            return answer
        examples = metrics.get(keys.NUM_EXAMPLES)  # a train reply's count may raise q
        trained = admission.spend.kind != "evaluate-adapt" and isinstance(examples, (int, float))
        charged = reservation.settle(int(examples) if trained else None)
        for name, value in charged.items():
            metrics[name] = float(value)
        answer.epsilon = float(reservation.charged or 0.0)
        log.info("site %s: the ledger was charged epsilon %.4g (%s, %d steps)", site,
                 answer.epsilon, admission.spend.kind, admission.spend.steps)
        return answer
