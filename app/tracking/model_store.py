"""Where a model's folder comes from: a local folder as it is, or a download from a tracking
store that must already exist.

A hospital that was handed a model folder (a copy of what MLflow keeps for a logged
model) applies it with no access to the coordinator's store: a local folder is used as
it is and no store is opened. An MLflow URI (``runs:/<run id>/best-model``,
``models:/<name>/<version>``, ``models:/m-<id>``) is downloaded from the tracking store
``MLFLOW_TRACKING_URI`` names; a local store (``sqlite:///file``, a ``file:`` or plain
folder) that does not exist is an error naming it, never created empty (MLflow would
create it on first use).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from strategies.wire.errors import ConfigError

__all__ = ["ModelStoreError", "is_mlflow_uri", "model_folder", "require_store"]

#: A URI scheme (``runs:/``, ``models:/``, ``mlflow-artifacts:/``, ``s3://``...), not a drive letter.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


class ModelStoreError(ConfigError):
    """A model source is neither a model folder nor a model of the tracking store; names both."""


def is_mlflow_uri(source: str) -> bool:
    """True when ``source`` is a URI (``runs:/...``, ``models:/...``), False for a file path."""
    return bool(_URI.match(source))


def _local_store(tracking_uri: str) -> Path | None:
    """The file or folder of a local store (``sqlite:///``, ``file:``, a path); None for a server."""
    if tracking_uri.startswith("sqlite:///"):
        name = tracking_uri.removeprefix("sqlite:///")
        return None if name.startswith(":memory:") else Path(unquote(name))
    if tracking_uri.startswith("file:"):
        return Path(unquote(urlparse(tracking_uri).path))
    return None if is_mlflow_uri(tracking_uri) else Path(tracking_uri)


def require_store(tracking_uri: str, what: str) -> None:
    """Raise :class:`ModelStoreError` when the local store ``tracking_uri`` does not exist.

    ``what`` says what was looked up (the model URI, a run), for the message.
    """
    local = _local_store(tracking_uri)
    if local is not None and not local.exists():
        raise ModelStoreError(
            f"{what}: the tracking store {tracking_uri} does not exist ({local}); name the store "
            "the federation used (make predict ... TRACKING_URI=<its store>, as its summary "
            "prints), or copy the model's folder to this machine and pass MODEL=/abs/folder")


def model_folder(source: str, download_to: Path) -> Path:
    """The local folder of the model ``source`` (a model folder, or an MLflow URI downloaded
    into ``download_to`` from MLflow's current tracking store).

    Raises
    ------
    ModelStoreError
        If ``source`` is a path that is not a model folder (no ``MLmodel``), the store does
        not exist, or the store has no such model (names the source and the store).
    """
    if not is_mlflow_uri(source):
        folder = Path(source).expanduser().resolve()
        if not (folder / "MLmodel").is_file():
            raise ModelStoreError(f"MODEL {source}: not a model folder (no MLmodel file in "
                                  f"{folder}) nor an MLflow URI (runs:/<run id>/best-model, "
                                  "models:/<name>/<version>)")
        return folder
    import mlflow  # here: importing MLflow costs seconds, a local folder does not need it

    store = mlflow.get_tracking_uri()
    require_store(store, f"MODEL {source}")
    try:
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=source,
                                                        dst_path=str(download_to)))
    except Exception as exc:  # noqa: BLE001 - MLflow raises many types (missing run, model, store)
        text = str(exc).strip().splitlines()
        raise ModelStoreError(f"MODEL {source}: not found in the tracking store {store} "
                              f"({type(exc).__name__}: {text[0] if text else ''})") from exc
