"""Byte accounting of a round: what each site received and sent, against dense fp32.

Bytes are the serialised sizes Flower really sends (:func:`strategies.replies.wire_size`):
down is a site's train instruction, up its train reply. The baseline is the
update as dense float32 (:func:`strategies.wire.update_layout.dense_bytes`); the
uplink ratio ``dense / bytes up`` is the codec's compression as seen on the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from flwr.app import Message

from strategies.replies import TrainReply, wire_size
from strategies.rounds.round_report import RoundReport
from strategies.wire.update_layout import dense_bytes

__all__ = ["bytes_down", "record_traffic"]


def bytes_down(messages: Sequence[Message]) -> dict[int, int]:
    """Serialised bytes of each instruction, by destination node."""
    return {m.metadata.dst_node_id: wire_size(m.content) for m in messages}


def record_traffic(report: RoundReport, down: dict[int, int], accepted: Sequence[TrainReply],
                   global_arrays: Sequence[np.ndarray], label: Callable[[int], str]) -> None:
    """Per-site and total traffic of the round's train stage into ``report``.

    ``report.traffic[site]`` gets ``bytes-down``, ``bytes-up`` and
    ``uplink-ratio``; ``report.strategy`` the totals ``bytes-up``,
    ``bytes-down``, ``dense-bytes`` and, when any reply was accepted, the
    round's ``uplink-ratio`` (dense bytes of all accepted updates / bytes up).
    """
    dense = float(dense_bytes(global_arrays))
    for node, sent in down.items():
        report.traffic.setdefault(label(node), {})["bytes-down"] = float(sent)
    for reply in accepted:
        traffic = report.traffic.setdefault(reply.site, {})
        traffic["bytes-up"] = float(reply.wire_bytes)
        traffic["uplink-ratio"] = dense / max(reply.wire_bytes, 1)
    ups = [t["bytes-up"] for t in report.traffic.values() if "bytes-up" in t]
    downs = [t["bytes-down"] for t in report.traffic.values() if "bytes-down" in t]
    report.strategy.update({"bytes-up": float(sum(ups)), "bytes-down": float(sum(downs)),
                            "dense-bytes": dense})
    if ups:
        report.strategy["uplink-ratio"] = dense * len(ups) / sum(ups)
