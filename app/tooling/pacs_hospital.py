"""A synthetic hospital loaded into its Orthanc, with the cohort file that reads it back.

:func:`load_hospital` takes a pe-seg site folder (``python -m clients.datagen
synthetic --task pe-seg`` writes them: ``manifest.csv`` + DICOM series + NIfTI masks),
stores every series in an :class:`~app.tooling.orthanc.OrthancProcess` through its
REST ``/instances``, and writes next to it what a hospital would hold outside its PACS:

    <out>/labels.csv     study_instance_uid,split,mask,study_id (the manifest's masks and ids)
    <out>/<name>.toml    the cohort file (clients/pacs/cohort.py) over DICOMweb or DIMSE

so syncing the cohort (:func:`clients.pacs.sync.sync_cohort`) gives back the folder's
manifest, study for study.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pydicom

from app.tooling.orthanc import OrthancProcess
from clients.io.dicom_series import list_series_files
from clients.pe_seg.manifest import read_manifest

__all__ = ["load_hospital", "write_cohort_file", "SYNC_AET"]

#: The AE title the sync calls from (an Orthanc started for DIMSE lists it as a peer).
SYNC_AET = "FEDMED"


def load_hospital(orthanc: OrthancProcess, site_dir: Path, out_dir: Path) -> Path:
    """Upload a pe-seg site folder's series into ``orthanc``; write and return ``labels.csv``.

    The labels' ``mask`` column names the site folder's masks (absolute paths).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for entry in read_manifest(Path(site_dir)):
        files = list_series_files(entry.image_dir)
        orthanc.upload(files)
        study_uid = pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID
        rows.append([study_uid, entry.split, str(entry.mask_path), entry.study_id])
    labels = out_dir / "labels.csv"
    with open(labels, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["study_instance_uid", "split", "mask", "study_id"])
        writer.writerows(rows)
    return labels


def write_cohort_file(orthanc: OrthancProcess, out_dir: Path, transport: str = "dicomweb",
                      name: str = "cohort", extra: str = "") -> Path:
    """Write ``out_dir/<name>.toml``, the cohort file ``name`` for ``orthanc`` (``transport``: ``dicomweb`` or ``dimse``).

    ``extra`` is appended as it is (more sections: ``[query]``, ``[series]``).
    """
    sections = {
        "dicomweb": f'[pacs.dicomweb]\nurl = "{orthanc.dicomweb_url}"\n'
                    f'credentials = "{orthanc.credentials_file}"\n',
        "dimse": f'[pacs.dimse]\ncalled-aet = "{orthanc.aet}"\nhost = "127.0.0.1"\n'
                 f'port = {orthanc.dicom_port}\ncalling-aet = "{SYNC_AET}"\n',
    }
    path = Path(out_dir) / f"{name}.toml"
    path.write_text(f'name = "{name}"\ntask = "pe-seg"\n\n{sections[transport]}\n'
                    '[labels]\ncsv = "labels.csv"\nkey = "study-instance-uid"\n\n'
                    '[sync]\nretries = 2\nbackoff-s = 0.1\n' + extra, encoding="utf-8")
    return path
