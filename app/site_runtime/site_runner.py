"""The hospital's site runner: only approved apps run, in warm workers.

Flower 1.42's SuperNode in ``--isolation process`` mode serves its Runtime API
and runs nothing itself; an executor must acquire each task and run it. Flower's
own executor (``flower-superexec``) starts one ``flwr-clientapp`` process per
message that installs and imports whatever bundle (FAB) the run uploaded. This
runner replaces it at a hospital, in a process the hospital starts
(:mod:`app.site_runtime.site_node`):

1. acquire a ClientApp task (token) from the SuperNode's Runtime API;
2. pull the message, the run's context and the FAB;
3. check that the node config names the runner's policy file
   (:mod:`app.site_runtime.one_policy`: one file for apps and data), then the
   FAB against that policy's ``[apps]`` rules
   (:func:`app.site_runtime.app_approval.check_app`: approved sha256, or a
   signature by a key the hospital trusts) *before* anything of it is installed
   or imported; an unapproved FAB gets an error reply naming the rule and the
   first 12 hex digits of its hash, and nothing of it runs;
4. install an approved FAB, or check its install against the FAB
   (:mod:`app.site_runtime.installed_app`: an install that differs is logged,
   its workers are stopped and it is installed afresh), and hand the message to
   the runtime's round (:mod:`app.site_runtime.runtime_round`): every data rule
   checked by the runtime, the privacy ledger charged, the warm worker of (FAB,
   imaging task, site) run in its sandbox (:mod:`app.site_runtime.site_worker`,
   :mod:`app.site_runtime.sandbox`), the reply filtered before it leaves;
5. push the reply and the task's final status.

Before the first message of each run (and when the site node starts,
:func:`expire_state`) the federation state folders untouched for longer than
the node option ``state-retention-days`` are removed
(:mod:`clients.site.state_retention`), and a site whose dataset is a PACS cohort syncs
it under the policy's ``[pacs]`` rules (:mod:`app.site_runtime.pacs_sync`; a refusal
holds for every message of the run).

A worker that dies is answered for (an error reply with the fixed code
:data:`~strategies.wire.message_keys.WORKER_FAILURE_CODE`) and started afresh on the
next message. At most ``max_workers`` workers live at once; the least recently
used one is stopped to make room.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

from flwr.app import Context, Error, Message
from flwr.common.constant import SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
)
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from app.site_runtime.app_approval import SIGNATURE_KEY, AppNotApproved, check_app
from app.site_runtime.audit_record import message_record
from app.site_runtime.egress_records import policy_rules
from app.site_runtime.installed_app import verified_install
from app.site_runtime.node_signals import NodeSignals
from app.site_runtime.one_policy import policy_mismatch
from app.site_runtime.pacs_sync import CohortSyncs
from app.site_runtime.site_audit import SiteAudit
from app.site_runtime.runtime_gate import QUERIES_DIR
from app.site_runtime.runtime_round import RuntimeAnswer, RuntimeRound
from app.site_runtime.sandbox import SandboxLimits
from app.site_runtime.worker_pool import WorkerPool
from app.site_runtime.worker_view import runtime_dir, worker_state_dir
from app.site_runtime.runtime_channel import (
    pull_task_input,
    runtime_retry_invoker,
    task_heartbeat_fn,
    withdrawn,
)
from app.config.site_config import SiteConfig
from clients.site.policy import AuditRules, PolicyRefusal, SitePolicy, load_policy
from clients.site.state_retention import expire_federation_states
from app.tooling.errors import FlowerProcessError
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError

__all__ = ["SiteRunner", "expire_state"]

log = logging.getLogger("fedmed.site_runner")

def _site(context: Context) -> str:
    return str(context.node_config.get("site-name", f"node-{context.node_id}"))


def expire_state(node_config: Any) -> list[Path]:
    """Apply the state-retention rule to the state dir of ``node_config``; logs what it removed.

    Raises
    ------
    app.config.site_config.SiteConfigError
        The node config has no data-path or a bad ``state-retention-days``.
    """
    node = SiteConfig.from_node_config(node_config, data_root="")
    removed = [path for folder in (worker_state_dir(node.state_dir),
                                   runtime_dir(node.state_dir) / QUERIES_DIR, node.state_dir)
               for path in expire_federation_states(folder, node.state_retention_days)]
    if removed:
        log.info("site %s: removed the state of %d federation(s) untouched for more than %g days "
                 "(state-retention-days): %s", node.name, len(removed), node.state_retention_days,
                 ", ".join(path.name for path in removed))
    return removed


def _broken_rule(error: ConfigError) -> tuple[str, str]:
    """The policy rule a policy file's error names (``'min-val-items' must be ...``) and
    what is wrong with it, told to the coordinator instead of the file's path (issue 47,
    walkthrough 7); ("", the error's kind) when it names no key."""
    named = re.findall(r"'([a-z0-9.-]+)'", str(error).split("; known:")[0])
    known = policy_rules()
    rule = next((name for name in named if name in known), "")
    if rule:
        return rule, f"its {rule!r} is invalid"
    return "", f"unknown key {named[0]!r}" if named else type(error).__name__


def _refusal(message: Message, context: Context, site: str, rule: str, why: str
             ) -> RuntimeAnswer:
    """The error reply, context and failed status of a message refused under ``rule``."""
    reason = f"site {site}: {keys.POLICY_RULE_PREFIX}{rule} (refused): {why}"
    return RuntimeAnswer(Message(Error(code=keys.APP_REFUSAL_CODE, reason=reason),
                                 reply_to=message), context, SubStatus.FAILED, why)


class SiteRunner:
    """The hospital's executor for its SuperNode's ClientApp tasks.

    Parameters
    ----------
    runtime_api_address : str
        ``host:port`` of the SuperNode's Runtime API (loopback).
    policy_path : Path
        The site policy (its ``[apps]`` rules decide which bundles run); read on
        every message so that an edit needs no restart. Required: every
        message's node config must name this same file (its data rules).
    poll_interval : float
        Seconds between two asks for a task when there is none (with ``signals``:
        the longest such wait, the SuperNode's task signal ends it at once).
    max_workers : int
        Warm workers kept at once (:class:`WorkerPool`).
    signals : NodeSignals, optional
        Wake-ups shared with the SuperNode of this process (:mod:`app.site_runtime.site_node`):
        a new task, a received message, and (set here) a stored reply.
    node : SiteConfig, optional
        The node's own config (its name and state dir): the node status the console
        shows is written there (:mod:`app.site_runtime.site_audit`). Each message is
        audited in the state dir of its node config (the same one in a deployment).
    """

    def __init__(self, runtime_api_address: str, policy_path: Path | None,
                 poll_interval: float = 0.05, max_workers: int = 2,
                 signals: NodeSignals | None = None, node: SiteConfig | None = None,
                 limits: SandboxLimits | None = None, job_timeout: float | None = None
                 ) -> None:
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        if policy_path is None:
            raise FlowerProcessError("the site runner needs the site policy file "
                                     "(site_node --policy /abs/policy.toml)")
        self.address = runtime_api_address
        self.policy_path = Path(policy_path)
        self.poll_interval = poll_interval
        self.pool = WorkerPool(max_workers, job_timeout)
        self.runtime = RuntimeRound(limits)
        self.signals = signals
        self._installed: set[str] = set()
        self._runs: set[int] = set()
        self.cohorts = CohortSyncs(self.runtime.limits)
        self._audits: dict[Path, SiteAudit] = {}
        self._approvals: dict[str, str] = {}  # message id -> how its bundle was approved
        self.node_audit = None if node is None else self._audit_at(node.state_dir, node.name)
        if self.node_audit is not None:
            policy = self._policy()
            self.node_audit.node_started(policy.fingerprint, policy.audit)

    def _audit_at(self, state_dir: Path, site: str) -> SiteAudit:
        key = Path(state_dir).resolve()
        if key not in self._audits:
            try:
                anchoring = self._policy().audit
            except ConfigError:  # an unreadable policy: the message is refused, still audited
                anchoring = AuditRules()
            self._audits[key] = SiteAudit(key, site, anchoring)
        return self._audits[key]

    def _audit_of(self, context: Context) -> SiteAudit | None:
        """The audit of the message's node config (None for a node config without data-path)."""
        try:
            node = SiteConfig.from_node_config(context.node_config, data_root="")
        except ConfigError:
            return self.node_audit
        return self._audit_at(node.state_dir, node.name)

    def _client(self, token: str | None = None) -> RuntimeHttpClient:
        interceptors: list = [RuntimeVersionHttpInterceptor(
            component_name="flwr-clientapp" if token else "SuperExec")]
        if token:
            interceptors.append(RuntimeTokenHttpInterceptor(token))
        return RuntimeHttpClient.from_server_address(
            server_address=self.address, insecure=True, root_certificates=None,
            interceptors=interceptors,
            retry_invoker=runtime_retry_invoker())

    def _policy(self) -> SitePolicy:
        return load_policy(self.policy_path)

    def serve(self, stop: threading.Event) -> None:
        """Acquire and answer ClientApp tasks until ``stop`` is set."""
        client = self._client()
        request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value])
        try:
            while not stop.is_set():
                if self.signals is not None:
                    self.signals.task_created.clear()  # a task created from now on wakes us
                try:
                    response = client.AcquireTask(request)
                except Exception as exc:  # pylint: disable=broad-exception-caught
                    log.warning("site runner: the SuperNode's Runtime API is not answering "
                                "(%s); retrying", type(exc).__name__)
                    if self.node_audit is not None:
                        self.node_audit.status(reached=False, force=True)
                    stop.wait(1.0)
                    continue
                if self.node_audit is not None:
                    self.node_audit.status(reached=True)
                if response.HasField("task") and response.token:
                    self.handle(response.token)
                else:
                    (stop if self.signals is None else self.signals.task_created).wait(
                        self.poll_interval)
        finally:
            client.close()
            self.close()

    def close(self) -> None:
        """Stop the workers and anchor every audit log's head (the node stops)."""
        self.pool.close()
        for audit in self._audits.values():
            audit.anchor_now()

    def handle(self, token: str) -> None:
        """Pull one task, answer it (or refuse its app) and push the reply and status.

        A task the SuperNode withdraws meanwhile (its run stopped; see
        :mod:`app.site_runtime.runtime_channel`) is dropped with one log line.
        """
        client = self._client(token)
        gone = threading.Event()
        heartbeat = HeartbeatSender(task_heartbeat_fn(client, gone))
        heartbeat.start()
        context = None
        audited: tuple | None = None
        line: tuple | None = None  # the message's log line, written after its audit
        try:
            started = time.monotonic()
            message, context, run, fab = pull_task_input(client, self.signals)
            pulled = time.monotonic()
            answer = self._answer(message, context, run, fab)
            answered = time.monotonic()
            fab_hash = fab.hash_str if fab is not None else ""  # a run without a bundle
            context = answer.context
            audited = (message, answer.reply, context, fab_hash, answered - pulled,
                       answer.epsilon)
            push_message(client, answer.reply, context)
            if self.signals is not None:
                self.signals.reply_stored.set()
            push_task_output(client, context, answer.status, answer.details)
            line = ("site %s: %s message: pull %.3f s%s, answer %.3f s%s, push %.3f s",
                    _site(context), message.metadata.message_type, pulled - started,
                    self._receipt(message.metadata.message_id, started), answered - pulled,
                    answer.parts(), time.monotonic() - answered)
        except Exception as exc:  # pylint: disable=broad-exception-caught
            if withdrawn(exc) or gone.is_set():
                log.warning("site runner: a task was dropped: %s",
                            exc if withdrawn(exc) else "the SuperNode withdrew it")
            else:
                log.exception("site runner: task failed before a reply could be sent")
                push_task_output(client, context, SubStatus.FAILED, type(exc).__name__)
            if audited is not None:  # answered, but the reply did not leave
                audited = (*audited[:1], Message(Error(code=keys.WORKER_FAILURE_CODE,
                                                       reason="reply not delivered"),
                                                 reply_to=audited[0]), *audited[2:])
        finally:
            heartbeat.stop()
            client.close()
            if audited is not None:
                audit_started = time.monotonic()
                self.audit(*audited)
                if line is not None:
                    log.info(line[0] + ", audit %.3f s", *line[1:],
                             time.monotonic() - audit_started)

    def audit(self, message: Message, reply: Message, context: Context, fab_hash: str,
              seconds: float, epsilon: float) -> dict[str, Any] | None:
        """Append the audit record of ``message`` and the ``reply`` that left (or did not).

        Written after the reply is pushed, so that its fsync never delays a round;
        returns the record as written (None when the node config names no state dir or
        the log cannot be written, said loudly in the site's log).
        """
        approval = self._approvals.pop(message.metadata.message_id, None)
        audit = self._audit_of(context)
        if audit is None:
            return None
        return audit.message(message_record(message, reply, context, fab_hash, seconds,
                                            epsilon, approval))

    def _cohort_refusal(self, run_id: int, context: Context, policy: SitePolicy
                        ) -> PolicyRefusal | None:
        """The sync of the site's PACS cohort at the run's first message (``None``: the
        message may go on, or the data is a folder); the refusal of every message of a run
        whose cohort a ``[pacs]`` rule refused."""
        try:
            node = SiteConfig.from_node_config(context.node_config, data_root="")
        except ConfigError:  # the runtime's round answers a bad node config itself
            return None
        return self.cohorts.for_run(run_id, context.node_config, node.state_dir, policy,
                                    self._audit_of(context))

    def _receipt(self, message_id: str, started: float) -> str:
        """`` (receipt X s)``: when, after the pull started, the SuperNode had every object."""
        received = self.signals.received_at(message_id) if self.signals else None
        return "" if received is None else f" (receipt {max(0.0, received - started):.2f} s)"

    def _answer(self, message: Message, context: Context, run: Any, fab: Any
                ) -> RuntimeAnswer:
        site = _site(context)
        mismatch = policy_mismatch(self.policy_path, context.node_config)
        if mismatch is not None:
            log.warning("site %s refused a message: %s", site, mismatch)
            return _refusal(message, context, site, "policy-path",
                            "the node config names another site policy file than the site "
                            "runner's, or none (details in the site's log)")
        signature = str(context.run_config.get(SIGNATURE_KEY, ""))
        try:
            policy = self._policy()
            audit = self._audit_of(context)
            if audit is not None:
                audit.policy_in_force(policy.fingerprint, policy.audit)
            how = check_app(policy.apps, fab.hash_str, fab.content, signature)
            self._approvals[message.metadata.message_id] = how
        except AppNotApproved as refusal:
            log.warning("site %s refused app %s: %s", site, fab.hash_str[:12], refusal)
            return _refusal(message, context, site, "apps", str(refusal))
        except ConfigError as refusal:  # its text names the file: it stays in the log
            log.warning("site %s refused app %s: %s", site, fab.hash_str[:12], refusal)
            rule, what = _broken_rule(refusal)
            return _refusal(message, context, site, rule or "apps",
                            f"the site policy cannot be read: {what} (details in the site's "
                            "log)")
        app_dir, changed = verified_install(fab.content)
        if changed:
            self.pool.discard(fab.hash_str)
            log.warning("site %s: the install of app %s differed from the approved bundle (%s); "
                        "its workers were stopped and it was re-installed from the bundle",
                        site, fab.hash_str[:12], ", ".join(changed[:10]))
        if fab.hash_str not in self._installed:
            self._installed.add(fab.hash_str)
            log.info("site %s installed app %s (approved by %s)", site, fab.hash_str[:12], how)
        if run.run_id not in self._runs:
            self._runs.add(run.run_id)
            try:
                expire_state(context.node_config)
            except ConfigError as exc:  # the runtime answers a bad node config itself
                log.warning("site %s: federation state not expired: %s", site, exc)
        refused = self._cohort_refusal(run.run_id, context, policy)
        if refused is not None:
            return _refusal(message, context, site, refused.rule, refused.detail)
        job = {"task_id": TaskIdentity.task_id, "run_id": run.run_id, "node_id": context.node_id,
               "fab_id": run.fab_id, "fab_version": run.fab_version, "fab_hash": fab.hash_str}
        return self.runtime.answer(message, context, policy, site, Path(app_dir), job,
                                   self.pool)
