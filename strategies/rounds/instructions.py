"""A round's messages: one fresh instruction per site, the model's Flower record they
carry, and THE exchange that sends them and takes in their answers.

**Instructions.** Flower's ``FedAvg`` puts one shared ``RecordDict`` in every train
message; here each site gets its own ``RecordDict`` and ``ConfigRecord`` (a copy of the
run's config plus the round and the site's own settings), so nothing a site-specific
setting writes can leak into another site's message.

A train instruction also carries the round's local steps tau, the uplink codec
and its per-round, per-site seed (:func:`strategies.compression.derive_seed`),
which the server needs again to validate and decode the site's reply
(:class:`TrainPlan`). The global model goes down as one packed buffer (below); the
round's active features (:mod:`strategies.rounds.round_feature`) add to a train or
evaluate exchange's :class:`Instructions` before they become messages (with a downlink
codec, a compressed step or a dense snapshot per node, :mod:`strategies.downlink`).

**The model's record.** The layout (why the model goes down as one buffer, the buffer
and its JSON layout, the update's arrays) is the wire kernel's,
:mod:`strategies.wire.model_layout`, pure numpy so the site reads it without Flower; its
Flower side lives here, as the kernel may not import Flower (tests/test_layering.py):
:func:`named_arrays` / :func:`record_of` convert between an ``ArrayRecord`` and numpy
arrays by name (the ClientApp's adapter, the downlink, pruning and the engine's attacks
use them too), and :func:`pack_arrays` / :func:`unpack_arrays` are
:func:`~strategies.wire.model_layout.pack_model` /
:func:`~strategies.wire.model_layout.unpack_model` on records, bit for bit.

**The exchange.** One function serves every message the server sends: train and
evaluate in each round, Power-of-Choice's ``query`` (:mod:`.round_metrics`), the
end-of-run test and cross-site evaluations (:mod:`.cross_site`) and a vertical
federation's stages (:mod:`app.vertical.messages`). :func:`exchange` pushes the
instructions and pulls the replies every ``poll_interval`` until the
:class:`~strategies.rounds.round_policy.RoundPolicy` closes it; each reply is handed to
the :class:`~strategies.rounds.reply_intake.ReplyIntake` the moment it is pulled
(parsed, identity-checked, capped, folded: once), so that whether it counts toward the
quorum is known at once and no message is kept.

Replies that arrive after the exchange closed are *late*: the caller keeps their
message ids (``late_ids``), the next exchange pulls them first, records them
and drops them, so a slow site is visible in MLflow rather than silently ignored.

When a site's SuperNode is gone (its heartbeat expired), the SuperLink answers
in its place with an error reply whose ``src_node_id`` is the SuperLink's own
id; the exchange hands such a reply to the intake as the answer of the node the
instruction was sent to, so the failure is recorded under the site's name.

Before a round the server waits for the sites (:func:`wait_for_nodes`), also
bounded: Flower's ``sample_nodes`` loops forever until ``min_available_nodes``
SuperNodes are connected, so a federation whose hospital never comes up would
hang silently; here the wait has a deadline and fails with a clear error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from logging import INFO
from typing import TYPE_CHECKING, Generic

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from strategies.compression import derive_seed, parse_spec, warmup_spec
from strategies.rounds.reply_intake import Reply, ReplyIntake, Taken, TrainReply, parse_train_reply
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.site_book import SiteBook
from strategies.wire import message_keys as keys
from strategies.wire.errors import FederationError
from strategies.wire.local_solver import LocalSolver
from strategies.wire.model_layout import pack_model, unpack_model

if TYPE_CHECKING:
    from strategies.rounds.round_feature import RoundFeature

__all__ = ["named_arrays", "record_of", "pack_arrays", "unpack_arrays",
           "Uplink", "TrainPlan", "Instructions", "site_messages", "train_messages",
           "evaluate_messages", "query_messages",
           "Exchanged", "NodeWaitTimeout", "exchange", "wait_for_nodes"]


@dataclass(frozen=True)
class Uplink:
    """How sites train and send their update, the same for every round.

    Attributes
    ----------
    codec : str
        Canonical update codec spec (:func:`strategies.compression.parse_spec`).
    error_feedback : bool
        Whether sites keep an error-feedback residual for lossy codecs.
    federation : str
        Stable id of the federation; sites key their persistent state by it.
    time_budget : float
        Per-round wall-clock budget of local training (0 = none).
    seed : int
        Base of the per-round, per-site codec seeds.
    codec_warmup_rounds : int
        Rounds over which the codec's kept fraction warms up to ``codec``
        (run config ``strategy.codec-warmup-rounds``, :mod:`strategies.wire.codecs.warmup`).
    """

    codec: str = "none"
    error_feedback: bool = True
    federation: str = ""
    time_budget: float = 0.0
    seed: int = 0
    codec_warmup_rounds: int = 0

    def codec_for(self, server_round: int, rate: float | None = None) -> str:
        """The codec spec of ``server_round``: ``codec`` after its warm-up, or with the
        kept fraction ``rate`` when a compression-rate schedule chose one
        (:mod:`strategies.plugins.schedules.codec_rate`)."""
        if rate is not None:
            return str(replace(parse_spec(self.codec), fraction=float(rate)))
        if not self.codec_warmup_rounds:
            return self.codec
        return str(warmup_spec(self.codec, server_round, self.codec_warmup_rounds))

    def evaluate_settings(self, node_id: int) -> dict:
        """The site-specific entries of an evaluate config: the federation, which keys a
        site's personalised state (FedBN's layers, :mod:`clients.training.personalisation`)."""
        return {keys.FEDERATION: self.federation}


@dataclass(frozen=True)
class TrainPlan:
    """One round's train settings per node: the tau sent and the codec seed.

    ``default_tau`` answers for a node the plan does not know (a reply
    validated without a matching instruction, e.g. in tests); ``codec`` is the
    round's codec spec, which every node encodes and the server decodes with.
    """

    tau: dict[int, int]
    codec_seeds: dict[int, int]
    default_tau: int = 0
    codec: str = "none"

    @classmethod
    def for_round(cls, node_ids: list[int], tau: int, uplink: Uplink,
                  server_round: int, rate: float | None = None) -> TrainPlan:
        """The same ``tau`` for every selected node, a derived codec seed each, and the
        round's codec (:meth:`Uplink.codec_for` with the kept fraction ``rate``)."""
        return cls(tau={n: int(tau) for n in node_ids},
                   codec_seeds={n: derive_seed(uplink.seed, server_round, n) for n in node_ids},
                   default_tau=int(tau),
                   codec=uplink.codec_for(server_round, rate))

    def seed_of(self, node_id: int) -> int:
        """The codec seed ``node_id`` was sent (0 when it was sent none)."""
        return self.codec_seeds.get(node_id, 0)

    def tau_of(self, node_id: int) -> int:
        """The local steps ``node_id`` was sent (the plan's default otherwise)."""
        return self.tau.get(node_id, self.default_tau)

    def parse_reply(self, message: Message, *, node_id: int, reference: list[np.ndarray],
                    solver: LocalSolver, channels: Collection[str] = ()) -> TrainReply:
        """``node_id``'s train reply validated against ``reference`` with the codec, seed and
        tau it was sent (:func:`~strategies.rounds.reply_intake.parse_train_reply`, a-norm by
        ``solver``, the side payloads of ``channels`` taken), with the a-norm of that tau
        (``TrainReply.tau_a_norm``: FedNova's reference, which bounds the weight a site
        gains by reporting few steps)."""
        tau = self.tau_of(node_id)
        reply = parse_train_reply(message, reference, self.codec, self.seed_of(node_id), tau,
                                  solver, node_id=node_id, channels=channels)
        return replace(reply, tau_a_norm=solver.a_norm(tau))

    def settings(self, node_id: int, uplink: Uplink) -> dict:
        """The site-specific entries of ``node_id``'s train config."""
        return {keys.LOCAL_STEPS: self.tau[node_id],
                keys.TIME_BUDGET: float(uplink.time_budget),
                keys.CODEC: self.codec,
                keys.ERROR_FEEDBACK: uplink.error_feedback,
                keys.CODEC_SEED: self.codec_seeds[node_id],
                keys.FEDERATION: uplink.federation}


def named_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """``record``'s arrays as numpy, by name, in order."""
    return {name: array.numpy() for name, array in record.items()}


def record_of(named: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Numpy arrays by name as an ``ArrayRecord``, in order."""
    return ArrayRecord({name: Array(np.asarray(array)) for name, array in named.items()})


def pack_arrays(arrays: ArrayRecord) -> ArrayRecord:
    """``arrays`` as one ``uint8`` buffer (``model``) and its JSON layout (``layout``)."""
    return record_of(pack_model(named_arrays(arrays)))


def unpack_arrays(packed: ArrayRecord) -> ArrayRecord:
    """The ``ArrayRecord`` that :func:`pack_arrays` packed, names and order kept.

    Raises
    ------
    strategies.wire.model_layout.PackedModelError
        When ``packed`` lacks ``model`` or ``layout``, or their sizes disagree.
    """
    return record_of(unpack_model(named_arrays(packed)))


def site_messages(
    node_ids: list[int], arrays: ArrayRecord | None, config: ConfigRecord, server_round: int,
    message_type: str, extra: Callable[[int], dict] | None = None,
    packed_for: Mapping[int, ArrayRecord] | None = None,
) -> list[Message]:
    """One message per node with its own content: ``arrays`` and a fresh config.

    The config is ``config`` plus the server round plus ``extra(node_id)``. The
    model travels packed in one buffer (:func:`pack_arrays`, packed once: every message
    refers to the same Flower objects), or as
    ``packed_for[node_id]`` when given (the compressed downlink's records); with
    ``arrays`` ``None`` and no ``packed_for``, no model (a SecAgg+ stage's instruction).
    """
    packed = pack_arrays(arrays) if packed_for is None and arrays is not None else None
    messages = []
    for node_id in node_ids:
        site_config = ConfigRecord(dict(config))
        site_config[keys.SERVER_ROUND] = server_round
        site_config.update(extra(node_id) if extra else {})
        content = RecordDict({keys.CONFIG: site_config})
        model = packed if packed_for is None else packed_for[node_id]
        if model is not None:
            content[keys.ARRAYS] = model
        messages.append(Message(content=content, dst_node_id=node_id,
                                message_type=message_type))
    return messages


@dataclass
class Instructions:
    """One exchange's instructions while the round's features add to them.

    Attributes
    ----------
    message_type : str
        ``MessageType.TRAIN`` or ``MessageType.EVALUATE``.
    server_round : int
        The round.
    node_ids : list[int]
        The nodes addressed, in order.
    model : ArrayRecord
        The model as the instructions carry it (every feature's ``outgoing`` applied).
    settings : dict[int, dict]
        Per node, its config entries (beyond the run's config and the round).
    reference : Sequence[np.ndarray]
        ``model``'s arrays (what a payload next to the model is sized by; empty when the
        exchange's features need none).
    sites : SiteBook or None
        The federation's site book (None when the exchange's features need none).
    records : dict[int, ArrayRecord] or None
        Per node, the record its model travels in; None until a feature needs them
        (:meth:`packed`): ``model`` packed once for every node.
    """

    message_type: str
    server_round: int
    node_ids: list[int]
    model: ArrayRecord
    settings: dict[int, dict]
    reference: Sequence[np.ndarray] = ()
    sites: SiteBook | None = None
    records: dict[int, ArrayRecord] | None = None

    def packed(self) -> dict[int, ArrayRecord]:
        """Each node's model record, ``model`` packed once when no feature set them."""
        if self.records is None:
            packed = pack_arrays(self.model)
            self.records = {node: packed for node in self.node_ids}
        return self.records

    def messages(self, config: ConfigRecord,
                 features: Sequence[RoundFeature] = ()) -> list[Message]:
        """The messages, after each of ``features`` attached its entries, in order."""
        for feature in features:
            feature.attach(self)
        return site_messages(self.node_ids, self.model, config, self.server_round,
                             self.message_type, self.settings.__getitem__, self.records)


# pylint: disable=too-many-arguments
def train_messages(node_ids: list[int], arrays: ArrayRecord, config: ConfigRecord,
                   server_round: int, plan: TrainPlan, uplink: Uplink,
                   features: Sequence[RoundFeature] = (), *,
                   reference: Sequence[np.ndarray] = (), sites: SiteBook | None = None
                   ) -> list[Message]:
    """The round's train instructions: each node's settings from ``plan``, and the model.

    ``arrays`` is the model as sent (the ``outgoing`` of the round's active ``features``,
    ``reference`` its arrays); each feature then attaches its entries
    (:meth:`Instructions.messages`). Without features the model goes packed as it is.
    """
    draft = Instructions(MessageType.TRAIN, server_round, list(node_ids), arrays,
                         {node: plan.settings(node, uplink) for node in node_ids},
                         reference=reference, sites=sites)
    return draft.messages(config, features)


# pylint: disable=too-many-arguments
def evaluate_messages(node_ids: list[int], arrays: ArrayRecord, config: ConfigRecord,
                      server_round: int, settings: Callable[[int], dict],
                      features: Sequence[RoundFeature] = ()) -> list[Message]:
    """The round's evaluate instructions: ``settings(node)`` in each config, ``arrays`` (the
    model as sent: the active ``features``' ``outgoing`` applied) and each feature's entries
    attached (:meth:`Instructions.messages`)."""
    draft = Instructions(MessageType.EVALUATE, server_round, list(node_ids), arrays,
                         {node: settings(node) for node in node_ids})
    return draft.messages(config, features)


def query_messages(node_ids: list[int], arrays: ArrayRecord, server_round: int,
                   subset: int) -> list[Message]:
    """Flower ``query`` messages: the global model's loss on ``subset`` examples (0 = all)."""
    return site_messages(node_ids, arrays, ConfigRecord(), server_round, MessageType.QUERY,
                         lambda _: {keys.LOSS_SUBSET: subset})


@dataclass
class Exchanged(Generic[Reply]):
    """What one exchange brought back.

    Attributes
    ----------
    taken : Taken
        The typed accepted replies, the drops with their reasons, the policies.
    late : list[str]
        Names of the replies to earlier exchanges pulled (and dropped) this time.
    missing : list[int]
        Nodes that had not answered when the exchange closed.
    reply_seconds : dict[str, float]
        Per site name, seconds from the push to the pull that got its reply.
    seconds : float
        Seconds the exchange took.
    """

    taken: Taken[Reply]
    late: list[str] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    reply_seconds: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def exchange(grid: Grid, messages: Iterable[Message], policy: RoundPolicy,
             intake: ReplyIntake[Reply], late_ids: dict[str, int] | None = None
             ) -> Exchanged[Reply]:
    """Push ``messages``, pull their replies under ``policy``, take each into ``intake``.

    ``late_ids`` maps message ids of earlier exchanges still unanswered to the
    node each was sent to: replies to them are pulled first, named in
    ``Exchanged.late`` and removed from it; this exchange's unanswered messages
    are added to it (``None``: no late replies are tracked).
    """
    messages = list(messages)
    started = time.monotonic()
    late_ids = {} if late_ids is None else late_ids
    late: list[str] = []
    if late_ids:
        for reply in grid.pull_messages(list(late_ids)):
            node = late_ids.pop(reply.metadata.reply_to_message_id, None)
            late.append(intake.label(reply, reply.metadata.src_node_id if node is None
                                     else node))
    result: Exchanged[Reply] = Exchanged(Taken(), late=late)
    pending = ({mid: m.metadata.dst_node_id
                for mid, m in zip(grid.push_messages(messages), messages)}
               if messages else {})
    quorum = policy.quorum or len(pending)
    valid = 0
    while pending:
        for reply in grid.pull_messages(list(pending)):
            node = pending.pop(reply.metadata.reply_to_message_id, None)
            if node is None:
                continue
            name, counts = intake.take(reply, node)
            result.reply_seconds[name] = time.monotonic() - started
            valid += counts
        if not pending:
            break
        elapsed = time.monotonic() - started
        if policy.deadline and elapsed >= policy.deadline and valid >= quorum:
            break
        if elapsed >= policy.timeout:
            break
        time.sleep(policy.poll_interval)
    result.missing = sorted(pending.values())
    late_ids.update(pending)
    result.taken = intake.close()
    result.seconds = time.monotonic() - started
    return result


class NodeWaitTimeout(FederationError, TimeoutError):
    """Fewer sites than required connected before the deadline."""


def wait_for_nodes(
    grid: Grid, min_nodes: int, timeout: float, poll_interval: float = 1.0
) -> list[int]:
    """Return the connected node ids once at least ``min_nodes`` are connected.

    Raises
    ------
    NodeWaitTimeout
        If fewer than ``min_nodes`` are connected after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last_logged = -1
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= min_nodes:
            return nodes
        if time.monotonic() >= deadline:
            raise NodeWaitTimeout(
                f"only {len(nodes)} of the required {min_nodes} sites connected "
                f"within {timeout:.0f} s; check that the SuperNodes are running and "
                "can reach the SuperLink, or lower min-nodes"
            )
        if len(nodes) != last_logged:
            log(INFO, "Waiting for sites: %d of %d connected", len(nodes), min_nodes)
            last_logged = len(nodes)
        time.sleep(poll_interval)
