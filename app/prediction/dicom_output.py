"""The DICOM results of ``make predict``: a SEG or an SR per item in ``OUT/dicom``, indexed in ``dicom.csv``.

Each item's predictor hands over what its DICOM result is made of
(:attr:`clients.prediction.predictor.ItemResult.dicom`): a segmentation's mask over its
source series becomes a DICOM-SEG (DICOM PS3.3 A.51, :mod:`clients.prediction.dicom_seg`),
a classifier's probabilities a TID 1500 measurement report (PS3.16 TID 1500,
:mod:`clients.prediction.dicom_sr`), both in the source's study, made by the model
:func:`model_identity` names. Each is saved as ``dicom/<item>.seg.dcm`` /
``dicom/<item>.sr.dcm`` (a DICOM Part 10 file, explicit VR little endian), ready for a
PACS client to send (STOW-RS, C-STORE); ``dicom.csv`` lists every item with its file and
UIDs, or, for an item whose source is not DICOM (a PNG radiograph, a NIfTI volume) or
does not fit the prediction, the reason no object was written (one line naming the
file or folder). The NIfTI masks and CSV tables are written as before.
:func:`written_files` lists the objects of ``dicom.csv``, what ``--store-to`` stores
(:mod:`clients.pacs.store`).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from app.model_source import LoggedModel
from app.prediction.output import DICOM_INDEX, write_table
from clients.errors import DicomResultError
from clients.prediction.dicom_source import ModelIdentity
from clients.prediction.items import PredictionItem, output_name
from clients.prediction.predictor import DICOM, DicomContent

__all__ = ["DICOM_INDEX", "model_identity", "DicomResults", "written_files"]

_REGISTERED = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>[^/]+)|@(?P<alias>[^/]+))$")


def _alias_version(name: str, alias: str) -> str:
    """The registered version ``alias`` points to; ``@alias`` when the registry does not answer."""
    try:
        from mlflow import MlflowClient  # here: importing MLflow costs seconds

        return str(MlflowClient().get_model_version_by_alias(name, alias).version)
    except Exception:  # noqa: BLE001 - any registry failure leaves the alias as the version
        return f"@{alias}"


def model_identity(logged: LoggedModel, software_version: str) -> ModelIdentity:
    """The name and version of the model ``make predict`` loaded, from its MLflow source.

    ``models:/<name>/<version>`` (and ``models:/<name>@<alias>``, the alias resolved in
    the registry) give the registered name and version; ``runs:/<run id>/<path>`` the
    logged model's path and ``run <run id>``; a model folder its folder name and the run
    that logged it (``run <id>``, from its ``MLmodel``; ``unversioned`` without one).
    Values are cut to 64 characters (DICOM LO).

    Parameters
    ----------
    logged : LoggedModel
        The model (its ``uri`` and ``run_id``).
    software_version : str
        The product's version (Software Versions of the objects).
    """
    uri, run = logged.uri, logged.run_id
    match = _REGISTERED.match(uri)
    if match and match["version"]:
        name, version = match["name"], match["version"]
    elif match:
        name, version = match["name"], _alias_version(match["name"], match["alias"])
    elif uri.startswith("runs:/"):
        run_part, _, path = uri.removeprefix("runs:/").partition("/")
        name, version = path.strip("/") or "model", f"run {run or run_part}"
    else:
        name = Path(uri).name or uri
        version = f"run {run}" if run else "unversioned"
    return ModelIdentity(name[:64] or "model", version[:64], software_version[:64] or "unknown")


class DicomResults:
    """Writes each item's DICOM result into ``out/dicom`` and lists them in ``out/dicom.csv``.

    Parameters
    ----------
    out : Path
        The output folder.
    identity : ModelIdentity
        The model that made the predictions.
    """

    header = ("id", "kind", "file", "study_instance_uid", "series_instance_uid",
              "sop_instance_uid", "reason")

    def __init__(self, out: Path, identity: ModelIdentity) -> None:
        self.out, self.identity = out, identity
        self.rows: list[list[object]] = []
        self._taken: set[str] = set()

    def write(self, item: PredictionItem, content: DicomContent | None) -> str:
        """Write ``item``'s result (nothing when ``content`` is None) and return the progress note.

        A source that is not DICOM or does not fit the prediction writes no object: its
        ``dicom.csv`` row and the returned note give the reason, naming the file or folder.
        """
        if content is None:
            return ""
        try:
            dataset = content.dataset(self.identity)
        except DicomResultError as exc:
            self.rows.append([item.item_id, content.kind, "", "", "", "", str(exc)])
            return f"no {content.kind}: {exc}"
        name = output_name(item.item_id, content.suffix, self._taken)
        (self.out / DICOM).mkdir(exist_ok=True)
        dataset.save_as(self.out / DICOM / name, enforce_file_format=True)
        self.rows.append([item.item_id, content.kind, f"{DICOM}/{name}", dataset.StudyInstanceUID,
                          dataset.SeriesInstanceUID, dataset.SOPInstanceUID, ""])
        return f"{content.kind} {DICOM}/{name}"

    def finish(self) -> Path | None:
        """Write ``dicom.csv`` (when any item had a DICOM result) and return its path."""
        if not self.rows:
            return None
        return write_table(self.out / DICOM_INDEX, self.header, self.rows)


def written_files(out: Path) -> list[Path]:
    """The DICOM objects ``dicom.csv`` in ``out`` lists, in its order (none without it)."""
    index = Path(out) / DICOM_INDEX
    if not index.is_file():
        return []
    with index.open(newline="", encoding="utf-8") as handle:
        return [Path(out) / row["file"] for row in csv.DictReader(handle) if row["file"]]
