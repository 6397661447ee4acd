"""Fixtures of the console's browser tests: a site with a history, its console, Chromium.

``console_site`` is one hospital's state dir and a copy of ``configs/site-policy.toml``
(with an approved-file in the same tmp folder, approving the federation's app), filled
the way the site runtime fills them: a node start, messages of every decision (answers,
a policy refusal and a failure recorded with the runtime's own record builder; the
tests have the real site runner refuse apps), two datasets' privacy ledgers (one
budget extended by the admin command) and a data report with a skipped item. Its console is served
by :func:`app.site_runtime.console.start_console_thread` on a free loopback port,
once per test module, with the admin token it makes at its first start; one headless
Chromium (Debian's package, driven by Playwright; never a downloaded browser) serves
every test of the module, and each test's tab logs in through the login page.

Without chromium the tests skip, except under CI (the ``CI`` variable set), where
they fail: ``.ci/run`` installs Debian's chromium with apt.
"""

from __future__ import annotations

import io
import os
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from PIL import Image

from app.site_errors import error_reply
from app.site_runtime.app_approval import approve, fab_sha256
from app.site_runtime.audit_record import message_record
from app.site_runtime.console import start_console_thread
from app.site_runtime.console_access import ConsoleSettings
from app.site_runtime.privacy_budget import main as privacy_budget
from app.site_runtime.site_audit import SiteAudit
from app.site_runtime.site_runner import SiteRunner
from clients.root_logging import root_logging_kept
from clients.site.data_report import write_data_report
from clients.site.policy import PolicyRefusal, load_policy
from clients.site.privacy_ledger import PrivacyLedger
from strategies.wire import message_keys as keys
from tests.app.site_messages import instruction
from tests.debian_tools import debian_tool

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "configs" / "site-policy.toml"
#: A folder to save one full-page screenshot of each page into (``make console-screenshots``).
SCREENSHOTS_ENV = "FEDMED_CONSOLE_SCREENSHOTS"
SITE = "hospital-a"
#: The delta of the shipped policy's ``[dp]`` section, at which the console shows epsilon.
DELTA = 1e-5
VIEWPORT = {"width": 1280, "height": 800}


def chromium_executable() -> str:
    """Debian's chromium; skip without it, fail under CI (which must run the browser tests)."""
    return debian_tool("chromium", "chromium", "the console's browser tests must run")


def bundle(text: str) -> SimpleNamespace:
    """A stand-in app bundle (FAB) as the SuperNode hands it to the runner: bytes and digest."""
    content = b"PK\x03\x04 " + text.encode()
    return SimpleNamespace(hash_str=fab_sha256(content), content=content)


@dataclass
class ConsoleSite:
    """One hospital as its console sees it, and the runner that answers its messages."""

    state: Path
    policy: Path
    approved_file: Path
    datasets: dict[str, Path]
    runner: SiteRunner
    #: The node's audit (its start, its status), as the site node keeps it.
    node: SiteAudit
    url: str = ""
    #: The console's admin token file (``<state>/console/admin-token``, made at its start).
    token_file: Path | None = None

    @property
    def node_config(self) -> dict[str, str]:
        """The node config of the site's messages (its first dataset)."""
        return {"site-name": SITE, "data-path": str(self.datasets["chest-xray"]),
                "state-dir": str(self.state), "policy-path": str(self.policy)}

    def context(self, **run_config: Any) -> Context:
        """The context of a message of run 1 of a cxr-cls federation."""
        return Context(run_id=1, node_id=7, node_config=self.node_config, state=RecordDict(),
                       run_config={"task": "cxr-cls", "batch-size": 16, **run_config})

    def ask(self, message: Message, fab: SimpleNamespace, **run_config: Any) -> dict[str, Any]:
        """Have the real site runner answer ``message`` for ``fab`` and audit it, as its
        ``handle`` does (only refusals and the policy-path check run here: an approved
        bundle's answer would start a worker); returns the audit record written."""
        answer = self.runner._answer(message, self.context(**run_config), SimpleNamespace(), fab)
        return self.runner.audit(message, answer.reply, answer.context, fab.hash_str, 0.02,
                                 answer.epsilon)

    def record(self, message: Message, reply: Message, fab: SimpleNamespace,
               seconds: float, epsilon: float) -> None:
        """Audit ``reply`` to ``message`` with the runtime's own record builder."""
        record = message_record(message, reply, self.context(), fab.hash_str, seconds, epsilon)
        self.node.message(record)

    def reached(self) -> None:
        """Refresh ``node-status.json`` as a node that just reached its SuperNode."""
        self.node.status(reached=True, force=True)


def _history(site: ConsoleSite, fab: SimpleNamespace) -> None:
    """A day of one federation: answers, a policy refusal, a failure, DP steps, data loaded."""
    federation = {keys.FEDERATION: "fed-2611-cxr"}
    payload = ArrayRecord([np.zeros(60_000, np.uint8)])  # a top-k update's bytes
    for rnd in (1, 2, 3):
        train = instruction("train", **{keys.SERVER_ROUND: rnd, keys.LOCAL_STEPS: 20,
                                        keys.CODEC: "topk:0.05", **federation})
        update = Message(RecordDict({keys.ARRAYS: payload,
                                     keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: 96})}),
                         reply_to=train)
        site.record(train, update, fab, seconds=41.5 + rnd, epsilon=0.21)
        check = instruction("evaluate", **{keys.SERVER_ROUND: rnd, keys.EVAL_SPLIT: "val",
                                           **federation})
        metrics = Message(RecordDict({keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: 24})}),
                          reply_to=check)
        site.record(check, metrics, fab, seconds=3.2, epsilon=0.0)
    query = instruction("query", **{keys.LOSS_SUBSET: 2, **federation})
    refusal = error_reply(query, site.context(), PolicyRefusal("min-batch-size", "2 < 4"))
    site.record(query, refusal, fab, seconds=0.01, epsilon=0.0)
    crash = instruction("train", **{keys.SERVER_ROUND: 4, **federation})
    site.record(crash, error_reply(crash, site.context(), MemoryError()), fab, 12.0, 0.0)
    for name, runs in (("chest-xray", 6), ("ct-volumes", 2)):
        ledger = PrivacyLedger.of_site(site.state, site.datasets[name], "rdp")
        for run in range(runs):
            ledger.record([(1.1, 0.02, 30 * (run + 1))], f"fed-{run}", "train")
    with root_logging_kept():  # `make privacy-budget EXTEND=2` (it configures logging)
        assert privacy_budget(["--state", str(site.state), "--data",
                               str(site.datasets["ct-volumes"]), "--extend", "2",
                               "--reason", "ethics board approval 2026-114"]) == 0
    task = SimpleNamespace(name="cxr-cls", train_set=[0] * 96, val_set=[0] * 24,
                           test_set=[0] * 24, report=SimpleNamespace(skipped={
                               "study-0042": "unreadable DICOM series (no pixel data)"}))
    write_data_report(task, site.datasets["chest-xray"], site.state)


@pytest.fixture(scope="module")
def console_site(tmp_path_factory) -> Iterator[ConsoleSite]:
    """The site (see the module docstring); its message tasks run as node 7's."""
    root = tmp_path_factory.mktemp("console-site")
    state, approved = root / "state", root / "approved-apps.txt"
    datasets = {name: root / "data" / name for name in ("chest-xray", "ct-volumes")}
    for folder in (state, *datasets.values()):
        folder.mkdir(parents=True)
    policy = root / "site-policy.toml"
    policy.write_text(POLICY.read_text(encoding="utf-8").replace(
        'approved-file = ""', f'approved-file = "{approved}"'), encoding="utf-8")
    assert load_policy(policy).apps.approved_file == str(approved)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (("_task_id", 3), ("_run_id", 1), ("_node_id", 7)):
            patch.setattr(TaskIdentity, name, value)  # as pull_task_input sets them
        site = ConsoleSite(state, policy, approved, datasets, SiteRunner("127.0.0.1:9", policy),
                           SiteAudit(state, SITE))
        site.node.node_started(load_policy(policy).fingerprint)
        fab = bundle("the federation's app")
        approve(policy, fab.hash_str)  # `make approve-app`: the app this site answers
        _history(site, fab)
        yield site


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _served(url: str, thread: threading.Thread) -> bool:
    """Whether the console of ``thread`` answers at ``url`` (False: it could not bind)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and thread.is_alive():
        try:
            with urllib.request.urlopen(url + "/policy", timeout=2):
                pass
        except OSError:
            time.sleep(0.1)
            continue
        thread.join(timeout=0.5)  # a console that lost its port to another process exits
        return thread.is_alive()
    return False


@pytest.fixture(scope="module")
def console(console_site: ConsoleSite) -> Iterator[ConsoleSite]:
    """``console_site`` with its console served on loopback (``console_site.url``), in a
    thread as the site node serves it (``make supernode CONSOLE=1``); another free port
    is tried if one was taken meanwhile."""
    stop = threading.Event()
    try:
        for _ in range(3):
            settings = ConsoleSettings(site=SITE, state_dir=console_site.state,
                                       policy_path=console_site.policy, port=_free_port())
            thread = start_console_thread(settings, stop)
            console_site.url = f"http://127.0.0.1:{settings.port}"
            console_site.token_file = settings.admin_token_file
            if _served(console_site.url, thread):
                break
        else:
            pytest.fail(f"the console did not answer at {console_site.url}")
        yield console_site
    finally:
        stop.set()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module."""
    executable = chromium_executable()
    from playwright.sync_api import sync_playwright  # noqa: PLC0415

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def log_in(page: Any, token_file: Path, target: str = "/") -> None:
    """Log ``page`` in as a hospital admin does: open a console page, land on the login
    form, type the token read from ``token_file``, and arrive back at ``target``."""
    page.goto(target)
    page.wait_for_url(re.compile(r"/login\?next="))
    page.fill("#token", token_file.read_text(encoding="utf-8").strip())
    page.click("#login-button")
    page.wait_for_url(re.compile(rf"{re.escape(target)}$"))


@pytest.fixture
def page(browser: Any, console: ConsoleSite) -> Iterator[Any]:
    """A fresh browser tab (its own cookies) at the console's size, downloads accepted,
    logged in with the console's admin token."""
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True,
                                  base_url=console.url)
    context.set_default_timeout(15_000)
    try:
        tab = context.new_page()
        log_in(tab, console.token_file)
        yield tab
    finally:
        context.close()


def screenshot(page: Any, name: str) -> None:
    """Save ``page`` as ``<name>.png`` into the screenshot folder, when one is asked for
    (the whole page, in 128 colours: a few tens of kB for the repository)."""
    folder = os.environ.get(SCREENSHOTS_ENV)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shot = Image.open(io.BytesIO(page.screenshot(full_page=True)))
        shot.convert("RGB").quantize(colors=128).save(Path(folder) / f"{name}.png", optimize=True)
