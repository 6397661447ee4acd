"""``fedmed site init --data /abs/cohort.toml``: a site whose dataset is a cohort in its PACS.
The cohort file is checked when the site folder is made (an error names the file and key, and
nothing is written), recorded as the site's data, and ``fedmed site start`` passes it on as the
SuperNode's ``--data`` (the runtime takes a cohort file there: app/site_runtime/supernode.py)."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path

import pytest

from app.tooling.site_init import init_main, init_site, start_argv
from clients.pacs.errors import CohortError
from strategies.wire.errors import ConfigError


def _cohort(folder: Path, pacs: str = 'called-aet = "HOSPITAL00"') -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "labels.csv").write_text("study_instance_uid,split\n1.2.3,train\n1.2.4,test\n")
    path = folder / "cohort.toml"
    path.write_text('name = "pe-2024"\ntask = "pe-seg"\n\n[pacs.dimse]\n'
                    f'{pacs}\nhost = "127.0.0.1"\nport = 4242\ncalling-aet = "FEDMED"\n\n'
                    '[labels]\nsource = "seg"\ncsv = "labels.csv"\nkey = "study-instance-uid"\n')
    return path


def test_site_init_records_a_cohort_file_and_site_start_passes_it_as_the_data(tmp_path):
    cohort = _cohort(tmp_path / "pacs")
    out = io.StringIO()
    home = init_site(tmp_path / "site", "hospital-a", cohort, "fl.example.org:9092", out=out)
    assert tomllib.loads(home.settings.read_text())["data"] == str(cohort.resolve())
    argv = start_argv(home.root, [])
    assert argv[argv.index("--data") + 1] == str(cohort.resolve())
    assert argv.count("--data") == 1
    assert "site hospital-a: folder" in out.getvalue()


def test_a_bad_cohort_file_names_the_file_and_key_and_writes_nothing(tmp_path, capsys):
    cohort = _cohort(tmp_path / "pacs", pacs='called-aet = ""')
    with pytest.raises(CohortError) as refused:
        init_site(tmp_path / "site", "hospital-a", cohort, "fl.example.org:9092",
                  out=io.StringIO())
    assert str(cohort.resolve()) in str(refused.value) and "called-aet" in str(refused.value)
    assert not (tmp_path / "site").exists()
    status = init_main(["--home", str(tmp_path / "site"), "--site", "hospital-a", "--data",
                        str(cohort), "--superlink", "fl.example.org:9092"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and str(cohort.resolve()) in line and "called-aet" in line
    assert not (tmp_path / "site").exists()


def test_neither_a_folder_nor_a_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"--data .*/missing: no such folder or "
                                                     r"cohort file"):
        init_site(tmp_path / "site", "hospital-a", tmp_path / "missing", "fl.example.org:9092",
                  out=io.StringIO())
