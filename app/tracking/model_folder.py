"""A logged model on disk: tensors in one safetensors file, metadata in ``MLmodel``, no pickle.

The folder MLflow keeps for a model the federation logged
(:mod:`app.tracking.model_logging`) holds ``MLmodel`` (YAML: the ``fedmed``
metadata, read with ``yaml.safe_load``), ``artifacts/model.safetensors`` (the
state dict: names, dtypes, shapes and raw bytes, nothing executable) and MLflow's
text files (requirements, input example, the models-from-code file). Loading it
builds the network from the product's own code and copies the tensors in; nothing
in the folder is executed or unpickled.

A folder that holds any pickle is refused before anything is read, naming the file:
by its name (``.pkl``, ``.pickle``, ``.pth``, ``.pt``, ``.bin``, ``.ckpt``,
``.joblib``) or by its first bytes (the pickle protocol 2-5 opcode ``0x80 <n>``, or a
zip archive holding a ``.pkl`` member, as ``torch.save`` writes). A model an older
version of the product logged (a pickled ``nn.Module``, ``data/model.pth``) is
refused the same way: re-run the federation, or re-log its weights with this version.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from strategies.wire.errors import ConfigError

__all__ = ["METADATA_KEY", "PICKLE_SUFFIXES", "WEIGHTS_ARTIFACT", "WEIGHTS_FILE", "WEIGHTS_FORMAT",
           "ModelFolderError", "fedmed_entry", "load_weights", "pickle_reason", "refuse_pickles",
           "save_weights", "weights_path"]

#: The key of the product's entry in an MLflow model's ``metadata``.
METADATA_KEY = "fedmed"
#: The pyfunc artifact that holds the weights, and its file name.
WEIGHTS_ARTIFACT = "weights"
WEIGHTS_FILE = "model.safetensors"
#: The weights' format, as the ``fedmed`` metadata records it.
WEIGHTS_FORMAT = "safetensors"
#: File names that are pickles (or may be: ``torch.save``'s archives, ``.bin`` checkpoints).
PICKLE_SUFFIXES = (".pkl", ".pickle", ".pth", ".pt", ".bin", ".ckpt", ".joblib")
_ZIP_MAGIC = b"PK\x03\x04"
_REFUSED = ("make predict loads a model's weights only and never unpickles; a model an older "
            "version of the product logged is a pickled module: re-run the federation, or re-log "
            "its weights with this version (app.tracking.model_logging.log_task_model)")


class ModelFolderError(ConfigError):
    """A model folder holds a pickle, or lacks its weights or its metadata; names the folder and file."""


def pickle_reason(path: Path) -> str:
    """Why the file ``path`` is (or may be) a pickle; ``""`` when it is not."""
    if path.suffix.lower() in PICKLE_SUFFIXES:
        return f"its name ({path.suffix})"
    with path.open("rb") as handle:
        head = handle.read(4)
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return f"its first bytes (pickle protocol {head[1]})"
    if head == _ZIP_MAGIC:
        try:
            with zipfile.ZipFile(path) as archive:
                members = [name for name in archive.namelist() if name.endswith(".pkl")]
        except zipfile.BadZipFile:
            return ""
        if members:
            return f"its content (a zip archive holding {members[0]}, as torch.save writes)"
    return ""


def refuse_pickles(folder: Path, source: str) -> None:
    """Raise :class:`ModelFolderError` naming the first file of ``folder`` that is a pickle.

    ``source`` is what the user named (a URI or the folder), for the message.
    """
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        reason = pickle_reason(path)
        if reason:
            raise ModelFolderError(f"{source}: {path.relative_to(folder).as_posix()} in {folder} is "
                                   f"a pickle (by {reason}); refused: {_REFUSED}")


def fedmed_entry(metadata: Mapping[str, Any] | None, source: str) -> Mapping[str, Any]:
    """The ``fedmed`` entry of a model's metadata, with its task.

    Raises
    ------
    ModelFolderError
        If there is none (the model was logged by another tool).
    """
    entry = (metadata or {}).get(METADATA_KEY)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("task"), str):
        raise ModelFolderError(
            f"{source}: the model has no '{METADATA_KEY}' metadata with its task (logged by another "
            "tool or an older version); log it with the ServerApp, or load the weights with "
            "initial-model into a run of the right task")
    return entry


def weights_path(folder: Path, flavors: Mapping[str, Any], source: str) -> Path:
    """The safetensors file of the model in ``folder`` (its ``MLmodel`` ``flavors``).

    Raises
    ------
    ModelFolderError
        If the pyfunc flavor names no weights artifact, it leaves the folder, or it is missing.
    """
    artifacts = (flavors.get("python_function") or {}).get("artifacts") or {}
    relative = (artifacts.get(WEIGHTS_ARTIFACT) or {}).get("path")
    if not isinstance(relative, str):
        raise ModelFolderError(f"{source}: MLmodel in {folder} names no '{WEIGHTS_ARTIFACT}' "
                               f"artifact ({WEIGHTS_FILE}); {_REFUSED}")
    path = (folder / relative).resolve()
    if folder.resolve() not in path.parents:
        raise ModelFolderError(f"{source}: MLmodel's weights path {relative!r} leaves {folder}")
    if not path.is_file():
        raise ModelFolderError(f"{source}: {relative}: no such file in {folder}")
    return path


def save_weights(model: nn.Module, path: Path) -> Path:
    """Write ``model``'s state dict (on the CPU, contiguous, unshared) as safetensors at ``path``."""
    state = {key: value.detach().cpu().contiguous().clone()
             for key, value in model.state_dict().items()}
    save_file(state, str(path), metadata={"format": "pt"})
    return path


def load_weights(path: Path, source: str) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file ``path`` (nothing executed).

    Raises
    ------
    ModelFolderError
        If the file is not a readable safetensors file (names it).
    """
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as exc:
        raise ModelFolderError(f"{source}: {path}: not a readable safetensors file ({exc})") from exc
