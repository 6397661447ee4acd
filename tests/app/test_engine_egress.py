"""The in-process engine's ``egress_filter``: a site's replies pass the site runtime's egress
filter before they leave, as a hospital's runtime holds them; a refused reply leaves as the
runtime's refusal, and every check is kept on the site."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from app.config.site_config import SiteConfig
from app.engine import InProcessGrid, VirtualSite
from strategies.rounds.instructions import pack_arrays
from strategies.wire import message_keys as keys
from tests.fixtures.scripted_site import ScriptedSite

pytestmark = pytest.mark.usefixtures("server_identity")  # run 42, the SuperLink's node 1


#: An evaluate reply's metrics as the product's site sends them; and one with a name leaking text.
GENUINE = {"val-dice": 0.5}
LEAKING = {"val-dice": 0.5, "patient-0042-dice": 0.1}


def _site(folder, egress_filter: bool, metrics=GENUINE, raises: bool = False) -> VirtualSite:
    scripted = ScriptedSite("a", evaluate=lambda weights: metrics)
    policy = SiteConfig.from_node_config({"data-path": str(folder)}, "").policy().fingerprint

    def answer(message: Message, context: Context) -> Message:
        if raises:
            raise RuntimeError("the ClientApp fails")
        reply = scripted(message, context)
        reply.content[keys.SITE][keys.SITE_POLICY] = policy  # as the product's site names it
        return reply

    return VirtualSite.folder(folder, site_name="a", handler=answer, egress_filter=egress_filter)


def _evaluate(site: VirtualSite) -> Message:
    """The reply the server pulls to one evaluate instruction sent to ``site``."""
    grid = InProcessGrid([site], run_id=42)
    content = RecordDict({keys.ARRAYS: pack_arrays(ArrayRecord([np.ones(2, np.float32)])),
                          keys.CONFIG: ConfigRecord({keys.SERVER_ROUND: 1})})
    [message_id] = grid.push_messages([Message(content, dst_node_id=site.node_id,
                                               message_type=MessageType.EVALUATE)])
    [reply] = grid.pull_messages([message_id])
    return reply


def test_a_genuine_reply_passes_and_its_check_is_kept(tmp_path):
    site = _site(tmp_path, egress_filter=True)
    reply = _evaluate(site)
    assert not reply.has_error() and reply.content[keys.METRICS]["val-dice"] == 0.5
    [check] = site.egress_checks
    assert check.verdict.passed and check.seconds > 0
    assert check.message.metadata.message_id == reply.metadata.reply_to_message_id
    assert check.reply is not reply  # the runtime's copy; the server gets its own


def test_a_refused_reply_leaves_as_the_runtimes_refusal(tmp_path):
    site = _site(tmp_path, egress_filter=True, metrics=LEAKING)
    reply = _evaluate(site)
    [check] = site.egress_checks
    assert check.verdict.rule == "egress.metric-name"
    assert reply.has_error() and "egress.metric-name" in reply.error.reason
    assert "patient-0042" not in reply.error.reason


def test_without_the_option_the_reply_leaves_unchecked(tmp_path):
    site = _site(tmp_path, egress_filter=False, metrics=LEAKING)
    reply = _evaluate(site)
    assert not reply.has_error() and "patient-0042-dice" in reply.content[keys.METRICS]
    assert site.egress_checks == []


def test_a_clientapp_that_raises_is_answered_by_the_supernode_unchecked(tmp_path):
    site = _site(tmp_path, egress_filter=True, raises=True)
    reply = _evaluate(site)
    assert reply.has_error() and "the ClientApp fails" in reply.error.reason
    assert site.egress_checks == []
