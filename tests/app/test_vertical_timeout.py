"""A vertical stage left unanswered past ``round-timeout`` is one clear line (#47 walkthrough 2).

The walkthrough's vertical federation over TLS failed after 672 s with the timeout inside a
traceback and no hint about which size to lower. Now a required stage some sites do not
answer within ``round-timeout`` raises :class:`VerticalTimeout`: the round, the stage, the
silent sites, the run-config key to raise and the sizes that make that stage long; the
federation logs it as one ERROR line before it stops.
"""

from __future__ import annotations

import logging

import pytest

from app.engine import VirtualSite, run_federation
from app.engine.federation import full_run_config
from app.engine.grid import InProcessGrid, SiteFaults
from app.vertical.messages import Traffic, VerticalTimeout, send_stage
from tests.app.test_pvfed_federation import DEPARTMENTS, write_department

pytestmark = pytest.mark.usefixtures("server_identity")


def test_a_silent_site_in_a_required_stage_is_one_line_naming_what_to_change(tmp_path):
    sites = [VirtualSite.folder(tmp_path, site_name=f"hospital-{i}",
                                state_dir=tmp_path / f"state-{i}",
                                faults=SiteFaults(silent_from_round=2) if i else None)
             for i in range(2)]
    grid = InProcessGrid(sites, full_run_config({"federation.kind": "vertical"}), run_id=42)
    nodes = [site.node_id for site in sites]
    names = {nodes[0]: "radiology", nodes[1]: "cardiology"}
    with pytest.raises(VerticalTimeout) as raised:
        send_stage(grid, "split-train", {n: ({}, {}) for n in nodes}, federation="f",
                   server_round=2, timeout=0.5, traffic=Traffic(), names=names)
    text = str(raised.value)
    assert "\n" not in text
    assert text.startswith("vertical federation timed out in round 2, stage 'split-train': "
                           "no answer from cardiology within round-timeout=0.5 s")
    assert "raise run-config 'round-timeout'" in text and "radiology" not in text
    assert "local-steps, vertical.batches-per-message, batch-size, image-size" in text


@pytest.mark.usefixtures("one_torch_thread")
def test_the_federation_logs_the_timeout_as_one_error_line(tmp_path, mlflow_store, caplog):
    sites = [VirtualSite.folder(write_department(tmp_path / name, name, patients, signal),
                                site_name=f"hospital-{name}", state_dir=tmp_path / f"s-{name}",
                                faults=SiteFaults(silent_from_round=0) if name == "clinic"
                                else None)
             for name, (patients, signal) in DEPARTMENTS.items()]
    with caplog.at_level(logging.ERROR), pytest.raises(VerticalTimeout):
        run_federation({
            "federation.kind": "vertical", "vertical.method": "pvfed", "task": "tabular-cls",
            "num-server-rounds": 1, "min-nodes": 3, "node-wait-timeout": 10,
            "round-timeout": 1, "experiment": "vertical-timeout",
            "tracking-uri": mlflow_store(tmp_path / "mlflow"),
            "artifact-root": str(tmp_path / "artifacts")}, sites)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    timed_out = [m for m in errors if m.startswith("vertical federation timed out")]
    assert len(timed_out) == 1, errors
    assert "round 0, stage 'describe': no answer from node-" in timed_out[0]
    assert "round-timeout=1 s" in timed_out[0]
