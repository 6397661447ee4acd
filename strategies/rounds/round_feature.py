"""The seam between the round loop and what a run adds to a round on the server (issue #45).

A **round feature** is one capability a run switches on that reaches into the train round
on both sides: the compressed downlink (:class:`~strategies.downlink.ServerDownlink`),
pruning (:class:`~strategies.plugins.pruning.pruning_round.PruningRound`) and control
variates (:class:`~strategies.plugins.control_variates.control_variate_round.
ControlVariateRound`). The loop (:class:`~strategies.rounds.train_stage.TrainStage`,
:class:`~strategies.rounds.federated_strategy.FederatedStrategy`) holds the run's *active*
features in order (:func:`strategies.rounds.active_features.active_features` builds them:
a feature that is off is not built, so its hooks are never entered) and calls each hook
on every one of them, naming none:

1. :meth:`RoundFeature.outgoing`: the model as the round's instructions carry it (pruning:
   its kept values only); the replies are validated against that model;
2. :meth:`RoundFeature.attach`: what it adds to each instruction of a train or evaluate
   exchange (:class:`~strategies.rounds.instructions.Instructions`: per node, the model's
   record and the config entries);
3. :meth:`RoundFeature.observe`: its part of the round's accepted train replies, read and
   validated (a channel that fails counts nothing; the reply's update still counts), in
   every concluded round, one without an accepted reply included; what to track;
4. :meth:`RoundFeature.conclude`: the round's new model, when there is one (pruning
   expands it to full shapes and zeroes what its new mask prunes);
5. :meth:`RoundFeature.snapshot` / :meth:`RoundFeature.restore`: its state in the
   strategy's checkpoint, under its own key(s) (``pruning``, ``control-variates``).

A feature declares its **reply channels** (:attr:`RoundFeature.channels`): the keys of
the encoded side payloads a site's train reply may carry for it in its ``delta`` record.
:func:`strategies.rounds.reply_intake.parse_train_reply` takes those of the active
features (a ``uint8`` payload each, into
:attr:`~strategies.rounds.reply_intake.TrainReply.channels`) and refuses a reply with any
other side payload, naming it; what a channel means is the feature's to
decode and check, in :meth:`RoundFeature.observe`.

A feature class subclasses :class:`RoundFeature` and overrides the hooks it needs; the
others keep the defaults below (the model as it is, nothing attached, observed or
checkpointed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from flwr.app import ArrayRecord

from strategies.plugins.protocols import Info
from strategies.rounds.reply_intake import TrainReply
from strategies.rounds.instructions import Instructions, TrainPlan
from strategies.rounds.round_report import RoundReport
from strategies.rounds.site_book import SiteBook

__all__ = ["RoundFeature", "RoundReplies"]


@dataclass(frozen=True)
class RoundReplies:
    """What a feature observes of a concluded train round.

    Attributes
    ----------
    accepted : Sequence[TrainReply]
        The round's accepted train replies (each validated once; empty when none was).
    plan : TrainPlan
        The round's settings per node (tau, codec and codec seed sent).
    reference : Sequence[np.ndarray]
        The model the replies were validated against (:meth:`RoundFeature.outgoing`'s).
    sites : SiteBook
        The federation's site book.
    down_bytes : Mapping[int, int]
        Per node, the bytes of the instruction it was sent.
    """

    accepted: Sequence[TrainReply]
    plan: TrainPlan
    reference: Sequence[np.ndarray]
    sites: SiteBook
    down_bytes: Mapping[int, int]


class RoundFeature(Protocol):
    """One active capability's part in each round on the server (module docstring).

    Hooks are called in the order of the stage's features; each returns what it adds,
    and the defaults add nothing.
    """

    #: The keys of the side payloads its replies carry (module docstring); none by default.
    channels: tuple[str, ...] = ()

    def outgoing(self, arrays: ArrayRecord) -> ArrayRecord:
        """The global model ``arrays`` as this round's instructions carry it."""
        return arrays

    def attach(self, instructions: Instructions) -> None:
        """Add this feature's entries to ``instructions`` (a train or evaluate exchange's:
        :attr:`Instructions.message_type`), in place."""

    def trained_from(self) -> list[np.ndarray] | None:
        """The model this round's train instructions made the sites start from (after
        :meth:`attach`), when it is not the global model their updates are applied to
        (a compressed downlink's reference); ``None`` (the default): the global model."""
        return None

    def observe(self, report: RoundReport, replies: RoundReplies) -> Info:
        """Read this feature's part of the round's accepted ``replies``; what to track
        (``report`` holds the round's drops so far)."""
        return {}

    def conclude(self, report: RoundReport, names: Sequence[str],
                 updated: list[np.ndarray], used: Sequence[TrainReply]
                 ) -> tuple[list[np.ndarray], Info]:
        """The round's new model from ``updated`` (the arrays ``names``, in the shapes of
        :meth:`outgoing`, after the server optimizer's step) and the replies it
        aggregated (``used``); what to track."""
        return updated, {}

    def snapshot(self) -> dict[str, Any]:
        """This feature's state for the strategy's checkpoint, by checkpoint key."""
        return {}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from the strategy's checkpoint ``state`` (every feature's keys)."""
