"""InProcessGrid: Flower's Grid interface over N virtual sites in this process.

The ServerApp talks to its sites only through a :class:`flwr.serverapp.Grid`
(push instructions, pull replies, list nodes). :class:`InProcessGrid` is one:
no SuperLink, no SuperNode, no Ray, no subprocess. Each pushed instruction is
answered at once by its site's handler (the product's real ClientApp unless a
test gives another), one site after the other, on a copy of the message, as a
SuperNode receives its own deserialised copy (:func:`over_the_wire`); the reply
waits in the grid until it may be pulled (a site's :class:`SiteFaults` latency).

Message metadata follows Flower's own grids (``flwr.superlink.grid.inmemory_grid``,
``flwr/server/superlink/linkstate``): an instruction gets a fresh ``message_id``
and must have a positive TTL and no ``reply_to_message_id``; the site receives
it with ``delivered_at`` set; a reply has ``reply_to_message_id`` = the
instruction's id, ``src_node_id`` = the site's node, ``dst_node_id`` = the
SuperLink's node id; a site started with ``egress_filter`` hands each reply to the
site runtime's egress filter before it leaves, as the hospital's runtime does
(:meth:`InProcessGrid._egress`); a ClientApp that raises is answered as a SuperNode does
(``CLIENT_APP_RAISED_EXCEPTION``), a node that is gone as the SuperLink does
(``NODE_UNAVAILABLE``, from the SuperLink's node id); a reply that does not
answer its instruction from its own node is refused, as the SuperLink refuses
it, and the site counts as silent. Instructions do not expire (Flower's
default TTL is 12 hours).

A real federation meets slow hospitals, crashing ClientApps and SuperNodes that
go away; the grid plays them, declarative and deterministic, from each virtual
site's :class:`SiteFaults`, so that a test or a benchmark can replay them exactly:
a reply held for the site's latency, a ClientApp that raises, a site that takes
instructions and never answers, a node that is gone. Rounds are the server round
that the instruction carries (config ``server-round``,
:mod:`strategies.wire.message_keys`); an instruction without one counts as round 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import ERROR, WARNING
from typing import TYPE_CHECKING, cast
from uuid import uuid4

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore import log
from flwr.supercore.date import now
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from flwr.supercore.run import Run

from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError, SiteError
from strategies.wire.message_keys import SECAGG_STAGES

if TYPE_CHECKING:  # a VirtualSite holds its SiteFaults: virtual_site.py imports this module;
    # the site runtime loads torch (imported when a site's egress filter first runs)
    from app.engine.virtual_site import Handler, NodeConfigValue, VirtualSite
    from app.site_runtime.egress_filter import EgressFilter, EgressVerdict

__all__ = ["FIRST_NODE_ID", "EgressCheck", "InProcessGrid", "InjectedFault",
           "NODE_UNAVAILABLE_REASON", "SiteFaults"]

#: Node id of the first virtual site that was given none (the next ones count up).
FIRST_NODE_ID = 1001
#: The reason of the SuperLink's reply for a site whose node is gone (as Flower's).
NODE_UNAVAILABLE_REASON = "Error: Node Unavailable - the destination node is gone."


@dataclass(frozen=True)
class SiteFaults:
    """What goes wrong at one virtual site (the default: nothing).

    Attributes
    ----------
    latency : float
        Seconds of real time between the site's answer and the moment its reply
        can be pulled (a slow link or a slow site): a round's ``round.deadline``
        and ``round.quorum`` see it as a reply that has not come yet. For a site
        that is gone, the seconds until the SuperLink answers in its place (its
        heartbeat expiring).
    fail_from_round : int or None
        From this round on the handler is not called: :class:`InjectedFault` is
        raised in its place and the engine answers as a SuperNode does for a
        ClientApp that raised (an error reply, ``CLIENT_APP_RAISED_EXCEPTION``).
    silent_from_round : int or None
        From this round on the site takes instructions and never replies.
    disconnect_from_round : int or None
        From this round on the site's SuperNode is gone: an instruction of this
        round or later is answered by the SuperLink with ``NODE_UNAVAILABLE``,
        and once the federation has sent any instruction of this round the node
        is no longer listed by ``get_node_ids``.
    silent_stages : tuple of str
        SecAgg+ stages (config ``secagg-stage``: ``setup``, ``share-keys``,
        ``collect``, ``unmask``) whose instructions the site takes and never
        answers, every round: a site that drops out in the middle of a secure
        round (``("unmask",)``: after its masked input was sent).
    """

    latency: float = 0.0
    fail_from_round: int | None = None
    silent_from_round: int | None = None
    disconnect_from_round: int | None = None
    silent_stages: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.silent_stages) - set(SECAGG_STAGES))
        if unknown:
            raise ConfigError(f"SiteFaults.silent_stages: {unknown} are not SecAgg+ stages "
                              f"({', '.join(SECAGG_STAGES)})")
        if self.latency < 0:
            raise ConfigError(f"SiteFaults.latency must be >= 0, got {self.latency}")
        for name in ("fail_from_round", "silent_from_round", "disconnect_from_round"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"SiteFaults.{name} must be >= 0 or None, got {value}")

    def fails(self, server_round: int) -> bool:
        """Whether the handler fails on an instruction of ``server_round``."""
        return _reached(self.fail_from_round, server_round)

    def silent(self, server_round: int, stage: str = "") -> bool:
        """Whether an instruction of ``server_round`` (of SecAgg+ ``stage``) goes unanswered."""
        return _reached(self.silent_from_round, server_round) or stage in self.silent_stages

    def disconnected(self, server_round: int) -> bool:
        """Whether the site's node is gone at ``server_round``."""
        return _reached(self.disconnect_from_round, server_round)


@dataclass(frozen=True)
class EgressCheck:
    """One reply the site runtime's egress filter judged at a site (``egress_filter``).

    Attributes
    ----------
    message, reply : Message
        The instruction as the site received it; the reply as the filter read it.
    policy : str
        The fingerprint of the site's policy (the one a reply's site record must name).
    verdict : EgressVerdict
        The filter's verdict (a refused reply left as the runtime's refusal).
    seconds : float
        The check's wall seconds.
    """

    message: Message
    reply: Message
    policy: str
    verdict: EgressVerdict
    seconds: float


class InjectedFault(SiteError):
    """Raised in place of the site's handler by :attr:`SiteFaults.fail_from_round`."""


def _reached(start: int | None, server_round: int) -> bool:
    return start is not None and server_round >= start


@dataclass
class _Held:
    """A reply and the ``time.monotonic()`` from which it may be pulled."""

    reply: Message
    available_at: float


def _config(message: Message) -> ConfigRecord:
    content = message.content if message.has_content() else RecordDict()
    return content.config_records.get(keys.CONFIG, ConfigRecord())


def server_round(message: Message) -> int:
    """The server round an instruction carries (config ``server-round``; 0 without one)."""
    value = _config(message).get(keys.SERVER_ROUND, 0)
    return int(value) if isinstance(value, (int, float)) else 0


def secagg_stage(message: Message) -> str:
    """The SecAgg+ stage an instruction carries (config ``secagg-stage``; "" without one)."""
    value = _config(message).get(keys.SECAGG_STAGE, "")
    return value if isinstance(value, str) else ""


class InProcessGrid(Grid):
    """A Flower Grid whose nodes are :class:`VirtualSite` objects in this process.

    Parameters
    ----------
    sites : sequence of VirtualSite
        The federation's sites; one without a ``node_id`` gets
        ``FIRST_NODE_ID + its index``.
    run_config : Mapping
        The run config every site's Context holds (Flower gives each ClientApp
        the run's config).
    run_id : int
        The Flower run id of the run (messages and Contexts carry it).
    pull_interval : float
        Seconds :meth:`send_and_receive` sleeps between two pulls.
    """

    def __init__(self, sites: Sequence[VirtualSite],
                 run_config: Mapping[str, NodeConfigValue] | None = None, run_id: int = 1,
                 pull_interval: float = 0.05) -> None:
        for index, site in enumerate(sites):
            site.node_id = site.node_id or FIRST_NODE_ID + index
        ids = [site.node_id for site in sites]
        if len(set(ids)) != len(ids) or SUPERLINK_NODE_ID in ids:
            raise ValueError(f"InProcessGrid: node ids must be distinct and not the "
                             f"SuperLink's ({SUPERLINK_NODE_ID}), got {ids}")
        self._run = Run.create_empty(run_id)
        self._sites = {site.node_id: site for site in sites}
        self._contexts = {site.node_id: site.join(run_id, run_config or {}) for site in sites}
        self._handlers: dict[int, Handler] = {}
        self._egress_filters: dict[int, EgressFilter] = {}  # node id -> its runtime's filter
        self._held: dict[str, _Held] = {}
        self._unanswered: set[str] = set()
        self._round = 0
        self.pull_interval = pull_interval

    # --- Flower's Grid interface --------------------------------------------------

    def set_run(self, run: Run) -> None:
        """Operate in ``run`` (the sites' Contexts keep their run id)."""
        if not isinstance(run, Run):
            raise TypeError(f"`run` must be an instance of Run, got {type(run).__name__}")
        self._run = run

    @property
    def run(self) -> Run:
        """A copy of the run this grid operates in."""
        return Run(**vars(self._run))

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        """A new instruction (Flower deprecates this in favour of ``Message(...)``)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """The connected sites: all but those disconnected by the latest round sent."""
        return [node for node, site in self._sites.items()
                if not site.faults.disconnected(self._round)]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Give each instruction to its site, which answers it now; return the ids.

        An instruction to a node the grid does not know is not stored (logged,
        left out of the returned ids), as the SuperLink does.

        Raises
        ------
        ValueError
            An instruction is malformed (a reply, no positive TTL, delivered).
        """
        ids: list[str] = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid4())
            meta = message.metadata
            if meta.reply_to_message_id or meta.ttl <= 0 or meta.delivered_at:
                raise ValueError(f"Invalid message: {message}")
            if meta.dst_node_id not in self._sites:
                log(ERROR, "Invalid destination node ID for Message: %s", meta.dst_node_id)
                continue
            ids.append(meta.message_id)
            self._deliver(message)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to ``message_ids`` that may be pulled now (each returned once)."""
        current, replies = time.monotonic(), []
        for message_id in message_ids:
            held = self._held.get(message_id)
            if held is not None and held.available_at <= current:
                del self._held[message_id]
                held.reply.metadata.delivered_at = now().isoformat()
                replies.append(held.reply)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Push ``messages`` and pull until all are answered or ``timeout`` s passed.

        Unlike Flower's grids it also returns when only silent sites are left
        (their instructions will never be answered), instead of waiting forever.
        """
        pending = set(self.push_messages(messages))
        end = time.monotonic() + (timeout or 0.0)
        replies: list[Message] = []
        while pending:
            got = list(self.pull_messages(pending))
            replies.extend(got)
            pending -= {m.metadata.reply_to_message_id for m in got}
            if not pending or (timeout is not None and time.monotonic() >= end):
                break
            if not self._can_answer(pending):
                break  # only silent sites are left: nothing will come
            time.sleep(self.pull_interval)
        return replies

    # --- the sites ----------------------------------------------------------------

    def context(self, node_id: int) -> Context:
        """The persistent Context of site ``node_id`` (its ``state`` lives across messages)."""
        return self._contexts[node_id]

    @property
    def sites(self) -> dict[int, VirtualSite]:
        """Node id -> site."""
        return dict(self._sites)

    def unanswered(self) -> set[str]:
        """Ids of instructions a silent site took and will never answer."""
        return set(self._unanswered)

    def _can_answer(self, pending: set[str]) -> bool:
        return any(message_id in self._held for message_id in pending)

    def _handler(self, node_id: int) -> Handler:
        if node_id not in self._handlers:
            from app.engine.virtual_site import default_handler  # noqa: PLC0415 - see TYPE_CHECKING

            self._handlers[node_id] = self._sites[node_id].handler or default_handler()
        return self._handlers[node_id]

    def _deliver(self, message: Message) -> None:
        """Have the instruction's site answer it; hold the reply for its latency."""
        node = message.metadata.dst_node_id
        faults, current = self._sites[node].faults, server_round(message)
        self._round = max(self._round, current)
        if faults.disconnected(current):  # the SuperLink answers once it notices (latency)
            self._hold(_node_unavailable(message), faults.latency)
            return
        if faults.silent(current, secagg_stage(message)):
            self._unanswered.add(message.metadata.message_id)
            return
        received = over_the_wire(message)
        received.metadata.delivered_at = now().isoformat()
        try:
            if faults.fails(current):
                raise InjectedFault(f"site {node} fails from round {faults.fail_from_round}")
            reply = self._handler(node)(received, self._contexts[node])
            answered = True
        except Exception as exc:  # noqa: BLE001 - a SuperNode answers any ClientApp exception
            reply, answered = Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                            f"{type(exc)}:<'{exc}'>"), reply_to=received), False
        if not _answers(reply, message):
            log(WARNING, "site %s: reply refused (it does not answer message %s from node "
                "%s); the site counts as silent", node, message.metadata.message_id, node)
            self._unanswered.add(message.metadata.message_id)
            return
        if answered and self._sites[node].egress_filter:
            reply = self._egress(self._sites[node], received, over_the_wire(reply))
        reply = over_the_wire(reply)
        reply.metadata.__dict__["_message_id"] = str(uuid4())
        self._hold(reply, faults.latency)

    def _egress(self, site: VirtualSite, message: Message, reply: Message) -> Message:
        """``reply`` if the site runtime's egress filter passes it, else the runtime's refusal;
        the check is recorded in ``site.egress_checks``. ``reply`` is a wire copy, as the
        runtime receives it from its worker (no object hash cached yet)."""
        from app.config.site_config import SiteConfig  # noqa: PLC0415 - both load torch
        from app.site_runtime.egress_filter import EgressFilter  # noqa: PLC0415

        context = self._contexts[site.node_id]
        node = SiteConfig.from_node_config(context.node_config,
                                           str(context.run_config.get("data-root", "")))
        egress = self._egress_filters.setdefault(site.node_id, EgressFilter())
        policy = node.policy().fingerprint
        started = time.perf_counter()
        verdict = egress.check(message, reply, context, policy)
        site.egress_checks.append(EgressCheck(message, reply, policy, verdict,
                                              time.perf_counter() - started))
        return reply if verdict.passed else egress.refusal(message, context, verdict)

    def _hold(self, reply: Message, latency: float) -> None:
        self._held[reply.metadata.reply_to_message_id] = _Held(reply, time.monotonic() + latency)


def over_the_wire(message: Message) -> Message:
    """``message`` serialised and read back as Flower's transport does (same message id).

    The receiver gets its own copy, as a SuperNode or the ServerApp does, and a
    record Flower cannot serialise fails here as it would between processes.
    """
    objects = get_all_nested_objects(message)
    contents = {object_id: obj.deflate() for object_id, obj in objects.items()}
    received = cast(Message, inflate_object_from_contents(message.object_id, contents))
    received.metadata.__dict__["_message_id"] = message.metadata.message_id
    return received


def _answers(reply: object, message: Message) -> bool:
    """Whether ``reply`` is a reply to ``message`` from its destination node."""
    if not isinstance(reply, Message):
        return False
    meta = cast(Message, reply).metadata
    return (meta.reply_to_message_id == message.metadata.message_id
            and meta.src_node_id == message.metadata.dst_node_id
            and meta.dst_node_id == message.metadata.src_node_id
            and meta.run_id == message.metadata.run_id)


def _node_unavailable(message: Message) -> Message:
    """The SuperLink's own reply for a node that is gone (``src_node_id`` = the SuperLink)."""
    reply = Message(Error(ErrorCode.NODE_UNAVAILABLE, NODE_UNAVAILABLE_REASON), reply_to=message)
    reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
    reply.metadata.__dict__["_message_id"] = str(uuid4())
    return reply


