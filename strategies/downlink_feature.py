"""The compressed downlink as a round feature: each train instruction addressed, each
acknowledgement read.

With ``strategy.downlink-codec`` other than ``none``, :class:`DownlinkFeature` is one of
the train stage's round features (:mod:`strategies.rounds.round_feature`, built by
:func:`strategies.rounds.active_features.active_features`; a dense downlink builds none,
and the model goes packed as it is). It holds the server's
:class:`~strategies.downlink.ServerDownlink` (reference, residual, acknowledged versions):

* :meth:`DownlinkFeature.attach`: a train exchange's model records are the compressed step
  to the nodes in sync and a dense snapshot to the others, with the header in each config
  (:meth:`ServerDownlink.prepare`); evaluate instructions keep the model dense;
* :meth:`DownlinkFeature.observe`: each accepted reply's ``downlink-version``
  acknowledged; ``downlink-dense`` and ``downlink-ratio`` tracked
  (:meth:`ServerDownlink.observe`).

Its state is not checkpointed: a resumed run's first round finds no node in sync and
restarts the reference from the global model (dense snapshots).
"""

from __future__ import annotations

import numpy as np
from flwr.app import MessageType

from strategies.downlink import ServerDownlink
from strategies.plugins.protocols import Info
from strategies.rounds.instructions import Instructions
from strategies.rounds.round_feature import RoundFeature, RoundReplies
from strategies.rounds.round_report import RoundReport

__all__ = ["DownlinkFeature"]


class DownlinkFeature(RoundFeature):
    """The compressed downlink's part in each train round (module docstring).

    Parameters
    ----------
    downlink : ServerDownlink
        The run's active downlink (a codec other than ``none``).
    """

    def __init__(self, downlink: ServerDownlink) -> None:
        self.downlink = downlink

    def attach(self, instructions: Instructions) -> None:
        """A train exchange's model records and headers, from :meth:`ServerDownlink.prepare`
        of its model; nothing for evaluate instructions."""
        if instructions.message_type != MessageType.TRAIN:
            return
        down = self.downlink.prepare(instructions.server_round, instructions.model,
                                     instructions.node_ids)
        instructions.records = dict(down.arrays)
        for node in instructions.node_ids:
            instructions.settings[node].update(down.headers[node].settings())

    def trained_from(self) -> list[np.ndarray] | None:
        """The reference :math:`\\hat x` this round's sites train from (every train
        instruction, step or snapshot, stands for it); ``None`` before the first round.

        The server's normalisation statistics rebase the sites' statistics updates onto
        the global model with it (:meth:`RoundStatistics.rebase
        <strategies.rounds.normalisation_statistics.RoundStatistics.rebase>`): a running
        variance the top-k step left stale at the sites would otherwise be moved again
        every round (issue 50, the top-k downlink's NaN).
        """
        reference = self.downlink.reference
        return None if reference is None else list(reference.arrays)

    def observe(self, report: RoundReport, replies: RoundReplies) -> Info:
        """The accepted replies' acknowledgements; ``downlink-dense`` and ``downlink-ratio``
        (:meth:`ServerDownlink.observe`)."""
        return self.downlink.observe(replies.accepted, replies.down_bytes)
