"""Fixtures of the app tests: the egress filter's genuine federations, run once per session."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.app.egress_runs import Capture, run


@pytest.fixture(scope="session")
def egress_run(tmp_path_factory, mlflow_store) -> Callable[[str], Capture]:
    """``get(name)``: the exchanges of federation ``name`` (:data:`tests.app.egress_runs.RUNS`),
    run on first use and kept for the session."""
    runs: dict[str, Capture] = {}

    def get(name: str) -> Capture:
        if name not in runs:
            folder = tmp_path_factory.mktemp(f"egress-{name}")
            runs[name] = run(name, folder, mlflow_store(folder / "mlflow"))
        return runs[name]

    return get
