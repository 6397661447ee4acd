"""The product as a hospital gets it: a wheel, installed into a fresh venv, no checkout (#47).

The fresh venv is ``tests/integration/wheel_venv.py``'s (the wheel built from this
checkout, installed from a local wheelhouse with ``pip install --no-index``). Then, in
folders outside the checkout: the coordinator makes its certificates and starts the TLS
SuperLink with ``fedmed certs`` and ``fedmed superlink``; the hospital writes its data
with ``fedmed data``, makes its site folder with ``fedmed site init``; the coordinator
registers the key it was sent (``fedmed register``); ``fedmed site start`` starts the
SuperNode, and ``fedmed nodes`` shows it online.
"""

from __future__ import annotations

import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from app.tooling.environment import free_port
from tests.integration.deployment_helpers import interrupt_group
from tests.integration.wheel_venv import WheelVenv

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SITE = "hospital-00"
#: Bounded waits for a loaded 2-core machine (events, not timers: each polls a condition).
START_TIMEOUT = 300.0


def test_the_wheel_installs_one_namespace_and_its_command(wheel_venv):
    python, env, tmp = str(wheel_venv.python), wheel_venv.env, wheel_venv.tmp
    shown = wheel_venv.fedmed("--help", cwd=tmp)
    assert shown.returncode == 0, shown.stderr
    assert "fedmed site init" in shown.stdout and "fedmed federate" in shown.stdout
    for name in ("app", "strategies", "clients", "models"):
        found = subprocess.run([python, "-c", f"import {name}"], env=env, cwd=tmp,
                               capture_output=True, text=True)
        assert found.returncode != 0, f"the wheel installed a top-level {name!r}"
    where = subprocess.run(
        [python, "-c", "import fedmed.app.tooling.cli as c, fedmed.app.config.product_paths as p; "
                       "print(c.__file__); print(p.INSTALLED, p.PROJECT_ROOT)"],
        env=env, cwd=tmp, capture_output=True, text=True, check=True).stdout.split("\n")
    assert str(wheel_venv.venv) in where[0] and str(ROOT) not in where[0]
    installed, bundle = where[1].split(" ", 1)
    assert installed == "True"
    assert (Path(bundle) / "pyproject.toml").is_file() and (Path(bundle) / "configs").is_dir()
    wrong = wheel_venv.fedmed("site", "begin", cwd=tmp)
    assert wrong.returncode == 2 and "fedmed site init" in wrong.stderr


def _start(wheel_venv: WheelVenv, *args: str, cwd: Path, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([str(wheel_venv.venv / "bin" / "fedmed"), *args], cwd=cwd,
                                env=wheel_venv.env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_for(what: str, check, processes: list[subprocess.Popen], logs: list[Path]) -> str:
    """Poll ``check()`` until it returns text; fail with the logs if a process exits."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        text = check()
        if text:
            return text
        if any(p.poll() is not None for p in processes):
            break
        time.sleep(0.5)
    tails = "\n".join(f"--- {log}\n{log.read_text()[-3000:]}" for log in logs if log.exists())
    pytest.fail(f"{what} did not happen\n{tails}")


def test_a_hospital_inits_and_starts_its_site_from_the_wheel(wheel_venv):
    tmp = wheel_venv.tmp
    coordinator, hospital = tmp / "coordinator", tmp / "hospital"
    coordinator.mkdir()
    hospital.mkdir()
    port = free_port()
    made = wheel_venv.fedmed("certs", "--out", "deploy/certs", "--hosts", "127.0.0.1,localhost",
                             cwd=coordinator)
    assert made.returncode == 0, made.stdout + made.stderr
    data = wheel_venv.fedmed("data", "synthetic", "--task", "pe-seg", "--out",
                             str(hospital / "data"), "--sites", "1", "--image-size", "32",
                             cwd=hospital)
    assert data.returncode == 0, data.stdout + data.stderr
    folder = next(p for p in (hospital / "data").iterdir() if p.is_dir())
    init = wheel_venv.fedmed("site", "init", "--site", SITE, "--data", str(folder), "--superlink",
                             f"127.0.0.1:{port}", "--ca", str(coordinator / "deploy/certs/ca.crt"),
                             cwd=hospital)
    assert init.returncode == 0, init.stdout + init.stderr
    home = hospital / "fedmed-site"
    public_key = home / "certs" / "sites" / SITE / "supernode.pub"
    assert str(public_key) in init.stdout and (home / "site.toml").is_file()
    settings = tomllib.loads((home / "site.toml").read_text())
    assert settings["site"] == SITE and Path(settings["data"]) == folder.resolve()
    state, policy = Path(settings["state"]), Path(settings["policy"])
    assert state.stat().st_mode & 0o077 == 0 and policy.is_file()
    again = wheel_venv.fedmed("site", "init", "--site", SITE, "--data", str(folder), "--superlink",
                              f"127.0.0.1:{port}", cwd=hospital)
    assert again.returncode == 0 and "nothing new" in again.stdout

    logs = [tmp / "superlink.out", tmp / "supernode.out"]
    link = _start(wheel_venv, "superlink", "--port", str(port), cwd=coordinator, log=logs[0])
    node = None
    try:
        _wait_for("the SuperLink start", lambda: "SuperLink on https://" in logs[0].read_text()
                  if logs[0].exists() else "", [link], logs)
        registered = wheel_venv.fedmed("register", "--site", SITE, "--public-key", str(public_key),
                                       "--port", str(port), cwd=coordinator)
        assert registered.returncode == 0, registered.stdout + registered.stderr
        node = _start(wheel_venv, "site", "start", cwd=hospital, log=logs[1])

        def online() -> str:
            listed = wheel_venv.fedmed("nodes", "--port", str(port), cwd=coordinator)
            rows = [line for line in listed.stdout.splitlines() if line.startswith(SITE)]
            return rows[0] if rows and rows[0].split()[-1] == "online" else ""

        row = _wait_for("the site online", online, [link, node], logs)
        assert row.split()[0] == SITE
    finally:
        for process in (node, link):
            if process is not None:
                interrupt_group(process, timeout=120)
    verified = wheel_venv.fedmed("audit", "verify", "--state", str(state), "--policy", str(policy),
                                 cwd=hospital)
    assert verified.returncode == 0, verified.stdout + verified.stderr
