"""docs/DEPLOYMENT.md's role guides, run from the installed wheel in step order, as written.

Each ``console`` block of the guides follows a ``<!-- step N -->`` marker; its ``$ `` lines
run with bash in one empty folder, blocks sorted by step (stable: within a step, in the
page's order), with the fresh venv of ``tests/integration/wheel_venv.py`` first on
``PATH`` and its wheelhouse at ``./wheelhouse``. ``fedmed superlink`` and ``fedmed site
start ...`` run in the foreground in the guides' terminals: here they start in the
background in their own process groups, and the next command waits (bounded) until the
SuperLink printed its banner, or ``fedmed nodes`` lists every site started so far
``online``. Two numbers are replaced by free ports: the SuperLink's 8000 (``$SUPERLINK_PORT``,
as the commands read it, and ``127.0.0.1:8000``) and the console's 8470.

The run is checked as each role would: the federation's status is ``finished:completed``,
its test line gives the metric or says the sites' policy withheld it (never NaN), each
site's cross-site fine-tune is withheld under the shipped ``share-finetuned-model =
false``, the MLflow run in ``./mlflow.db`` is ``FINISHED`` with each site's validation
metric in every round; hospital A's console answers on its port; the DPO's privacy budget
and audit verification succeed. Every ``$`` line of docs/QUICKSTART.md is among the
commands run, so the quickstart is the guides' run on one page.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from app.tooling.environment import free_port
from tests.integration.conftest import processes_mentioning
from tests.integration.deployment_helpers import interrupt_group
from tests.integration.wheel_venv import WheelVenv

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[2] / "docs"
_STEP = re.compile(r"<!-- step (\d+) -->\n```console\n(.*?)```", flags=re.S)
_BACKGROUND = re.compile(r"fedmed (superlink|site start)\b")
_RUN = re.compile(r"run (\d+) status: (\S+)")
_TEST_LINE = re.compile(r"test test-(\w+): (\d+\.\d{4}|withheld by site policy \(.+?\)) over")
SITES = ("hospital-a", "hospital-b")
#: Bounds for a loaded 2-core machine; a healthy run never waits for them.
STARTUP_SECONDS, COMMAND_SECONDS = 300, 1500


def _dollar_lines(block: str) -> list[str]:
    """A console block's ``$ `` commands, a line ending in a backslash joined to the next."""
    commands: list[str] = []
    pending: str | None = None
    for line in block.splitlines():
        if pending is not None:
            pending += "\n" + line
        elif line.startswith("$ "):
            pending = line[2:]
        if pending is not None and not pending.endswith("\\"):
            commands.append(pending)
            pending = None
    return commands


def guide_commands(text: str) -> list[str]:
    """The guides' commands in step order; every console block must carry a step."""
    unmarked = text.count("```console") - len(_STEP.findall(text))
    assert unmarked == 0, f"{unmarked} console block(s) of DEPLOYMENT.md without <!-- step N -->"
    steps = sorted(((int(n), block) for n, block in _STEP.findall(text)), key=lambda s: s[0])
    return [command for _, block in steps for command in _dollar_lines(block)]


def quickstart_commands(text: str) -> list[str]:
    return [c for block in re.findall(r"```console\n(.*?)```", text, flags=re.S)
            for c in _dollar_lines(block)]


class Terminals:
    """The guides' terminals in one folder: foreground commands, and the daemons left running."""

    def __init__(self, folder: Path, env: dict[str, str], logs: Path) -> None:
        self.folder, self.env, self.logs = folder, env, logs
        self.daemons: list[tuple[subprocess.Popen, Path]] = []
        self.started: list[str] = []
        self.transcript: list[str] = []

    def run(self, command: str) -> str:
        """Run ``command`` to its end (it must exit 0); its output."""
        done = subprocess.run(["bash", "-c", command], cwd=self.folder, env=self.env,
                              capture_output=True, text=True, timeout=COMMAND_SECONDS)
        output = done.stdout + done.stderr
        self.transcript.append(f"$ {command}\n{output}")
        assert done.returncode == 0, f"$ {command}\nexit {done.returncode}\n{output[-4000:]}"
        return output

    def start(self, command: str) -> None:
        """Start a foreground daemon (the SuperLink, a site) and wait until it is up."""
        log = self.logs / f"terminal-{len(self.daemons)}.log"
        with log.open("w") as out:
            process = subprocess.Popen(["bash", "-c", command], cwd=self.folder, env=self.env,
                                       stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.daemons.append((process, log))
        self.started.append(command)
        self.transcript.append(f"$ {command}  (background, log {log})")
        if _BACKGROUND.match(command).group(1) == "superlink":
            self._wait(lambda: "SuperLink on https://" in log.read_text(), "the SuperLink")
        else:
            sites = sum("fedmed site start" in c for c in self.started)
            self._wait(lambda: self._online() >= sites, f"{sites} site(s) online")

    def _online(self) -> int:
        listed = subprocess.run(["fedmed", "nodes"], cwd=self.folder, env=self.env,
                                capture_output=True, text=True, timeout=COMMAND_SECONDS)
        return sum(line.split()[-1] == "online" for line in listed.stdout.splitlines()[1:]
                   if line.strip())

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not ready():
            for process, log in self.daemons:
                assert process.poll() is None, f"exited while waiting for {what}:\n" \
                    + log.read_text()[-4000:]
            assert time.monotonic() < deadline, f"no {what} after {STARTUP_SECONDS} s:\n" \
                + "\n".join(log.read_text()[-2000:] for _, log in self.daemons)
            time.sleep(1.0)

    def stop(self) -> None:
        """Ctrl-C in every terminal (SIGINT to its process group), newest first; then SIGKILL."""
        for process, _ in reversed(self.daemons):
            interrupt_group(process)


@pytest.fixture
def terminals(tmp_path: Path, wheel_venv: WheelVenv) -> Iterator[Terminals]:
    folder = tmp_path / "walkthrough"
    folder.mkdir()
    (folder / "wheelhouse").symlink_to(wheel_venv.wheelhouse)
    env = {**wheel_venv.env, "SUPERLINK_PORT": str(free_port())}
    (tmp_path / "logs").mkdir()
    opened = Terminals(folder, env, tmp_path / "logs")
    try:
        yield opened
    finally:
        opened.stop()
        print("\n".join(opened.transcript))
    deadline = time.monotonic() + 30
    while processes_mentioning(str(folder)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(folder)) == []


def test_the_quickstart_is_among_the_guides_commands():
    guides = guide_commands((DOCS / "DEPLOYMENT.md").read_text())
    quickstart = quickstart_commands((DOCS / "QUICKSTART.md").read_text())
    assert quickstart and [c for c in quickstart if c not in guides] == []
    assert guide_commands("<!-- step 2 -->\n```console\n$ b\n```\n<!-- step 1 -->\n"
                          "```console\n$ a\n```\n") == ["a", "b"]
    with pytest.raises(AssertionError, match="without <!-- step N -->"):
        guide_commands("```console\n$ a\n```\n")


def test_the_role_guides_run_as_written(terminals: Terminals):
    port, console = terminals.env["SUPERLINK_PORT"], free_port()
    commands = guide_commands((DOCS / "DEPLOYMENT.md").read_text())
    assert any(c.startswith("fedmed federate") for c in commands), commands
    outputs: dict[str, str] = {}
    for written in commands:
        command = written.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace(
            "--console-port 8470", f"--console-port {console}")
        if _BACKGROUND.match(command):
            terminals.start(command)
        else:
            outputs[written.split()[1]] = outputs.get(written.split()[1], "") \
                + terminals.run(command)
    federate = outputs["federate"]
    run_id, status = _RUN.search(federate).groups()
    assert status == "finished:completed", federate[-4000:]
    test_line = _TEST_LINE.search(federate)
    assert test_line is not None and "nan" not in test_line.group(0).lower(), federate[-4000:]
    for site in SITES:  # the shipped policy keeps each site's fine-tuned model at home
        assert f"{site}-finetuned: withheld by site policy (share-finetuned-model)" in federate
    client = MlflowClient(f"sqlite:///{terminals.folder / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("fedmed-pe-seg").experiment_id])[0]
    assert run.info.status == "FINISHED" and run.data.tags["flwr.run-id"] == run_id
    for site in SITES:  # the node config's site-name, every round
        history = client.get_metric_history(run.info.run_id, f"site/{site}/val-dice")
        assert sorted(m.step for m in history) == [1, 2], site
    value = run.data.metrics.get(f"test/{test_line.group(1)}")
    assert (value is not None and math.isfinite(value)) or "test/withheld" in run.data.tags
    # Hospital A's console answers on its port (its login page, or a redirect to it).
    try:
        answered = urllib.request.urlopen(f"http://127.0.0.1:{console}/", timeout=60).status
    except urllib.error.HTTPError as refused:
        answered = refused.code
    assert answered in (200, 302, 303, 401), answered
    # The DPO's checks: nothing spent without DP-SGD, an intact audit chain.
    assert "epsilon spent 0 " in outputs["privacy"], outputs["privacy"]
    assert "audit log OK:" in outputs["audit"], outputs["audit"]
