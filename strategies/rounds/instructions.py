"""The instructions a round sends: one fresh message per site, and the train settings.

Flower's ``FedAvg`` puts one shared ``RecordDict`` in every train message; here
each site gets its own ``RecordDict`` and ``ConfigRecord`` (a copy of the run's
config plus the round and the site's own settings), so nothing a site-specific
setting writes can leak into another site's message.

A train instruction also carries the round's local steps tau, the uplink codec
and its per-round, per-site seed (:func:`strategies.compression.derive_seed`),
which the server needs again to validate and decode the site's reply
(:class:`TrainPlan`). The global model goes down as one packed buffer
(:mod:`strategies.model_packing`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from strategies import message_keys as keys
from strategies.compression import derive_seed
from strategies.model_packing import pack_arrays

__all__ = ["Uplink", "TrainPlan", "site_messages", "query_messages"]


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
    """

    codec: str = "none"
    error_feedback: bool = True
    federation: str = ""
    time_budget: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class TrainPlan:
    """One round's train settings per node: the tau sent and the codec seed.

    ``default_tau`` answers for a node the plan does not know (a reply
    validated without a matching instruction, e.g. in tests).
    """

    tau: dict[int, int]
    codec_seeds: dict[int, int]
    default_tau: int = 0

    @classmethod
    def for_round(cls, node_ids: list[int], tau: int, uplink: Uplink,
                  server_round: int) -> TrainPlan:
        """The same ``tau`` for every selected node, a derived codec seed each."""
        return cls(tau={n: int(tau) for n in node_ids},
                   codec_seeds={n: derive_seed(uplink.seed, server_round, n) for n in node_ids},
                   default_tau=int(tau))

    def seed_of(self, node_id: int) -> int:
        """The codec seed ``node_id`` was sent (0 when it was sent none)."""
        return self.codec_seeds.get(node_id, 0)

    def tau_of(self, node_id: int) -> int:
        """The local steps ``node_id`` was sent (the plan's default otherwise)."""
        return self.tau.get(node_id, self.default_tau)

    def settings(self, node_id: int, uplink: Uplink) -> dict:
        """The site-specific entries of ``node_id``'s train config."""
        return {keys.LOCAL_STEPS: self.tau[node_id],
                keys.TIME_BUDGET: float(uplink.time_budget),
                keys.CODEC: uplink.codec, keys.ERROR_FEEDBACK: uplink.error_feedback,
                keys.CODEC_SEED: self.codec_seeds[node_id],
                keys.FEDERATION: uplink.federation}


def site_messages(
    node_ids: list[int], arrays: ArrayRecord, config: ConfigRecord, server_round: int,
    message_type: str, extra: Callable[[int], dict] | None = None,
) -> list[Message]:
    """One message per node with its own content: ``arrays`` and a fresh config.

    The config is ``config`` plus the server round plus ``extra(node_id)``. The
    model travels packed in one buffer (:func:`strategies.model_packing.pack_arrays`,
    packed once: every message refers to the same Flower objects).
    """
    packed, messages = pack_arrays(arrays), []
    for node_id in node_ids:
        site_config = ConfigRecord(dict(config))
        site_config[keys.SERVER_ROUND] = server_round
        site_config.update(extra(node_id) if extra else {})
        content = RecordDict({keys.ARRAYS: packed, keys.CONFIG: site_config})
        messages.append(Message(content=content, dst_node_id=node_id,
                                message_type=message_type))
    return messages


def query_messages(node_ids: list[int], arrays: ArrayRecord, server_round: int,
                   subset: int) -> list[Message]:
    """Flower ``query`` messages: the global model's loss on ``subset`` examples (0 = all)."""
    return site_messages(node_ids, arrays, ConfigRecord(), server_round, MessageType.QUERY,
                         lambda _: {keys.LOSS_SUBSET: subset})
