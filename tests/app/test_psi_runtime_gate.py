"""The hospital's runtime counts the PSI requests a site serves, per dataset (issue #46, found 4).

The worker counts them too (clients/vertical/psi_stages.py); the runtime's count is the
hospital's own, in its folder the sandboxed worker never sees, and no new federation id
resets it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from app.site_runtime.dataset_census import DatasetCensus
from app.site_runtime.runtime_gate import SiteFacts, admit
from clients.site.policy import PolicyRefusal, load_policy
from clients.site.query_budget import PSI_REQUESTS, answered
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from tests.clients.policy_files import write_policy

POLICY = "[vertical]\nallowed = true\nmax-psi-requests = 3\n"
RUN = {"task": "cxr-cls", "image-size": 32, "batch-size": 4}


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """The ids Flower's Message needs, as the runner's pull sets them."""
    for name, value in (("_task_id", 3), ("_run_id", 1), ("_node_id", 7)):
        monkeypatch.setattr(TaskIdentity, name, value)


def psi_step(federation: str, serve: int, carried: int | None = None) -> Message:
    """A ``psi-step`` asking to serve ``serve`` requests, carrying ``carried`` of them."""
    config = ConfigRecord({keys.VERTICAL_STAGE: "psi-step", keys.FEDERATION: federation,
                           "psi-serve": serve})
    arrays = ArrayRecord({f"request-{n}": Array(np.zeros(8, np.uint8))
                          for n in range(serve if carried is None else carried)})
    return Message(RecordDict({keys.CONFIG: config, keys.ARRAYS: arrays}), dst_node_id=7,
                   message_type=keys.VERTICAL_MESSAGE_TYPE)


def gate(tmp_path: Path, message: Message, site: str = "site"):
    facts = SiteFacts("hospital-a", tmp_path / site, tmp_path / site / ".fedmed-state")
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config=RUN)
    return admit(message, context, load_policy(write_policy(tmp_path, POLICY)), facts,
                 DatasetCensus(tmp_path / "runtime"))


def test_served_psi_requests_are_counted_per_dataset_across_federations(tmp_path):
    assert gate(tmp_path, psi_step("fed-1", 2)).stage == "psi-step"
    assert gate(tmp_path, psi_step("fed-1", 0)).stage == "psi-step"  # a finish serves nothing
    assert gate(tmp_path, psi_step("fed-2", 1)).stage == "psi-step"
    runtime = tmp_path / "site" / ".fedmed-state" / "runtime" / "queries"
    assert answered(runtime, tmp_path / "site", PSI_REQUESTS) == 3
    for federation in ("fed-2", "fed-3"):
        with pytest.raises(PolicyRefusal) as refused:
            gate(tmp_path, psi_step(federation, 1))
        assert refused.value.rule == "vertical.max-psi-requests"
    assert gate(tmp_path, psi_step("fed-3", 1), site="other-site").stage  # its own count


def test_a_psi_serve_naming_requests_the_message_does_not_carry_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="psi-serve"):
        gate(tmp_path, psi_step("fed-1", 10 ** 9, carried=2))
    with pytest.raises(ConfigError, match="psi-serve"):
        gate(tmp_path, psi_step("fed-1", 2, carried=1))
