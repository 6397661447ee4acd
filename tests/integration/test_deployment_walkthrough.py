"""docs/DEPLOYMENT.md's one-machine walkthrough (section 8), run command by command as written.

The ``$ `` lines of the section's console blocks (a line ending in a backslash goes on
on the next one) run in order with bash in a temporary copy of the repository (the
files git tracks and the untracked ones it does not ignore; the virtual environment
linked), so that ``$PWD/deploy`` and the Makefile's ``DEPLOY_DIR`` are that copy's and
nothing is written into the repository. ``make superlink`` and ``make supernode ...``
run in the foreground in the walkthrough's terminals: here they start in the
background in their own process groups, and the next command waits (bounded) until
the SuperLink has printed its banner or every SuperNode started so far is ``online``.
Two settings come from the environment, as make reads them: a free ``SUPERLINK_PORT``,
and a ``STAMP`` that is up to date (the install target never runs from the copy).

The run is checked as an operator would: ``make federate`` exits 0, the run's status in
``flwr ls --format json`` is ``finished:completed``, the end-of-run test line gives the
test metric or says the sites' policy withheld it (never NaN), each site's cross-site
fine-tune is withheld under the shipped ``share-finetuned-model = false``, the SuperLink
activated the registered node ids, and the MLflow run the walkthrough tracked to is
``FINISHED`` with each site's validation metric in every round.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from app.tooling.environment import free_port
from app.tooling.flwr_cli import CONNECTION, list_supernodes, run_status
from tests.integration.conftest import processes_mentioning
from tests.integration.deployment_helpers import interrupt_group

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## 8. One-machine walkthrough"
_BACKGROUND = re.compile(r"make (superlink|supernode)\b(?!s)")
_RUN = re.compile(r"run (\d+) status: (\S+)")
_TEST_LINE = re.compile(r"test test-(\w+): (\d+\.\d{4}|withheld by site policy \(.+?\)) over")
#: Bounds for a loaded 2-core machine; a healthy run never waits for them.
STARTUP_SECONDS, COMMAND_SECONDS = 300, 1500


def walkthrough_commands(text: str) -> list[str]:
    """The ``$ `` commands of the walkthrough section's console blocks, continuations joined."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.S):
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


def _copy_repository(target: Path) -> Path:
    """The repository's files (tracked, and untracked but not ignored) under ``target``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / ".venv").symlink_to(ROOT / ".venv")
    return target


class Terminals:
    """The walkthrough's terminals: foreground commands, and the daemons left running."""

    def __init__(self, repo: Path, env: dict[str, str], logs: Path) -> None:
        self.repo, self.env, self.logs = repo, env, logs
        self.daemons: list[tuple[subprocess.Popen, Path]] = []
        self.transcript: list[str] = []

    def run(self, command: str) -> str:
        """Run ``command`` to its end (it must exit 0); its output."""
        done = subprocess.run(["bash", "-c", command], cwd=self.repo, env=self.env,
                              capture_output=True, text=True, timeout=COMMAND_SECONDS)
        output = done.stdout + done.stderr
        self.transcript.append(f"$ {command}\n{output}")
        assert done.returncode == 0, f"$ {command}\nexit {done.returncode}\n{output[-4000:]}"
        return output

    def start(self, command: str) -> None:
        """Start a foreground daemon (``make superlink``, ``make supernode ...``) and wait for it."""
        log = self.logs / f"terminal-{len(self.daemons)}.log"
        with log.open("w") as out:
            process = subprocess.Popen(["bash", "-c", command], cwd=self.repo, env=self.env,
                                       stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.daemons.append((process, log))
        self.transcript.append(f"$ {command}  (background, log {log})")
        if "superlink" in _BACKGROUND.search(command).group(1):
            self._wait(lambda: "SuperLink on https://" in log.read_text(), "the SuperLink")
        else:
            nodes = sum("make supernode " in c for c in self.transcript)
            self._wait(lambda: sum(n["status"] == "online" for n in self._nodes()) >= nodes,
                       f"{nodes} SuperNode(s) online")

    def _nodes(self) -> list[dict]:
        try:
            return list_supernodes(self.repo / ".flwr-deploy")
        except Exception:  # noqa: BLE001 - not reachable yet: poll again
            return []

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
def terminals(tmp_path: Path) -> Iterator[Terminals]:
    repo = _copy_repository(tmp_path / "repo")
    stamp = tmp_path / "installed"
    stamp.touch()
    env = {**os.environ, "SUPERLINK_PORT": str(free_port()), "MAKEFLAGS": f"STAMP={stamp}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    (tmp_path / "logs").mkdir()
    opened = Terminals(repo, env, tmp_path / "logs")
    try:
        yield opened
    finally:
        opened.stop()
        print("\n".join(opened.transcript))
    deadline = time.monotonic() + 30
    while processes_mentioning(str(repo)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(repo)) == []


def test_the_walkthrough_runs_as_written(terminals: Terminals):
    commands = walkthrough_commands((ROOT / "docs" / "DEPLOYMENT.md").read_text())
    assert any(c.startswith("make federate") for c in commands), commands
    assert any("cp configs/site-policy.toml" in c for c in commands), commands
    outputs = {}
    for command in commands:
        if _BACKGROUND.match(command):
            terminals.start(command)
        else:
            outputs[command] = terminals.run(command)
    federate = next(out for command, out in outputs.items() if command.startswith("make federate"))
    run_id, status = _RUN.search(federate).groups()
    assert status == "finished:completed", federate[-4000:]
    assert run_status(terminals.repo / ".flwr-deploy", CONNECTION, int(run_id)) \
        == "finished:completed"
    test_line = _TEST_LINE.search(federate)
    assert test_line is not None, federate[-4000:]
    assert "nan" not in test_line.group(0).lower()
    # The shipped policy keeps each site's fine-tuned model at home: withheld, not dropped.
    for site in ("hospital-a", "hospital-b"):
        assert f"{site}-finetuned: withheld by site policy (share-finetuned-model)" in federate
    # The SuperNodes spoke TLS with the identities registered for them.
    deploy = terminals.repo / "deploy"
    flower_log = (deploy / "superlink" / "superlink.log").read_text()
    for entry in json.loads((deploy / "superlink" / "sites.json").read_text()).values():
        assert f"Activated node_id={entry['node-id']}" in flower_log
    client = MlflowClient(f"sqlite:///{terminals.repo / 'deploy' / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("fedmed-pe-seg").experiment_id])[0]
    assert run.info.status == "FINISHED"
    for site in ("hospital-a", "hospital-b"):  # the node config's site-name, every round
        history = client.get_metric_history(run.info.run_id, f"site/{site}/val-dice")
        assert sorted(m.step for m in history) == [1, 2], site
    value = run.data.metrics.get(f"test/{test_line.group(1)}")
    assert (value is not None and math.isfinite(value)) or "test/withheld" in run.data.tags
