"""Shared pytest setup: GPU-only tests skip on machines without CUDA; Flower task identities;
a migrated MLflow store."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory):
    """``make(folder) -> tracking URI``: a fresh sqlite MLflow store in ``folder``.

    MLflow migrates a new sqlite store's schema on first use (about 10 s on a
    loaded 2-core machine); the migrated empty store is made once per test
    process and copied, so each test still gets a store of its own.
    """
    import shutil  # noqa: PLC0415

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: PLC0415

    template = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    SqlAlchemyStore(f"sqlite:///{template}", (template.parent / "artifacts").as_uri())

    def make(folder) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(template, folder / "mlflow.db")
        return f"sqlite:///{folder / 'mlflow.db'}"

    return make


def _identity(node_id: int):
    from flwr.supercore.task_identity import TaskIdentity  # noqa: PLC0415

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 42, node_id
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


@pytest.fixture()
def server_identity():
    """Flower needs the identity of the running task to create messages (a ServerApp's here)."""
    yield from _identity(1)


@pytest.fixture()
def site_identity():
    """The identity of a ClientApp's task on node 7, to create and answer messages as a site."""
    yield from _identity(7)
