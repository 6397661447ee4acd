"""The ``flwr`` CLI as this project calls it: connections, run status, SuperNodes.

Every call runs with :func:`~app.tooling.environment.flower_env` of a
``FLWR_HOME`` whose ``config.toml`` (written by :func:`write_connection`) holds
the connection by name. ``--format json`` output is parsed; a failed call
raises :class:`FlowerProcessError` with the readable part of Flower's message.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from app.tooling.daemon import DaemonProcess, poll_until
from app.tooling.environment import flower_env
from app.tooling.errors import FlowerProcessError

__all__ = [
    "CONNECTION",
    "flwr",
    "json_out",
    "cli_error",
    "write_connection",
    "run_status",
    "list_supernodes",
    "wait_online",
]

CONNECTION = "fedmed-deploy"
_NODE_ID_LINE = "SuperNode ID:"


def flwr(flwr_home: Path, args: list[str], timeout: float = 60.0
         ) -> subprocess.CompletedProcess:
    """Run ``flwr ARGS`` with this project's environment; never raises on its exit code."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["flwr", *args], env=flower_env(flwr_home), capture_output=True,
                          text=True, timeout=timeout, check=False, cwd=flwr_home)


def json_out(result: subprocess.CompletedProcess) -> dict:
    """The JSON object a ``flwr ... --format json`` call printed (or {})."""
    text = result.stdout
    start = text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        return {}


def cli_error(result: subprocess.CompletedProcess, payload: dict) -> str:
    """The readable part of a failed ``flwr`` call."""
    text = str(payload.get("error-message") or (result.stdout + result.stderr))
    lines = [line.strip(" │╭╮╰╯─") for line in text.splitlines()]
    noise = ("Using SuperLink", "Listing all nodes")
    return " ".join(line for line in lines if line and not any(n in line for n in noise))


def write_connection(flwr_home: Path, name: str, address: str,
                     root_certificates: Path | None = None) -> None:
    """Write ``FLWR_HOME/config.toml`` with one SuperLink connection, the default.

    With ``root_certificates`` (the CA certificate) the connection is TLS; the
    path is made absolute (Flower rejects relative ones) and the address must
    be a name the SuperLink's certificate lists as SubjectAltName. Without it
    the connection is insecure (the simulation's loopback SuperLink).
    """
    if root_certificates is None:
        security = "insecure = true\n"
    else:
        root_certificates = Path(root_certificates).resolve()
        if not root_certificates.is_file():
            raise FlowerProcessError(f"CA certificate {root_certificates} is missing; "
                                     "run `make certs` (coordinator) or copy ca.crt here")
        security = f'root-certificates = "{root_certificates}"\n'
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n\n'
        f'[superlink.{name}]\naddress = "{address}"\n{security}',
        encoding="utf-8")


def run_status(flwr_home: Path, connection: str, run_id: int) -> str:
    """Status of a run as ``flwr ls --format json`` reports it (e.g. ``finished:completed``).

    ``flwr run`` exits 0 even when the run failed; this is the check that counts.
    """
    result = flwr(flwr_home, ["ls", connection, "--run-id", str(run_id), "--format", "json"])
    try:
        payload = json.loads(result.stdout)
        return str(payload["runs"][0]["status"])
    except (json.JSONDecodeError, KeyError, IndexError) as exc:
        said = result.stdout or result.stderr
        hint = (" (the SuperLink is not answering: start it again, `make superlink`, then "
                "continue the federation from its checkpoint with `make federate ... "
                "RESUME=1`)" if "unavailable" in said.lower() else "")
        raise FlowerProcessError(f"cannot read the status of run {run_id}: {said}{hint}") \
            from exc


def list_supernodes(flwr_home: Path, connection: str = CONNECTION) -> list[dict]:
    """The SuperLink's SuperNodes as ``flwr supernode list --format json`` reports them."""
    result = flwr(flwr_home, ["supernode", "list", connection, "--format", "json"])
    payload = json_out(result)
    if not payload.get("success"):
        raise FlowerProcessError(f"flwr supernode list failed: {cli_error(result, payload)}")
    return list(payload.get("nodes", []))


def wait_online(flwr_home: Path, node_ids: Iterable[int], timeout: float,
                connection: str = CONNECTION,
                watch: Sequence[DaemonProcess] = ()) -> None:
    """Wait until every node id is ``online`` at the SuperLink (bounded).

    Daemons in ``watch`` (the SuperNodes) make it fail early if one exits, and
    the SuperLink is only asked (one ``flwr`` process per poll) once each of
    them has logged its ``SuperNode ID``.
    """
    wanted = {str(n) for n in node_ids}
    online: set[str] = set()

    def all_online() -> bool:
        if not all(_NODE_ID_LINE in daemon.log_text() for daemon in watch):
            return False
        online.clear()
        online.update(n["node-id"] for n in list_supernodes(flwr_home, connection)
                      if n.get("status") == "online")
        return wanted <= online

    if not poll_until(all_online, timeout, watch=watch):
        raise FlowerProcessError(f"SuperNodes {sorted(wanted - online)} not online after "
                                 f"{timeout:.0f} s")
