"""One Orthanc per hospital on loopback: Debian's PACS, for the tests and the demo.

:meth:`OrthancProcess.start` writes a generated configuration into a folder the
product creates (mode 0700) and starts ``/usr/sbin/Orthanc`` on it, in its own
process group (:func:`~app.tooling.daemon.spawn_daemon`); it returns once Orthanc
answers ``GET /system`` with the generated credentials (polled, never a fixed sleep)
and :meth:`~app.tooling.daemon.DaemonProcess.stop` stops it by PID, with every process
it started. The folder holds::

    <folder>/orthanc.json          the configuration (0600)
    <folder>/credentials.toml      username, password: what a cohort file names (0600)
    <folder>/storage/              Orthanc's index (SQLite) and its DICOM files
    <folder>/orthanc.log           its output

The configuration: AE title and free DICOM and HTTP ports, the DICOMweb plugin on
``/dicom-web/``, HTTP basic authentication with one generated user, no remote access
(``RemoteAccessAllowed`` false: HTTP answers loopback only), no Lua, no REST writes to
the file system, no saved jobs; DIMSE queries and retrieves only from the AE titles
in ``peers`` (``DicomModalities``, host checked), which may C-GET. Orthanc sends no
telemetry. Debian's Orthanc 1.10 binds its DICOM port on every interface (it has no
bind option); the allow-list above is what guards it.

Why here: Orthanc is a local daemon the product starts, like the SuperLink
(:mod:`app.tooling.superlink`); a hospital's real PACS is never started by the product.
The PACS *client* (cohort file, DICOMweb/DIMSE transports, the sync) is site-side data
access without Flower, so it lives in :mod:`clients.pacs`, which the site runtime
calls outside the sandbox.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from app.tooling.daemon import DaemonProcess, poll_until, spawn_daemon
from app.tooling.environment import free_port
from app.tooling.errors import FlowerProcessError

__all__ = ["ORTHANC", "DICOMWEB_PLUGIN", "OrthancProcess", "orthanc_available"]

ORTHANC = Path("/usr/sbin/Orthanc")
DICOMWEB_PLUGIN = Path("/usr/share/orthanc/plugins/libOrthancDicomWeb.so")


def orthanc_available() -> str:
    """"" when Debian's Orthanc and its DICOMweb plugin are installed, else what is missing."""
    missing = [str(p) for p in (ORTHANC, DICOMWEB_PLUGIN) if not p.is_file()]
    return ", ".join(missing) and f"missing {', '.join(missing)} (apt-get install orthanc orthanc-dicomweb)"


def _private_file(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


@dataclass
class OrthancProcess(DaemonProcess):
    """An Orthanc we started: its folder, AE title, ports and credentials."""

    folder: Path = Path()
    aet: str = "ORTHANC"
    dicom_port: int = 0
    http_port: int = 0
    username: str = "fedmed"
    password: str = field(default="", repr=False)

    @property
    def url(self) -> str:
        """Base URL of its REST API."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def dicomweb_url(self) -> str:
        """Base URL of its DICOMweb API."""
        return f"{self.url}/dicom-web"

    @property
    def credentials_file(self) -> Path:
        """The TOML file with its username and password (what a cohort file names)."""
        return self.folder / "credentials.toml"

    @classmethod
    def start(cls, folder: Path, aet: str = "ORTHANC", peers: dict[str, tuple[str, int]] | None = None,
              startup_timeout: float = 60.0) -> OrthancProcess:
        """Write the configuration into ``folder`` (created, 0700) and start Orthanc on it.

        Parameters
        ----------
        folder : Path
            Its folder; created by the product (a folder holding anything but a
            previous Orthanc of ours is refused).
        aet : str
            Its AE title.
        peers : dict, optional
            ``name -> (AE title, port)`` of the DIMSE peers on 127.0.0.1 allowed to
            echo, find, get and move (the sync's AE title).
        startup_timeout : float
            Seconds to wait for ``/system`` to answer.

        Raises
        ------
        FlowerProcessError
            Orthanc is missing, exits, or does not answer in time (it is stopped then).
        """
        missing = orthanc_available()
        if missing:
            raise FlowerProcessError(f"cannot start Orthanc: {missing}")
        folder = Path(folder)
        if folder.exists() and any(folder.iterdir()) and not (folder / "orthanc.json").is_file():
            raise FlowerProcessError(f"{folder} is not an Orthanc folder of ours; refusing to use it")
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        password = secrets.token_urlsafe(18)
        dicom_port, http_port = free_port(), free_port()
        while http_port == dicom_port:
            http_port = free_port()
        config = {
            "Name": aet, "DicomAet": aet, "DicomPort": dicom_port, "HttpPort": http_port,
            "RemoteAccessAllowed": False, "AuthenticationEnabled": True,
            "RegisteredUsers": {"fedmed": password},
            "StorageDirectory": str(folder / "storage"), "IndexDirectory": str(folder / "storage"),
            "Plugins": [str(DICOMWEB_PLUGIN)],
            "DicomWeb": {"Enable": True, "Root": "/dicom-web/", "EnableWado": False},
            "DicomModalities": {name: {"AET": peer_aet, "Host": "127.0.0.1", "Port": port,
                                       "AllowEcho": True, "AllowFind": True, "AllowGet": True,
                                       "AllowMove": True, "AllowStore": True}
                                for name, (peer_aet, port) in (peers or {}).items()},
            "DicomCheckModalityHost": True, "DicomCheckCalledAet": True,
            "DicomAlwaysAllowEcho": False, "DicomAlwaysAllowStore": False,
            "DicomAlwaysAllowFind": False, "DicomAlwaysAllowGet": False, "DicomAlwaysAllowMove": False,
            "ExecuteLuaEnabled": False, "RestApiWriteToFileSystemEnabled": False,
            "SaveJobs": False, "StableAge": 1, "HttpDescribeErrors": True,
        }
        _private_file(folder / "orthanc.json", json.dumps(config, indent=2))
        _private_file(folder / "credentials.toml", f'username = "fedmed"\npassword = "{password}"\n')
        daemon = spawn_daemon([str(ORTHANC), str(folder / "orthanc.json")], dict(os.environ),
                              folder / "orthanc.log", f"Orthanc {aet}", cwd=folder)
        orthanc = cls(process=daemon.process, log_file=daemon.log_file, name=daemon.name,
                      log_offset=daemon.log_offset, folder=folder, aet=aet, dicom_port=dicom_port,
                      http_port=http_port, password=password)
        try:
            if not poll_until(orthanc.answers, startup_timeout, watch=[orthanc], interval=0.1):
                raise FlowerProcessError(f"Orthanc {aet} did not answer {orthanc.url}/system after "
                                         f"{startup_timeout:.0f} s; see {orthanc.log_file}")
        except BaseException:
            orthanc.stop()
            raise
        return orthanc

    def request(self, path: str, data: bytes | None = None, method: str = "GET") -> bytes:
        """One authenticated REST call (``urllib``); HTTP errors raise ``urllib.error.HTTPError``."""
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        call = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                      headers={"Authorization": f"Basic {token}"})
        with urllib.request.urlopen(call, timeout=30) as response:
            return response.read()

    def answers(self) -> bool:
        """Whether ``GET /system`` answers with this Orthanc's AE title."""
        try:
            return json.loads(self.request("/system")).get("DicomAet") == self.aet
        except (OSError, ValueError):  # refused while starting, not JSON yet
            return False

    def upload(self, files: list[Path]) -> list[str]:
        """Store DICOM files through ``POST /instances``; return their Orthanc instance ids."""
        return [json.loads(self.request("/instances", data=path.read_bytes(), method="POST"))["ID"]
                for path in files]

    def delete_study(self, study_uid: str) -> None:
        """Delete one study (by StudyInstanceUID) from this PACS."""
        found = json.loads(self.request("/tools/lookup", data=study_uid.encode(), method="POST"))
        for item in found:
            if item["Type"] == "Study":
                self.request(f"/studies/{item['ID']}", method="DELETE")

    def remove_folder(self) -> None:
        """Stop it, then delete its folder (which the product created)."""
        self.stop()
        if (self.folder / "orthanc.json").is_file():
            shutil.rmtree(self.folder)
