"""One federation run by ``python -m app.tooling.simulate`` (what ``make simulate`` runs: a real
SuperLink, `flwr run`, Ray) for the simulation tests, and its one MLflow run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from app.tooling.daemon import spawn_daemon

ROOT = Path(__file__).resolve().parents[2]
#: An upper bound only (a healthy two-site run takes about a minute on 2 idle cores).
FEDERATION_TIMEOUT = 1500


@contextmanager
def simulated_federation(tmp: Path, data_root: Path, sites: int, run_config: Sequence[str],
                         experiment: str, tracking: str,
                         timeout: float = FEDERATION_TIMEOUT) -> Iterator[tuple[MlflowClient, Run]]:
    """Run the federation of ``sites`` sites under ``data_root`` with ``run_config``
    (``key=value`` items; ``experiment`` names its MLflow experiment) to its end; yield the
    MLflow client and the federation's one run; stop the process on the way out."""
    command = [sys.executable, "-m", "app.tooling.simulate", "--data-root", str(data_root),
               "--sites", str(sites), "--tracking-uri", tracking,
               "--artifact-root", str(tmp / "artifacts"), "--flwr-home", str(tmp / "flwr-home"),
               "--log-dir", str(tmp / "logs"), "--timeout", str(timeout - 60)]
    for item in run_config:
        command += ["-c", item]
    process = spawn_daemon(command, {**os.environ, "PYTHONPATH": str(ROOT)},
                           tmp / "federation.log", f"simulate-{experiment}", cwd=ROOT)
    try:
        code = process.process.wait(timeout=timeout)
        assert code == 0, process.log_text()[-8000:]
        client = MlflowClient(tracking_uri=tracking)
        runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        assert len(runs) == 1
        yield client, runs[0]
    finally:
        process.stop()
