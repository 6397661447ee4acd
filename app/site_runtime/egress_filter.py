"""The hospital's egress filter: every reply is checked by the runtime before it leaves the site.

Issue #44, item 3. The app bundle's worker answers a message; the site runtime
(the hospital's installed copy of ``app/site_runtime/``, never the bundle's code)
holds the reply to what the message's type and its instruction allow before it is
pushed, so an approved but malicious bundle cannot send more than the product's own
site would (NVIDIA FLARE applies its privacy filters in the site runtime likewise):

>>> egress = EgressFilter()
>>> verdict = egress.check(message, reply, context, policy.fingerprint)
>>> outgoing = reply if verdict.passed else refusal_reply(message, site, verdict)

Keyed by the message type (``train``, ``evaluate``, ``query``, ``train.vertical``),
the rules (:data:`~app.site_runtime.egress_refusal.RULES`), in the order checked:

1. ``egress.metadata`` -- the reply's type, group, nodes and run are the message's;
2. ``egress.error`` -- an error reply: a fixed code and a sanitised reason only
   (:func:`~app.site_runtime.egress_records.check_error`);
3. ``egress.record-keys`` -- exactly the records of its type: a train reply
   ``metrics``, ``site`` and ``delta`` (a SecAgg+ stage: ``secagg`` instead of
   ``delta`` at setup, share-keys and unmask), an evaluate or query reply ``metrics``
   and ``site``, a vertical reply ``vertical``, ``metrics`` and ``site``;
4. ``egress.instruction`` / ``egress.model-unknown`` -- what the instruction allows
   is read from it (:mod:`~app.site_runtime.egress_instruction`);
5. ``egress.bytes`` -- the serialised reply (:func:`strategies.rounds.reply_intake.wire_size`)
   within the budget: what the instruction's arrays and codec allow at most
   (:func:`~app.site_runtime.egress_arrays.update_bound`, the SecAgg+ entries'
   sizes) plus Flower's framing per array and :data:`MESSAGE_ALLOWANCE`;
6. ``egress.text`` -- the site record and SecAgg+ entries hold only their bounded
   values (:mod:`~app.site_runtime.egress_records`, :mod:`~app.site_runtime.egress_secagg`);
7. ``egress.metric-name``, ``egress.metric-range``, ``egress.steps`` -- declared
   metrics of the type, in range, steps <= tau;
8. ``egress.array-name``, ``egress.array-shape``, ``egress.payload`` -- the arrays
   (:mod:`~app.site_runtime.egress_arrays`, :mod:`~app.site_runtime.egress_vertical`).

A check that fails unexpectedly refuses the reply (``egress.unchecked``): the
filter fails closed. The filter keeps one state, :class:`FederationMemory`: per
site and federation, what an instruction may leave out (the dense model's layout
under a compressed downlink, a pruning mask's full shapes, a vertical federation's
aligned patients, feature width and site part), in memory only.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord

from app.config.site_config import SiteConfig
from app.site_runtime.egress_arrays import check_masked, check_update, update_bound
from app.site_runtime.egress_instruction import Asked, FederationMemory, asked_of
from app.site_runtime.egress_records import check_error, check_metrics, check_site_record
from app.site_runtime.egress_refusal import (PASSED, RULES, EgressRefusal, EgressVerdict,
                                             refusal_reply)
from app.site_runtime.egress_secagg import check_protocol, protocol_bound
from app.site_runtime.egress_vertical import check_vertical
from strategies.rounds.reply_intake import wire_size
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError

__all__ = ["FRAMING_BYTES_PER_ARRAY", "FRAMING_BYTES_PER_MIB", "MESSAGE_ALLOWANCE", "RULES",
           "EgressFilter", "EgressVerdict", "PASSED", "refusal_reply", "site_of"]

log = logging.getLogger("fedmed.site_runner")

#: Bytes a reply may hold beyond its arrays: its metrics, its site record and Flower's heads
#: of the message's records. A train reply's twelve metrics and site record take 756 bytes
#: serialised; 16 KiB leaves a margin of 20 for longer names, never room for a payload.
MESSAGE_ALLOWANCE = 16 * 1024
#: Flower's framing of one ``Array``: its object head and JSON (dtype, shape, chunk ids),
#: its record's entry and numpy's 128-byte ``.npy`` header (measured 612 bytes, one chunk).
FRAMING_BYTES_PER_ARRAY = 1024
#: And per MiB of array data: an ``ArrayChunk``'s head per 5 MB chunk (measured ~50 bytes).
FRAMING_BYTES_PER_MIB = 64

_MIB = 1 << 20
_RECORDS = {"train": (keys.METRICS, keys.SITE, keys.DELTA), "evaluate": (keys.METRICS, keys.SITE),
            "query": (keys.METRICS, keys.SITE),
            keys.VERTICAL_MESSAGE_TYPE: (keys.VERTICAL, keys.METRICS, keys.SITE)}
_KINDS = {keys.DELTA: ArrayRecord, keys.VERTICAL: ArrayRecord, keys.METRICS: MetricRecord,
          keys.SITE: ConfigRecord, keys.SECAGG: ConfigRecord}


def site_of(context: Context) -> tuple[str, Path | None]:
    """The node's own site name and data folder, from its node config (as the site reads it;
    ``node-<id>`` and no folder when the node config names none)."""
    try:
        node = SiteConfig.from_node_config(context.node_config,
                                           str(context.run_config.get("data-root", "")))
    except ConfigError:
        return f"node-{context.node_id}", None
    return node.name, Path(node.data_path)


def _metadata(message: Message, reply: Message) -> None:
    sent, back = message.metadata, reply.metadata
    if (back.message_type, back.group_id, back.run_id, back.reply_to_message_id,
            back.src_node_id, back.dst_node_id) != (
            sent.message_type, sent.group_id, sent.run_id, sent.message_id,
            sent.dst_node_id, sent.src_node_id):
        raise EgressRefusal("egress.metadata", "the reply's metadata is not that of a reply to "
                            "the message")


def _records(reply: Message, kind: str, asked: Asked | None) -> None:
    """Exactly the records of ``kind`` (a SecAgg+ stage's ``secagg`` instead of ``delta``
    but at collect), each of its record kind."""
    wanted = list(_RECORDS[kind])
    stage = asked.instruction.secagg_stage if asked is not None else ""
    if stage and stage != keys.SECAGG_COLLECT:
        wanted[wanted.index(keys.DELTA)] = keys.SECAGG
    content = reply.content
    if sorted(content.keys()) != sorted(wanted):
        raise EgressRefusal("egress.record-keys", f"a {stage or kind} reply holds exactly "
                            f"{sorted(wanted)}")
    for name in wanted:
        if not isinstance(content[name], _KINDS[name]):
            raise EgressRefusal("egress.record-keys", f"record '{name}' must be a "
                                f"{_KINDS[name].__name__}")


class EgressFilter:
    """The site runtime's check of every reply before it leaves (the module docstring).

    Parameters
    ----------
    allowance : int
        Bytes a reply may hold beyond its arrays (:data:`MESSAGE_ALLOWANCE`).

    Attributes
    ----------
    memory : FederationMemory
        What earlier instructions told, per site and federation (in memory only).
    """

    def __init__(self, allowance: int = MESSAGE_ALLOWANCE) -> None:
        self.allowance = allowance
        self.memory = FederationMemory()

    def check(self, message: Message, reply: Message, context: Context,
              policy: str) -> EgressVerdict:
        """The verdict on ``reply``, the worker's answer to ``message``.

        Parameters
        ----------
        message : Message
            The message as the runtime pulled it.
        reply : Message
            The reply the worker returned.
        context : Context
            The runtime's context of the task (its node config names the site; never the
            context the worker returned).
        policy : str
            The fingerprint a reply's site record must name (the runtime's policy).
        """
        try:
            self._check(message, reply, context, policy)
        except EgressRefusal as refusal:
            return EgressVerdict(refusal.rule, refusal.detail)
        except Exception:  # noqa: BLE001 - fail closed: an unchecked reply never leaves
            log.exception("egress filter: a %s reply could not be checked",
                          message.metadata.message_type)
            return EgressVerdict("egress.unchecked", RULES["egress.unchecked"])
        return PASSED

    def refusal(self, message: Message, context: Context, verdict: EgressVerdict) -> Message:
        """The error reply that leaves instead of a reply ``verdict`` refused."""
        return refusal_reply(message, site_of(context)[0], verdict)

    def _check(self, message: Message, reply: Message, context: Context, policy: str) -> None:
        _metadata(message, reply)
        site, data_path = site_of(context)
        if reply.has_error():
            check_error(reply, site)
            return
        kind = message.metadata.message_type
        if kind not in _RECORDS or not reply.has_content():
            raise EgressRefusal("egress.record-keys", "a reply to a message type the site does "
                                "not answer, or without content")
        if kind == keys.VERTICAL_MESSAGE_TYPE:
            _records(reply, kind, None)
            check_metrics(reply.content.metric_records[keys.METRICS], kind, None)
            check_vertical(message, reply, context, site, data_path or Path("."), self.memory)
            self._bytes(reply, sum(len(a.data) for a in reply.content[keys.VERTICAL].values()),
                        len(reply.content[keys.VERTICAL]))
            return
        asked = asked_of(kind, message, context, site, self.memory)
        _records(reply, kind, asked)
        instruction = asked.instruction
        arrays = len(asked.model.arrays) + 3 if asked.model is not None else 0
        self._bytes(reply, update_bound(asked) + protocol_bound(instruction), arrays)
        content = reply.content
        check_site_record(content.config_records[keys.SITE], site, policy, kind == "evaluate")
        if instruction.secagg_stage:
            check_protocol(content.config_records.get(keys.SECAGG), instruction)
        check_metrics(content.metric_records[keys.METRICS], kind, asked)
        if instruction.secagg_stage == keys.SECAGG_COLLECT:
            check_masked(content.array_records[keys.DELTA], asked)
        elif kind == "train" and not instruction.secagg_stage:
            check_update(content.array_records[keys.DELTA], asked)

    def _bytes(self, reply: Message, bound: int, arrays: int) -> None:
        """Refuse (``egress.bytes``) a reply larger than ``bound`` bytes of arrays, ``arrays``
        arrays' framing and the allowance."""
        budget = (bound + self.allowance + FRAMING_BYTES_PER_ARRAY * arrays
                  + FRAMING_BYTES_PER_MIB * math.ceil(bound / _MIB))
        size = wire_size(reply.content)
        if size > budget:
            raise EgressRefusal("egress.bytes", f"the reply is larger than the {budget} bytes "
                                "the instruction allows")
