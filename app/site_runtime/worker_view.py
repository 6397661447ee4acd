"""What the app's worker is given of the site: its own state folder, a copy of the data rules.

The hospital's runtime keeps its own files in the site's state dir (``state-dir`` of
the node config): the audit log, the privacy ledgers, the console's admin token and
the runtime's counts (:data:`RUNTIME_NAMES`). The worker (the approved app's
ClientApp, :mod:`app.site_runtime.site_worker`) must see none of them, so it gets

* its own state folder, ``<state-dir>/worker/`` (:func:`worker_state_dir`): the
  federations' residuals, control variates, masks, personalised layers and the decoded
  data cache; a state dir written by an earlier version, with these beside the
  runtime's files, is moved there once (:func:`prepare_worker_state`), so nothing is lost;
* a copy of the policy's *data* rules (``<state-dir>/runtime/worker-policy.toml``,
  :func:`write_worker_policy`): its own checks are a second line behind the runtime's
  (:mod:`app.site_runtime.runtime_gate`), and it has no business with the ``[apps]``
  approvals, trusted keys or the ``[audit]`` anchor;
* a node config that names both, and ``privacy-ledger = "site-runtime"``
  (:data:`~app.config.site_config.RUNTIME_LEDGER`): the runtime charged the ledger, the
  worker's round charges nothing (:func:`worker_context`).

The sandbox (:mod:`app.site_runtime.sandbox`) mounts only these; without it
(``sandbox = "off"``) the worker still uses them, so the two modes keep one layout.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from flwr.app import Context

from app.config.site_config import COHORT, POLICY_FILES, RUNTIME_LEDGER, encode_policy_files
from app.site_runtime.audit_format import AUDIT_DIR
from app.site_runtime.console_access import CONSOLE_DIR
from clients.pacs.sync import STORE_DIR as PACS_DIR
from clients.site.atomic_file import write_atomic
from clients.site.data_report import DATA_REPORT_DIR
from clients.site.policy import SitePolicy
from clients.site.privacy_ledger import PRIVACY_DIR

__all__ = ["RUNTIME_DIR", "WORKER_DIR", "RUNTIME_NAMES", "WORKER_POLICY_NAME",
           "worker_state_dir", "runtime_dir", "prepare_worker_state", "data_rules_toml",
           "worker_policy_path", "write_worker_policy", "policy_files", "worker_context",
           "returned_context", "chown_tree"]

log = logging.getLogger("fedmed.site_runner")

#: ``<state-dir>/runtime/``: the runtime's own counts (queries, census) and the worker's
#: policy copy.
RUNTIME_DIR = "runtime"
#: ``<state-dir>/worker/``: the worker's state dir.
WORKER_DIR = "worker"
#: What of the state dir is the runtime's: never mounted in the sandbox (but a synced PACS
#: cohort, ``pacs/<name>``, read-only as the data folder), never migrated.
RUNTIME_NAMES = frozenset({AUDIT_DIR, PRIVACY_DIR, CONSOLE_DIR, RUNTIME_DIR, WORKER_DIR,
                           DATA_REPORT_DIR, PACS_DIR})
#: The data rules the worker reads, in :func:`runtime_dir`.
WORKER_POLICY_NAME = "worker-policy.toml"
#: Policy fields the worker is not given (the runtime's business alone).
_RUNTIME_RULES = frozenset({"apps", "audit", "sandbox", "pacs", "fingerprint"})


def worker_state_dir(state_dir: Path) -> Path:
    """``<state-dir>/worker``: the state dir the worker is told about."""
    return Path(state_dir) / WORKER_DIR


def runtime_dir(state_dir: Path) -> Path:
    """``<state-dir>/runtime``: the runtime's own counts and the worker's policy copy."""
    return Path(state_dir) / RUNTIME_DIR


def prepare_worker_state(state_dir: Path, owner: tuple[int, int] | None = None) -> Path:
    """The worker's state folder, created (and owned by ``owner`` = (uid, gid) when given).

    Folders of ``state_dir`` that are not the runtime's (:data:`RUNTIME_NAMES`), i.e. the
    federation folders and the decoded cache an earlier version kept there, are moved
    into it once, logged; the runtime's folders, files and links stay where they are.
    """
    state_dir = Path(state_dir)
    worker = worker_state_dir(state_dir)
    worker.mkdir(parents=True, exist_ok=True)
    moved = []
    for entry in sorted(state_dir.iterdir()):
        if (entry.name in RUNTIME_NAMES or entry.is_symlink() or not entry.is_dir()
                or (worker / entry.name).exists()):
            continue  # only the folders an earlier version kept there move
        entry.rename(worker / entry.name)
        moved.append(entry.name)
    if moved:
        log.info("site state %s: moved %d entries of the app's state into %s/ (%s)",
                 state_dir, len(moved), WORKER_DIR, ", ".join(moved[:10]))
    if owner is not None:
        chown_tree(worker, *owner)
    return worker


def chown_tree(folder: Path, uid: int, gid: int) -> None:
    """Give ``folder`` and what it holds to ``uid``/``gid`` (only what is not theirs yet)."""
    for path in (folder, *folder.rglob("*")):
        stat = path.lstat()
        if (stat.st_uid, stat.st_gid) != (uid, gid):
            os.chown(path, uid, gid, follow_symlinks=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return json.dumps(str(value))  # a TOML basic string


def data_rules_toml(policy: SitePolicy) -> str:
    """The policy's data rules as a policy file (no ``[apps]``, ``[audit]``, ``sandbox``).

    ``load_policy`` of the text gives the same data rules (a test holds it).
    """
    top, tables = [], []
    for field in fields(policy):
        if field.name in _RUNTIME_RULES:
            continue
        value = getattr(policy, field.name)
        key = field.name.replace("_", "-")
        if hasattr(value, "__dataclass_fields__"):
            rows = [f"{name.replace('_', '-')} = {_toml_value(item)}"
                    for name, item in asdict(value).items()]
            tables.append(f"[{key}]\n" + "\n".join(rows))
        else:
            top.append(f"{key} = {_toml_value(value)}")
    return ("# The data rules of the site policy, written by the site runtime for its worker\n"
            + "\n".join(top) + "\n\n" + "\n\n".join(tables) + "\n")


def worker_policy_path(state_dir: Path) -> Path:
    """``<state-dir>/runtime/worker-policy.toml``: the worker's copy of the data rules."""
    return runtime_dir(state_dir) / WORKER_POLICY_NAME


def write_worker_policy(state_dir: Path, policy: SitePolicy) -> Path:
    """Write (when changed) the worker's copy of ``policy``'s data rules; its path."""
    path = worker_policy_path(state_dir)
    text = data_rules_toml(policy)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        write_atomic(path, lambda handle: handle.write(text.encode()))
        path.chmod(0o644)
    return path


def policy_files(policy: SitePolicy) -> dict[str, bytes]:
    """The files ``policy`` names that the worker needs and, sandboxed as another user,
    cannot read: the SecAgg+ roster and signing key, the PSI secret (path -> bytes; a file
    the runtime cannot read is left out, and the worker refuses under its rule)."""
    named = (policy.secure_aggregation.roster, policy.secure_aggregation.signing_key,
             policy.vertical.psi_secret)
    files = {}
    for path in filter(None, named):
        try:
            files[path] = Path(path).read_bytes()
        except OSError as exc:
            log.warning("site policy names %s, which the runtime cannot read (%s)", path,
                        type(exc).__name__)
    return files


def worker_context(context: Context, state_dir: Path, policy_copy: Path,
                   files: dict[str, bytes] | None = None) -> Context:
    """A copy of the task's ``context`` whose node config points the worker at its own view.

    ``state-dir`` = the worker's folder, ``policy-path`` = the data rules' copy,
    ``policy-files`` = ``files`` (:func:`policy_files`, in memory: the worker's context
    travels over its pipe, never to disk),
    ``privacy-ledger`` = the runtime's (the runtime charged it), and no ``cohort`` (the
    runtime syncs it; the worker sees only ``data-path``, the synced folder); the runtime's
    ``context`` is untouched (what goes back to the SuperNode is it, with the worker's
    ``state``: :func:`returned_context`).
    """
    worker = copy.copy(context)
    node_config = {key: value for key, value in context.node_config.items() if key != COHORT}
    worker.node_config = {**node_config, "state-dir": str(worker_state_dir(state_dir)),
                          "policy-path": str(policy_copy), RUNTIME_LEDGER[0]: RUNTIME_LEDGER[1],
                          **({POLICY_FILES: encode_policy_files(files)} if files else {})}
    return worker


def returned_context(context: Context, worker: Context) -> Context:
    """The runtime's ``context`` carrying the ``state`` the worker's round left in ``worker``."""
    context.state = worker.state
    return context
