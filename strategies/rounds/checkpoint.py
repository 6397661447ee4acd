"""Server checkpoint after every round, so a crashed ServerApp or SuperLink can resume.

Holds the global model, the last finished round, the composed strategy's state
(AdaComm's smoothed loss and tau, the server optimizer's moments, the selector's
counts and random state, known site sizes and losses), the ServerApp's best round
so far (``best``: plain values and its arrays, for best-model selection), how many
rounds so far aggregated an update (``aggregated_rounds``: a resumed federation
that aggregated nothing over all its rounds fails,
:func:`app.tracking.tracker.require_aggregation`), the MLflow run id and the run
config, so a resumed federation continues in the same MLflow run and only with the
settings it was started with.

Checkpoints are kept per federation: ``<checkpoint-dir>/<mlflow run id>/``
(:func:`run_folder`), a folder created ``0700`` and checked before anything in
it is read. The file is one ``.npz`` read with ``allow_pickle=False``: the
arrays (model and plug-in state) and a JSON description of the rest (the state
tree below), never pickle, so write access to the checkpoint folder cannot run
code in the ServerApp. Written atomically (temporary file + rename).

The state tree. :func:`encode_tree` turns a strategy snapshot (dicts, lists,
numbers, numpy arrays and scalars, numpy random generators, plug-in objects) into
a JSON tree and a dict of arrays (for ``np.savez``). :func:`decode_tree` reverses
it *onto a template*: an object's attributes are set on the object of the same
class that the run config built, so reading state never constructs a class the
file names (unlike pickle, where a file can run code). A node's kind:

===========  ===============================================
``list``     ``{"t": "list", "v": [node, ...]}`` (also ``tuple``, ``set``, ``frozenset``)
``dict``     ``{"t": "dict", "v": [[key, node], ...]}`` (keys keep int/str)
``array``    ``{"t": "array", "v": "<name in the arrays>"}``
``np``       ``{"t": "np", "dtype": "int64", "v": 3}`` (a numpy scalar)
``rng``      ``{"t": "rng", "v": <bit_generator.state>}``
``object``   ``{"t": "object", "type": "module.Class", "v": {attr: node}}``
===========  ===============================================

None, bool, int, float and str are themselves.

A class whose objects lost an attribute declares it in ``retired_state`` (attribute ->
its neutral value): an older checkpoint's attribute is skipped while it holds that value
(a feature it did not use), refused as unknown otherwise. A class that moved to another
module declares the names older checkpoints saved it under in ``former_types``
(``module.Class`` each): such a node restores onto it as under its own name.
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
from strategies.wire.errors import FederationError

__all__ = ["CHECKPOINT_FILE", "RESUME_KEYS", "CheckpointError", "ServerCheckpoint",
           "StateTreeError", "config_difference", "decode_tree", "encode_tree",
           "find_checkpoint", "load_checkpoint", "run_folder", "safe_name", "save_checkpoint"]

_VERSION = 2
#: The checkpoint file in a federation's folder.
CHECKPOINT_FILE = "server-checkpoint.npz"
#: Run-config keys that may differ between a federation and its resume (a resume
#: may also extend the federation by more rounds).
RESUME_KEYS = frozenset({"resume", "num-server-rounds"})
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_PLAIN = (type(None), bool, int, float, str)
_SEQUENCES = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
_BIT_GENERATORS = ("PCG64", "PCG64DXSM")  # states of plain ints (JSON)


class CheckpointError(FederationError):
    """A checkpoint is missing, unreadable or from an incompatible federation."""


class StateTreeError(FederationError):
    """Saved strategy state that does not fit the run's objects."""


def _type_name(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def encode_tree(value: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """The JSON tree of ``value`` and the arrays it refers to by name."""
    arrays: dict[str, np.ndarray] = {}

    def encode(v: Any, where: str) -> Any:
        if isinstance(v, _PLAIN) and not isinstance(v, np.generic):
            return v
        if isinstance(v, np.ndarray):
            name = str(len(arrays))
            arrays[name] = v
            return {"t": "array", "v": name}
        if isinstance(v, np.generic):
            return {"t": "np", "dtype": v.dtype.str, "v": v.item()}
        if isinstance(v, (list, tuple, set, frozenset)):
            kind = next(k for k, t in _SEQUENCES.items() if isinstance(v, t))
            items = sorted(v, key=repr) if kind in ("set", "frozenset") else v
            return {"t": kind, "v": [encode(x, f"{where}[{i}]") for i, x in enumerate(items)]}
        if isinstance(v, dict):
            return {"t": "dict", "v": [[encode(k, where), encode(x, f"{where}[{k!r}]")]
                                       for k, x in v.items()]}
        if isinstance(v, np.random.Generator):
            if type(v.bit_generator).__name__ not in _BIT_GENERATORS:
                raise StateTreeError(f"{where}: cannot checkpoint a "
                                     f"{type(v.bit_generator).__name__} generator")
            return {"t": "rng", "v": v.bit_generator.state}
        if hasattr(v, "__dict__") and not isinstance(v, type):
            return {"t": "object", "type": _type_name(v),
                    "v": {k: encode(x, f"{where}.{k}") for k, x in vars(v).items()}}
        raise StateTreeError(f"{where}: cannot checkpoint a {type(v).__name__}")

    return encode(value, "state"), arrays


def _generator(state: dict, template: Any, where: str) -> np.random.Generator:
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _BIT_GENERATORS:
        raise StateTreeError(f"{where}: unknown bit generator {name!r}")
    rng = template if isinstance(template, np.random.Generator) else np.random.Generator(
        getattr(np.random, name)())
    try:
        rng.bit_generator.state = state
    except (TypeError, ValueError, KeyError) as exc:
        raise StateTreeError(f"{where}: bad random state ({exc})") from exc
    return rng


def decode_tree(node: Any, arrays: dict[str, np.ndarray], template: Any = None,
                where: str = "state") -> Any:
    """The value ``node`` describes, restored onto ``template`` where it holds objects.

    Raises
    ------
    StateTreeError
        Naming the path (``state['schedule']._smoother``) of a node that is
        malformed, refers to a missing array, or is an object whose template is
        missing or of another class.
    """
    if isinstance(node, _PLAIN):
        return node
    if not isinstance(node, dict) or "t" not in node or "v" not in node:
        raise StateTreeError(f"{where}: malformed state node")
    kind, value = node["t"], node["v"]
    if kind == "array":
        if value not in arrays:
            raise StateTreeError(f"{where}: array {value!r} missing")
        return arrays[value]
    if kind == "np":
        return np.dtype(node["dtype"]).type(value)
    if kind in _SEQUENCES:
        items = [decode_tree(x, arrays, None, f"{where}[{i}]") for i, x in enumerate(value)]
        return items if kind == "list" else _SEQUENCES[kind](items)
    if kind == "dict":
        out = {}
        for key_node, item in value:
            key = decode_tree(key_node, arrays, None, where)
            sub = template.get(key) if isinstance(template, dict) else None
            out[key] = decode_tree(item, arrays, sub, f"{where}[{key!r}]")
        return out
    if kind == "rng":
        return _generator(value, template, where)
    if kind == "object":
        return _restore_object(node, arrays, template, where)
    raise StateTreeError(f"{where}: unknown state kind {kind!r}")


def _neutral(value: Any, neutral: Any) -> bool:
    """``value`` is the plain value ``neutral`` (None, a number, a string)."""
    return value is None if neutral is None else (isinstance(value, _PLAIN)
                                                  and value == neutral)


def _restore_object(node: dict, arrays: dict[str, np.ndarray], template: Any,
                    where: str) -> Any:
    attrs = node["v"]
    if template is None:  # inspection only: the attributes, no object built
        return {k: decode_tree(x, arrays, None, f"{where}.{k}") for k, x in attrs.items()}
    if node.get("type") not in (_type_name(template), *getattr(template, "former_types", ())):
        raise StateTreeError(f"{where}: saved {node.get('type')}, the run config builds "
                             f"{_type_name(template)}")
    current = vars(template)
    retired = getattr(template, "retired_state", {})
    attrs = {k: x for k, x in attrs.items() if k in current or k not in retired
             or not _neutral(decode_tree(x, arrays, None, f"{where}.{k}"), retired[k])}
    unknown = sorted(set(attrs) - set(current))
    if unknown:
        raise StateTreeError(f"{where}: attributes {unknown} unknown to {_type_name(template)}")
    for key, item in attrs.items():
        object.__setattr__(template, key,
                           decode_tree(item, arrays, current[key], f"{where}.{key}"))
    return template


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
        that differs (other than :data:`RESUME_KEYS`) is refused, and so is a
        checkpoint whose federation id is not its folder's name. ``None`` reads
        without these checks (inspection, tests).
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
    if run_config is not None and meta.get("mlflow_run_id") != path.parent.name:
        raise CheckpointError(f"{path}: holds federation {meta.get('mlflow_run_id')!r}, not "
                              "its folder's")
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
