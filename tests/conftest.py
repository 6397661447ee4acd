"""Shared pytest setup: GPU-only tests skip on machines without CUDA; Flower task identities;
a migrated MLflow store."""

from __future__ import annotations

import pytest
import torch


#: The real-process test files in two groups, each run by one xdist worker and started
#: first (they run longest), so at most two of them run at a time beside the unit tests.
#: "ray": the files that start a local Ray (two Rays starting at once on two loaded cores
#: once missed Ray's hard-coded 30 s raylet start in CI), with the SuperLink-faults test
#: (a SuperLink of its own) to even out the two; "deployment": the files that share one
#: TLS SuperLink. Every other file is its own group.
PROCESS_GROUPS = {
    "tests/integration/test_simulation.py": "ray",
    "tests/integration/test_simulation_secagg.py": "ray",
    "tests/integration/test_simulation_vertical.py": "ray",
    "tests/integration/test_simulation_pruning.py": "ray",
    "tests/integration/test_simulation_scaffold.py": "ray",
    "tests/integration/test_ray_cluster.py": "ray",
    "tests/integration/test_deployment_superlink_faults.py": "ray",
    "tests/integration/test_deployment.py": "deployment",
    "tests/integration/test_deployment_faults.py": "deployment",
    "tests/integration/test_deployment_proxy.py": "deployment",
    "tests/integration/test_deployment_vertical.py": "deployment",
    # one wheel built and installed into a fresh venv (tests/integration/wheel_venv.py)
    "tests/integration/test_wheel_install.py": "wheel",
    "tests/integration/test_deployment_walkthrough.py": "wheel",
    # not a shared process, but minutes of real `mlflow server` starts: scheduled first
    "tests/integration/test_tracking_outage_end.py": "mlflow-outage",
}


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (``make test``) with the groups above as files.

    (xdist's ``loadgroup`` cannot be used: xdist 3.8 names a test's group by
    assigning ``item._nodeid``, which pytest 9 no longer reads.)
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # noqa: PLC0415 - only with xdist

    class ProcessGroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return PROCESS_GROUPS.get(path, path)

    return ProcessGroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    # `make test` keeps this order (--no-loadscope-reorder): the process groups start first.
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in PROCESS_GROUPS)
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


@pytest.fixture()
def one_torch_thread():
    """Tiny tensors on a shared 2-core machine: one torch thread avoids oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
