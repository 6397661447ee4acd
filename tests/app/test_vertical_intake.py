"""A vertical stage's replies go through the one exchange and its reply intake (#45).

A malformed reply (a record of the wrong kind, a metric that is no number) is parsed once,
at the intake: where the protocol can go on without the site (pvFed's rounds) it is
dropped with its reason logged; where it cannot (the PSI needs every party, ``describe``)
the federation stops with a :class:`VerticalError` naming the site (its department once
``describe`` named it, else its node) and the reason, never
a KeyError or AttributeError from deep in a flow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord

from app.engine import VirtualSite, run_federation
from app.engine.virtual_site import default_handler
from app.vertical.messages import Traffic, VerticalError, send_stage
from app.vertical.psi_flow import align
from strategies.wire import message_keys as keys
from tests.app.test_psi_federation import vertical_context
from tests.app.test_pvfed_federation import DEPARTMENTS, write_department
from tests.app.test_vertical_plumbing import _grid

pytestmark = pytest.mark.usefixtures("server_identity")

Corrupt = Callable[[Message], None]


def _wrong_kind(reply: Message) -> None:
    """The reply's arrays as a ConfigRecord (a record of the wrong kind)."""
    reply.content[keys.VERTICAL] = ConfigRecord({"embedding.weight": "not an array"})


def _corrupting(stage: str, server_round: int, corrupt: Corrupt):
    """The ClientApp, with its reply to ``stage`` of ``server_round`` corrupted."""
    def handler(message: Message, context: Context) -> Message:
        reply = default_handler()(message, context)
        config = message.content[keys.CONFIG]
        if (config.get(keys.VERTICAL_STAGE), config.get(keys.SERVER_ROUND)) == (stage,
                                                                               server_round):
            corrupt(reply)
        return reply
    return handler


@pytest.mark.usefixtures("one_torch_thread")
def test_pvfed_drops_a_malformed_round_reply_and_goes_on(tmp_path, mlflow_store, caplog):
    sites = [VirtualSite.folder(
        write_department(tmp_path / name, name, patients, signal),
        site_name=f"hospital-{name}", state_dir=tmp_path / f"state-{name}",
        handler=_corrupting("pvfed-round", 1, _wrong_kind) if name == "cath-lab" else None)
        for name, (patients, signal) in DEPARTMENTS.items()]
    with caplog.at_level(logging.WARNING):
        outcome = run_federation({
            "federation.kind": "vertical", "vertical.method": "pvfed", "task": "tabular-cls",
            "vertical.aggregation": "pca", "vertical.dim": 4, "vertical.local-epochs": 5,
            "vertical.encoder-epochs": 20, "vertical.global-epochs": 20,
            "vertical.head-epochs": 5, "num-server-rounds": 2, "batch-size": 16,
            "min-nodes": 3, "node-wait-timeout": 10, "experiment": "pvfed-intake",
            "tracking-uri": mlflow_store(tmp_path / "mlflow"),
            "artifact-root": str(tmp_path / "artifacts")}, sites)
    dropped = [r.getMessage() for r in caplog.records if "dropped reply" in r.getMessage()]
    assert len(dropped) == 1 and "pvfed-round" in dropped[0] and "ConfigRecord" in dropped[0]
    # round 2 went on with the others' local encoders; cath-lab answered again
    assert sorted(outcome.result.site_metrics) == sorted(DEPARTMENTS)
    assert outcome.traffic.by_stage["pvfed-round"]["messages"] == 6


def test_a_malformed_psi_reply_stops_the_alignment_naming_the_site(tmp_path):
    ctx = vertical_context(tmp_path)
    node, site = next((n, s) for n, s in ctx.grid.sites.items()
                      if s.node_config.get("site-name") == "hospital-1")
    site.handler = _corrupting("psi-request", 0, _wrong_kind)
    with pytest.raises(VerticalError, match=f"'psi-request': node-{node} .*needs every site: "
                                            "'vertical' is ConfigRecord, not ArrayRecord"):
        align(ctx)


def test_a_metric_that_is_no_number_stops_describe_naming_the_site(tmp_path):
    def listed(reply: Message) -> None:
        reply.content[keys.METRICS] = MetricRecord({"patients": [1.0, 2.0]})

    grid = _grid(tmp_path, [None, None], ["", ""])
    nodes = sorted(grid.get_node_ids())
    grid.sites[nodes[1]].handler = _corrupting("describe", 0, listed)
    with pytest.raises(VerticalError, match="'describe': .*metric 'patients' is not a number"):
        send_stage(grid, "describe", {n: ({}, {}) for n in nodes}, federation="fed-1",
                   server_round=0, timeout=30.0, traffic=Traffic())


def test_an_array_record_under_metrics_is_refused_not_read(tmp_path):
    grid = _grid(tmp_path, [None], [""])
    node = next(iter(grid.get_node_ids()))
    grid.sites[node].handler = _corrupting(
        "describe", 0, lambda reply: reply.content.__setitem__(keys.METRICS, ArrayRecord()))
    with pytest.raises(VerticalError, match="'metrics' is ArrayRecord, not MetricRecord"):
        send_stage(grid, "describe", {node: ({}, {})}, federation="fed-1", server_round=0,
                   timeout=30.0, traffic=Traffic())
