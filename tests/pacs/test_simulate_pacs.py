"""``make simulate DATA=pacs``: the federation from one Orthanc per hospital equals the folders'.

``python -m app.tooling.simulate --data-source pacs`` (:func:`app.tooling.simulate.main`,
in-process engine) over two small synthetic hospitals: each is loaded into its Orthanc,
synced over DICOMweb, and federated; the run's metrics (all but the timings) equal those of the same seed
over the folders, and no Orthanc is left running.
"""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from app.tooling.simulate import main
from tests.integration.conftest import write_small_hospitals
from tests.pacs.conftest import require_orthanc


def _simulate(tmp_path, data_root, store, *extra: str) -> int:
    return main(["--engine", "local", "--sites", "2", "--data-root", str(data_root),
                 "--tracking-uri", store, "--artifact-root", str(tmp_path / "artifacts"),
                 "-c", "num-server-rounds=1", "-c", "image-size=32", "-c", "local-steps=2",
                 "-c", "seed=0", "-c", f'checkpoint-dir="{tmp_path / "checkpoints"}"', *extra])


def _metrics(store: str) -> dict[str, float]:
    client = MlflowClient(store)
    experiments = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(experiments)
    return {key: value for key, value in run.data.metrics.items() if "seconds" not in key}


def test_the_federation_from_the_pacs_equals_the_one_from_the_folders(tmp_path, mlflow_store, capsys):
    require_orthanc()
    write_small_hospitals(tmp_path / "data", seed=0)
    folders, pacs = mlflow_store(tmp_path / "folders"), mlflow_store(tmp_path / "pacs")
    assert _simulate(tmp_path, tmp_path / "data", folders) == 0
    assert _simulate(tmp_path, tmp_path / "data", pacs, "--data-source", "pacs",
                     "--pacs-dir", str(tmp_path / "work")) == 0
    out = capsys.readouterr().out
    for name in ("hospital-00", "hospital-01"):
        assert f"{name}: synced 4 studies over DICOMweb (4 fetched" in out
        assert (tmp_path / "work" / "data" / "state" / "pacs" / name / "manifest.csv").is_file()
        assert not (tmp_path / "work" / "data" / name / "orthanc").exists()
    assert "stopped 2 Orthanc(s)" in out
    expected, got = _metrics(folders), _metrics(pacs)
    assert "test/dice" in expected
    assert got == expected
