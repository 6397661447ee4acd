"""The malicious-app suite: an approved bundle tries to own the site, and the runtime stops it.

Issue #44's threat model: the coordinator is malicious and its bundle was approved (here:
by its sha256 in the policy's ``[apps]``). The bundle is the product's own, with one
module added (``app/malice.py``) and ``app/client_app.py``'s round wrapped by it, so
every attempt runs in the genuine ClientApp, in the real site runner
(:class:`app.site_runtime.site_runner.SiteRunner`, its ``_answer`` and ``audit``: the
SuperNode's transport is left out), in the sandbox, on a small synthetic radiograph
site. Each attempt (:data:`ATTEMPTS`) is a train message whose ``attack`` entry names
what the bundle tries:

* from inside the worker: open an outbound socket, read another dataset, read the
  policy file, read the runner's environment, write the privacy ledger, write the audit
  log, write the runtime's installed code, fork without end, allocate past the memory
  limit; what the bundle saw is written to its own state folder (``probe-<attack>.json``);
* in the reply: an extra array, text in a metric's name, ten times the declared
  bytes, more steps than asked without DP;
* through the instruction: the cross-site fine-tune where the policy keeps the fine-tuned
  model (the bundle's own policy check is edited to let it through).

:func:`run_suite` returns one row per attempt: what happened, the rule named, and whether
the ledger and the audit chain are intact afterwards. ``tests/app/test_malicious_app.py``
asserts every row in CI; ``python -m tests.app.malicious_suite`` prints the table. It lives
with the tests, not in bench/: it measures no cost, it drives the site runner's own
``_answer`` and ``audit`` (the site runtime is what it tests, which the in-process engine
leaves out).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import socket
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from app.config.site_config import SiteConfig  # noqa: E402
from app.site_runtime.app_approval import fab_sha256, project_fab  # noqa: E402
from app.site_runtime.audit_chain import verify_chain  # noqa: E402
from app.site_runtime.sandbox import SandboxLimits  # noqa: E402
from app.site_runtime.site_runner import SiteRunner  # noqa: E402
from clients.cxr_cls.synthetic import generate_site, site_profiles  # noqa: E402
from clients.registry import task_class  # noqa: E402
from clients.site.privacy_ledger import PrivacyLedger  # noqa: E402
from clients.site.instruction import SiteRunSettings  # noqa: E402
from strategies.wire import message_keys as keys  # noqa: E402
from strategies.rounds.instructions import pack_arrays  # noqa: E402

__all__ = ["ATTEMPTS", "Attempt", "Row", "Suite", "run_suite", "main"]

#: The bundle's added module: each attack, then the genuine round, then the reply's attack.
MALICE = r'''
"""What a malicious bundle tries (the malicious-app suite, tests/app/malicious_suite.py)."""
import json, os, signal, socket
from pathlib import Path
import numpy as np
from flwr.app import Array
from strategies.wire import message_keys as keys


def _inside(name, target):
    if name == "socket":
        try:
            socket.create_connection(("127.0.0.1", int(target)), timeout=3).close()
            return "connected"
        except OSError as exc:
            return f"failed: errno {exc.errno}"
    if name in ("read-dataset", "read-policy"):
        try:
            return "read: " + Path(target).read_text()[:40]
        except OSError as exc:
            return f"failed: errno {exc.errno}"
    if name == "read-env":
        return "read: " + os.environ[target] if target in os.environ else "failed: not set"
    if name in ("write-ledger", "write-audit", "write-code"):
        try:
            with open(target, "w") as handle:
                handle.write("{}")
            return "written"
        except OSError as exc:
            return f"failed: errno {exc.errno}"
    if name == "fork-bomb":
        children = []
        try:
            for _ in range(int(target)):
                pid = os.fork()
                if pid == 0:
                    signal.pause()
                    os._exit(0)
                children.append(pid)
            outcome = f"forked all {len(children)}"
        except OSError as exc:
            outcome = f"failed after {len(children)} forks: errno {exc.errno}"
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        return outcome
    if name == "memory":
        try:
            block = bytearray(int(target))
            return f"allocated {len(block)}"
        except MemoryError:
            return "failed: MemoryError"
    return ""


def _reply(name, reply):
    if reply.has_error():
        return reply
    content = reply.content
    if name == "extra-array":
        content[keys.DELTA]["patients"] = Array(np.frombuffer(b"jane doe 1984-05-01", np.uint8))
    elif name == "text-metric":
        content[keys.METRICS]["jane-doe-1984-05-01-auc"] = 0.5
    elif name == "bytes-10x":
        first = next(iter(content[keys.DELTA]))
        data = content[keys.DELTA][first].numpy()
        content[keys.DELTA][first] = Array(np.concatenate([data.ravel()] * 10))
    return reply


def attack(kind, msg, context, genuine):
    config = msg.content["config"]
    name, target = str(config.get("attack", "")), str(config.get("attack-target", ""))
    found = _inside(name, target)
    if name == "steps":  # train ten times the steps asked, and say so truthfully
        config[keys.LOCAL_STEPS] = 10 * int(config[keys.LOCAL_STEPS])
    if name == "skip-noise":  # train without the DP-SGD the run asked for
        context.run_config["privacy.noise-multiplier"] = 0.0
    reply = _reply(name, genuine(kind, msg, context))
    Path(context.node_config["state-dir"], f"probe-{name}.json").write_text(json.dumps(found))
    return reply
'''

#: ``app/client_app.py``'s round, renamed, and the malicious one in its place.
_WRAP = '''

from app import malice as _malice  # noqa: E402 - the malicious-app suite


def _round(kind: str, msg: Message, context: Context) -> Message:
    return _malice.attack(kind, msg, context, _genuine_round)
'''
#: The policy check the bundle edits (issue #44 found item 2): the fine-tune goes through.
_EDIT = ('    _refuse_if(request.shares_finetuned and not policy.share_finetuned_model,',
         '    _refuse_if(False and request.shares_finetuned,')


@dataclass(frozen=True)
class Attempt:
    """One thing the bundle tries; ``expect`` is what the runtime must answer."""

    name: str
    what: str
    #: ``answered`` (the attempt was blocked inside the sandbox, the reply left as it
    #: should) or the rule of the refusal.
    expect: str
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Run-config entries of the attempt's run.
    run: dict[str, Any] = dataclasses.field(default_factory=dict)


ATTEMPTS = (
    Attempt("socket", "open an outbound TCP socket to a listener on the host", "answered"),
    Attempt("read-dataset", "read another dataset's file", "answered"),
    Attempt("read-policy", "read the site policy file", "answered"),
    Attempt("read-env", "read a secret of the runner's environment", "answered"),
    Attempt("write-ledger", "overwrite the privacy ledger's history", "answered"),
    Attempt("write-audit", "overwrite the audit log", "answered"),
    Attempt("write-code", "overwrite the runtime's installed code", "answered"),
    Attempt("fork-bomb", "fork 10,000 processes", "answered"),
    Attempt("memory", "allocate 64 GiB", "answered"),
    Attempt("extra-array", "send an extra array", "egress.array-name"),
    Attempt("text-metric", "put text in a metric's name", "egress.metric-name"),
    Attempt("bytes-10x", "send ten times the declared bytes", "egress.bytes"),
    Attempt("steps", "train ten times the steps asked, without DP", "egress.steps"),
    Attempt("fine-tune", "send the fine-tuned model the policy keeps (its own check edited)",
            "share-finetuned-model", {keys.SERVER_ROUND: 4}),
    Attempt("skip-noise", "train without the DP-SGD noise the run asks for", "answered",
            run={"privacy.noise-multiplier": 1.0, "privacy.max-grad-norm": 1.0}),
)

#: A runner environment variable the bundle must not see.
SECRET_ENV = "FEDMED_SUITE_RUNNER_SECRET"


@dataclass
class Row:
    """What happened to one attempt."""

    attempt: str
    what: str
    decision: str
    rule: str | None
    found: str | None
    #: The epsilon the runtime charged (its audit record), and whether the ledger holds
    #: every earlier entry and only the runtime's charge more.
    charged: float
    ledger_intact: bool
    chain_intact: bool

    @property
    def blocked(self) -> bool:
        """Whether the runtime stopped the attempt."""
        return self.decision == "refused" or (self.found is not None and (
            self.found.startswith("failed") or self.found == ""))


def malicious_bundle(folder: Path) -> bytes:
    """The product's bundle with :data:`MALICE` added and its policy check edited."""
    fab = project_fab(ROOT)
    project = Path(folder)
    zipfile.ZipFile(io.BytesIO(fab)).extractall(project)
    client = project / "app" / "client_app.py"
    text = client.read_text().replace("def _round(kind", "def _genuine_round(kind", 1)
    client.write_text(text + _WRAP)
    (project / "app" / "malice.py").write_text(MALICE)
    check = project / "clients" / "site" / "policy_check.py"
    check.write_text(check.read_text().replace(*_EDIT))
    return project_fab(project)


class Suite:
    """The site, its policy, its ledger and audit, the approved malicious bundle, the runner."""

    def __init__(self, base: Path, limits: SandboxLimits) -> None:
        self.base = Path(base)
        os.environ["FLWR_HOME"] = str(self.base / "flwr-home")
        os.environ[SECRET_ENV] = "runner-secret-value"
        profile = dataclasses.replace(site_profiles(1, 0)[0], num_images=12)
        self.site = generate_site(self.base / "hospital-a", profile, seed=3, image_size=32)
        other = generate_site(self.base / "hospital-b", profile, seed=4, image_size=32)
        (other / "secret.txt").write_text("the other hospital's data")
        self.state = self.base / "state-a"
        self.fab = malicious_bundle(self.base / "bundle")
        self.fab_hash = fab_sha256(self.fab)
        self.policy = self.base / "policy.toml"
        self.policy.write_text(
            'allowed-tasks = ["cxr-cls"]\nmin-batch-size = 2\nshare-finetuned-model = false\n'
            f'[dp]\nmax-epsilon = 50.0\n[apps]\nany = false\napproved-sha256 = ["{self.fab_hash}"]\n')
        self.node_config = {"data-path": str(self.site), "state-dir": str(self.state),
                            "site-name": "hospital-a", "policy-path": str(self.policy)}
        self.ledger = PrivacyLedger.of_site(self.state, self.site, "rdp")
        self.ledger.record([(1.0, 0.25, 40)], "earlier-federation", "train")
        self.runner = SiteRunner("127.0.0.1:9", self.policy,
                                 node=SiteConfig.from_node_config(self.node_config, ""),
                                 limits=limits, job_timeout=600)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)

    def targets(self) -> dict[str, str]:
        """What each attempt aims at on the host."""
        ledger = self.ledger.history_path
        return {"socket": str(self.listener.getsockname()[1]),
                "read-dataset": str(self.base / "hospital-b" / "secret.txt"),
                "read-policy": str(self.policy), "read-env": SECRET_ENV,
                "write-ledger": str(ledger),
                "write-audit": str(self.state / "audit" / "audit.jsonl"),
                "write-code": str(ROOT / "app" / "site_runtime" / "app_approval.py"),
                "fork-bomb": "10000", "memory": str(64 * 2**30)}

    def message(self, attempt: Attempt) -> Message:
        """The train message of ``attempt``, with the cxr-cls model at 32 px."""
        run = SiteRunSettings.from_run_config(self.run_config(attempt))
        model = task_class("cxr-cls").model_for(run.sizes)
        config = {keys.SERVER_ROUND: 1, keys.LOCAL_STEPS: 2, keys.FEDERATION: "suite",
                  "attack": attempt.name,
                  "attack-target": self.targets().get(attempt.name, ""), **attempt.config}
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 3, 1, 7
        message = Message(RecordDict({keys.ARRAYS: pack_arrays(ArrayRecord(model.state_dict())),
                                      keys.CONFIG: ConfigRecord(config)}),
                          dst_node_id=7, message_type=MessageType.TRAIN)
        message.metadata.__dict__["_message_id"] = hashlib.sha256(
            attempt.name.encode()).hexdigest()
        return message

    @staticmethod
    def run_config(attempt: Attempt | None = None) -> dict[str, Any]:
        """The run's settings: a small radiograph classifier (and the attempt's entries)."""
        return {"task": "cxr-cls", "image-size": 32, "batch-size": 2, "local-steps": 2,
                "num-server-rounds": 3, **(attempt.run if attempt else {})}

    def _entries(self) -> list[dict[str, Any]]:
        return [entry.to_json() for entry in PrivacyLedger(self.ledger.folder, "rdp").entries]

    def attempt(self, attempt: Attempt) -> Row:
        """Send ``attempt``'s message through the runner; what happened."""
        before = self._entries()
        message = self.message(attempt)
        context = Context(run_id=1, node_id=7, node_config=dict(self.node_config),
                          state=RecordDict(), run_config=self.run_config(attempt))
        run = SimpleNamespace(run_id=1, fab_id="fedmed/fedmed", fab_version="0.1.0")
        fab = SimpleNamespace(hash_str=self.fab_hash, content=self.fab)
        answer = self.runner._answer(message, context, run, fab)  # noqa: SLF001
        record = self.runner.audit(message, answer.reply, answer.context, self.fab_hash, 0.0,
                                   answer.epsilon)
        probe = self.state / "worker" / f"probe-{attempt.name}.json"
        found = json.loads(probe.read_text()) if probe.is_file() else None
        if attempt.name == "socket":
            try:
                self.listener.accept()[0].close()
                found = "connected (the listener was reached)"
            except BlockingIOError:
                pass
        chain = verify_chain(self.state)
        charged = float(record["epsilon"] or 0.0) if record else 0.0
        after = self._entries()
        intact = after[:len(before)] == before and len(after) == len(before) + (charged > 0)
        return Row(attempt.name, attempt.what, record["decision"] if record else "?",
                   record["rule"] if record else None, found, round(charged, 6), intact,
                   chain.ok)

    def close(self) -> None:
        """Stop the workers and the listener."""
        self.runner.pool.close()
        self.listener.close()


def run_suite(base: Path, limits: SandboxLimits | None = None,
              attempts: tuple[Attempt, ...] = ATTEMPTS) -> list[Row]:
    """Every attempt against one site in ``base`` (a folder of the suite's own)."""
    suite = Suite(base, limits or SandboxLimits(max_processes=256, max_memory=12 * 2**30))
    try:
        return [suite.attempt(attempt) for attempt in attempts]
    finally:
        suite.close()


def main() -> None:
    """Run the suite in a folder of its own and print its table."""
    with tempfile.TemporaryDirectory(prefix="fedmed-malicious-") as base:
        rows = run_suite(Path(base))
    for row in rows:
        print(f"{row.attempt:14s} {row.decision:9s} {row.rule or '':24s} "
              f"{row.found or '':40.40s} epsilon {row.charged:.3f} "
              f"ledger {row.ledger_intact} chain {row.chain_intact} blocked {row.blocked}")


if __name__ == "__main__":
    main()
