"""The product's Orthanc: generated configuration, ready on /system, stopped by PID."""

from __future__ import annotations

import json
import stat
import urllib.error
import urllib.request

import pytest

from tests.pacs.conftest import stop_and_check


def test_start_answers_with_its_configuration_and_stop_leaves_no_process(orthanc_factory):
    orthanc = orthanc_factory("HOSP42")
    folder = orthanc.folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("orthanc.json", "credentials.toml"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
    config = json.loads((folder / "orthanc.json").read_text())
    assert (config["RemoteAccessAllowed"], config["AuthenticationEnabled"]) == (False, True)
    assert config["DicomWeb"]["Enable"] and config["StorageDirectory"].startswith(str(folder))
    system = json.loads(orthanc.request("/system"))
    assert (system["DicomAet"], system["HttpPort"], system["DicomPort"]) == (
        "HOSP42", orthanc.http_port, orthanc.dicom_port)
    assert json.loads(orthanc.request("/dicom-web/studies")) == []
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(f"{orthanc.url}/system", timeout=5)
    stop_and_check(orthanc)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{orthanc.url}/system", timeout=2)
