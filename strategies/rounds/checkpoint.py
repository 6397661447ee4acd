"""Server checkpoint after every round, so a crashed ServerApp or SuperLink can resume.

Holds the global model, the last finished round, the composed strategy's state
(AdaComm's smoothed loss and tau, the server optimizer's moments, the selector's
counts and random state, known site sizes and losses), the ServerApp's best round
so far (``best``: plain values and its arrays, for best-model selection), how many
rounds so far aggregated an update (``aggregated_rounds``: a resumed federation
that aggregated nothing over all its rounds fails, :mod:`app.tracking.refusals`), the
MLflow run id and the run config, so a resumed federation continues in the same
MLflow run and only with the settings it was started with.

Checkpoints are kept per federation: ``<checkpoint-dir>/<mlflow run id>/``
(:func:`run_folder`), a folder created ``0700`` and checked before anything in
it is read. The file is one ``.npz`` read with ``allow_pickle=False``: the
arrays (model and plug-in state) and a JSON description of the rest
(:mod:`strategies.rounds.state_tree`), never pickle, so write access to the
checkpoint folder cannot run code in the ServerApp. A plug-in object's state is
restored onto the object the run config builds (``template``): a checkpoint
never names a class to construct. Written atomically (temporary file + rename).
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from strategies.plugins.registries import retired_keys
from strategies.rounds.state_tree import StateTreeError, decode_tree, encode_tree
from strategies.wire.errors import FederationError

__all__ = ["CHECKPOINT_FILE", "RESUME_KEYS", "CheckpointError", "ServerCheckpoint",
           "config_difference", "find_checkpoint", "load_checkpoint", "run_folder", "safe_name",
           "save_checkpoint"]

_VERSION = 2
#: The checkpoint file in a federation's folder.
CHECKPOINT_FILE = "server-checkpoint.npz"
#: Run-config keys that may differ between a federation and its resume (a resume
#: may also extend the federation by more rounds).
RESUME_KEYS = frozenset({"resume", "num-server-rounds"})
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class CheckpointError(FederationError):
    """A checkpoint is missing, unreadable or from an incompatible federation."""


@dataclass
class ServerCheckpoint:
    """Everything needed to continue a federation after ``server_round``.

    ``strategy`` is :meth:`FederatedStrategy.snapshot` when saving; after
    :func:`load_checkpoint` it is that snapshot restored onto ``template``.
    ``aggregated_rounds``: the rounds up to ``server_round`` that updated the global
    model (``None``: not counted, a checkpoint written before they were).
    """

    server_round: int
    keys: list[str]
    arrays: list[np.ndarray]
    strategy: dict[str, Any]
    mlflow_run_id: str
    run_config: dict[str, Any] = field(default_factory=dict)
    best: dict[str, Any] = field(default_factory=dict)
    aggregated_rounds: int | None = None
    version: int = _VERSION


def safe_name(name: str, what: str) -> str:
    """``name`` if it can be one folder name (letters, digits, ``_.-``; not only dots).

    Raises
    ------
    CheckpointError
        Naming ``what`` and the rule: ``..``, ``.``, ``a/b`` or an empty name
        would put the state somewhere else.
    """
    if not _NAME.fullmatch(name or "") or set(name) == {"."}:
        raise CheckpointError(f"{what} {name!r} cannot name a state folder: use letters, "
                              "digits, '_', '.', '-' (not only dots, no path separators)")
    return name


def check_private_folder(folder: Path) -> Path:
    """Refuse a folder that is a link, not ours, or open to group or others."""
    folder = Path(folder)
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise CheckpointError(f"{folder}: state folder is not a plain folder")
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise CheckpointError(
            f"{folder}: state folder must be owned by this user with mode 0700 (it is "
            f"{stat.S_IMODE(info.st_mode):04o}, uid {info.st_uid}); `chmod 700 {folder}`")
    return folder


def run_folder(checkpoint_dir: Path, federation: str) -> Path:
    """The federation's own checkpoint folder ``<checkpoint_dir>/<federation>``, 0700."""
    folder = Path(checkpoint_dir) / safe_name(federation, "federation")
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    if not folder.exists():
        folder.mkdir(mode=0o700)
        os.chmod(folder, 0o700)
    return check_private_folder(folder)


def config_difference(saved: dict[str, Any], current: dict[str, Any],
                      defaults: dict[str, Any] | None = None) -> list[str]:
    """``key: saved -> current`` for each run-config key that differs (resume keys aside).

    A key the saved config lacks (one a later version of the app added) counts
    as its value in ``defaults``: a federation checkpointed before the key
    existed resumes as long as the key keeps its default, i.e. the behaviour
    the federation was started with. A key a later version retired
    (:func:`strategies.plugins.registries.retired_keys`) that the saved config holds at
    its neutral value is no difference; at another value it is one, with what replaced it.
    """
    current = json.loads(json.dumps(current))
    saved = {**json.loads(json.dumps(defaults or {})), **saved}
    retired = retired_keys()
    saved = {k: v for k, v in saved.items()
             if k not in retired or k in current or v != retired[k].neutral}
    keys = sorted((set(saved) | set(current)) - RESUME_KEYS)
    return [f"{k}: {saved.get(k, '<unset>')!r} -> {current.get(k, '<unset>')!r}"
            + (f" (retired: {retired[k].instead})" if k in retired else "")
            for k in keys if saved.get(k, "<unset>") != current.get(k, "<unset>")]


def save_checkpoint(path: Path, checkpoint: ServerCheckpoint) -> None:
    """Write ``checkpoint`` to ``path`` (a file in a :func:`run_folder`) atomically."""
    path = Path(path)
    state, arrays = encode_tree(checkpoint.strategy)
    best, best_arrays = encode_tree(checkpoint.best)
    meta = {"version": _VERSION, "server_round": checkpoint.server_round,
            "keys": list(checkpoint.keys), "mlflow_run_id": checkpoint.mlflow_run_id,
            "run_config": checkpoint.run_config, "strategy": state, "best": best,
            "aggregated_rounds": checkpoint.aggregated_rounds}
    entries = {f"model-{i}": np.asarray(a) for i, a in enumerate(checkpoint.arrays)}
    entries.update({f"state-{name}": a for name, a in arrays.items()})
    entries.update({f"best-{name}": a for name, a in best_arrays.items()})
    entries["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **entries)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(path: Path, meta_only: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    if not path.is_file():
        raise CheckpointError(f"{path}: no checkpoint to resume from")
    check_private_folder(path.parent)
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(npz["meta"].tobytes().decode())
            arrays = {} if meta_only else {k: npz[k] for k in npz.files if k != "meta"}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("version") != _VERSION:
        raise CheckpointError(f"{path}: not a version-{_VERSION} server checkpoint")
    return meta, arrays


def find_checkpoint(checkpoint_dir: Path, run_config: dict[str, Any],
                    defaults: dict[str, Any] | None = None) -> Path:
    """The newest checkpoint under ``checkpoint_dir`` made with ``run_config``
    (keys it lacks count as their ``defaults``, :func:`config_difference`).

    Raises
    ------
    CheckpointError
        If there is none, or none was made with this run config (the message
        names the keys that differ from the newest one).
    """
    files = sorted(Path(checkpoint_dir).glob(f"*/{CHECKPOINT_FILE}"),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    if not files:
        raise CheckpointError(f"{checkpoint_dir}: no checkpoint to resume from")
    problems = []
    for path in files:
        try:
            meta, _ = _read(path, meta_only=True)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        difference = config_difference(meta.get("run_config", {}), run_config, defaults)
        if not difference:
            return path
        problems.append(f"{path}: made with another run config ({'; '.join(difference)})")
    raise CheckpointError("no checkpoint of this federation to resume: " + " | ".join(problems)
                          + "; resume with the run config the federation was started with")


def load_checkpoint(path: Path, run_config: dict[str, Any] | None,
                    template: dict[str, Any] | None = None,
                    defaults: dict[str, Any] | None = None) -> ServerCheckpoint:
    """Read the checkpoint at ``path`` after checking its folder and run config.

    Parameters
    ----------
    path : Path
        The checkpoint file (in its federation's :func:`run_folder`).
    run_config : dict or None
        The run config of the resume (:meth:`RunConfig.as_params`); a key
        that differs (other than :data:`RESUME_KEYS`) is refused. ``None``
        reads without this check (inspection, tests).
    template : dict, optional
        A fresh :meth:`FederatedStrategy.snapshot` of the run config's
        plug-ins; their saved state is restored onto these objects. Without it
        objects come back as dicts of their attributes (for inspection).
    defaults : dict, optional
        The app's default run config: a key the checkpoint's run config lacks
        counts as its default (:func:`config_difference`).

    Raises
    ------
    CheckpointError
        If it is missing, unreadable, in an unsafe folder, of another format
        version or run config, or its state does not fit ``template``.
    """
    path = Path(path)
    meta, arrays = _read(path, meta_only=False)
    difference = ([] if run_config is None
                  else config_difference(meta.get("run_config", {}), run_config, defaults))
    if difference:
        raise CheckpointError(f"{path}: made with another run config ({'; '.join(difference)});"
                              " resume with the run config the federation was started with")
    state = {k[len("state-"):]: v for k, v in arrays.items() if k.startswith("state-")}
    best = {k[len("best-"):]: v for k, v in arrays.items() if k.startswith("best-")}
    try:
        strategy = decode_tree(meta["strategy"], state, template)
        model = [arrays[f"model-{i}"] for i in range(len(meta["keys"]))]
        return ServerCheckpoint(server_round=int(meta["server_round"]), keys=list(meta["keys"]),
                                arrays=model, strategy=strategy,
                                mlflow_run_id=str(meta["mlflow_run_id"]),
                                run_config=meta["run_config"],
                                best=decode_tree(meta["best"], best) if "best" in meta else {},
                                aggregated_rounds=None if meta.get("aggregated_rounds") is None
                                else int(meta["aggregated_rounds"]))
    except (StateTreeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc})") from exc
