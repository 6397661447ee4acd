"""Instructions as a site receives them, for the ClientApp tests."""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from strategies.rounds.instructions import pack_arrays
from strategies.wire import message_keys as keys

TYPES = {"train": MessageType.TRAIN, "evaluate": MessageType.EVALUATE,
         "query": MessageType.QUERY}


def instruction(kind: str, **config) -> Message:
    """A ``kind`` message to node 7 with an empty packed model and ``config`` (round 1)."""
    record = ConfigRecord({keys.SERVER_ROUND: 1, **config})
    return Message(RecordDict({keys.ARRAYS: pack_arrays(ArrayRecord()), keys.CONFIG: record}),
                   dst_node_id=7, message_type=TYPES[kind])
