"""Control variates' round feature (SCAFFOLD): ``c`` down, ``Delta c_i`` back.

The seam: ``strategy.control-variates`` is a plug-in kind of its own
(:mod:`strategies.plugins.control_variates`), not an aggregator, so SCAFFOLD composes with
every aggregator, defence and server optimizer: they turn the sites' model updates
``Delta y_i`` into the model's step as for any run, and this round only adds the control
variate next to the model. It travels as one more payload of the instruction's and the
reply's arrays, so the codecs apply to it as to the model:

* down (:meth:`ControlVariateRound.attach`): each train instruction gets ``c`` (the
  plug-in's :meth:`~strategies.plugins.protocols.ControlVariates.control`) as the payload
  ``scaffold-c`` of its arrays, encoded with the downlink codec (``strategy.downlink-codec``;
  ``none``: float32) through the server's own error feedback, and its config names the
  method and that codec (``control-variates``, ``control-variates-codec``);
* back (:meth:`ControlVariateRound.observe`, :meth:`ControlVariateRound.add`): each accepted
  reply's ``scaffold-dc`` (its site's ``Delta c_i``, encoded with the round's uplink codec,
  the node's codec seed and the site's own error feedback,
  :mod:`clients.site.site_scaffold`) is decoded and the plug-in adds them up. A reply
  without one, or with one that does not decode to a finite vector of ``c``'s size, counts
  nothing (``scaffold-dc-missing``) and its update still counts.

The defence (issue #45): ``Delta c_i`` is a second channel of the reply, chosen by the site
like its update, so it is defended and combined like the update
(:meth:`ControlVariateRound.defended`). The decoded ``Delta c_i`` go through the plug-in's
:attr:`~strategies.plugins.control_variates.scaffold.Scaffold.defence`, a copy of the run's
``strategy.defence`` (:func:`~strategies.rounds.update_stream.split_defence`) with its
own state: with ``norm-bound`` each is clipped to ``M``, the smallest of ``absolute``,
``kappa`` x the lower median of the round's ``Delta c_i`` norms and ``history-kappa`` x the
median of the ``Delta c_i`` norms accepted in the last rounds (Sun et al. 2019, eq. 1;
:mod:`strategies.plugins.defences.norm_bound`); ``multi-krum`` keeps the ``Delta c_i`` of
lowest Krum score. Behind a robust aggregator (``needs_all_updates``: median, trimmed mean)
the kept ``Delta c_i`` are then combined by its rule and each kept site counts that
combination; behind a linear one (FedAvg, FedNova) they are summed, SCAFFOLD's own rule. The
defence's records are tracked with the prefix ``scaffold-`` (``scaffold-clip-factor/<site>``,
``scaffold-norm-bound``). Where the bound does not bind, ``c`` is SCAFFOLD's bit for bit.

``N``, the federation's sites that train: the roster's size when the coordinator has one,
else the most sites seen (connected, or known by name: :func:`federation_size`), less the
sites that refused a train instruction under their site policy (:meth:`ControlVariateRound.
add` tells the plug-in, :meth:`~strategies.plugins.protocols.ControlVariates.decline`).

It is a :class:`~strategies.rounds.round_feature.RoundFeature` of the train stage, built
only when ``strategy.control-variates`` is active (:mod:`strategies.rounds.active_features`);
its checkpoint key is ``control-variates`` (the plug-in: ``c``, its residual, its defence).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, MessageType
from flwr.supercore import log

from strategies.compression import ErrorFeedback, decode, parse_spec
from strategies.rounds.update_stream import split_defence
from strategies.plugins.protocols import Aggregator, ControlVariates, Info
from strategies.rounds.reply_intake import TrainReply
from strategies.robust import update_norm
from strategies.rounds.instructions import Instructions, TrainPlan
from strategies.rounds.round_feature import RoundFeature, RoundReplies
from strategies.rounds.round_report import RoundReport
from strategies.rounds.site_book import SiteBook
from strategies.rounds.withheld import refused_rule
from strategies.wire import message_keys as keys
from strategies.wire.errors import FederationError
from strategies.wire.model_layout import float_positions

__all__ = ["ControlVariateRound", "federation_size", "float_sizes"]


def float_sizes(reference: Sequence[np.ndarray]) -> list[int]:
    """The sizes of ``reference``'s floating-point arrays, in model order (``c``'s segments)."""
    return [reference[i].size for i in float_positions(reference)]


def federation_size(sites: SiteBook) -> int:
    """``N``: the roster's sites, else the most of the connected nodes and the named sites."""
    if sites.roster:
        return len(sites.roster)
    return max(len(sites.connected), len(set(sites.names.values())), 1)


class ControlVariateRound(RoundFeature):
    """An active control-variates plug-in's part in each train round (module docstring).

    Parameters
    ----------
    control : ControlVariates
        The run's active plug-in (``strategy.control-variates``); its state is ``c``.
    downlink_codec : str
        ``strategy.downlink-codec``, canonical: the codec ``c`` is sent with.
    aggregator : Aggregator, optional
        The run's aggregator behind its defence (:func:`~strategies.plugins.defences.
        defended.with_defence`): the plug-in's ``defence`` becomes a copy of that defence and
        the ``Delta c_i`` are combined by that aggregator's rule when it is robust; ``None``:
        no defence, SCAFFOLD's sum.
    """

    #: Each site's ``Delta c_i``, encoded with the round's codec.
    channels = (keys.CONTROL_DELTA,)

    def __init__(self, control: ControlVariates, downlink_codec: str = "none",
                 aggregator: Aggregator | None = None) -> None:
        self.control = control
        self.codec = str(parse_spec(downlink_codec))
        self.rule: Aggregator | None = None
        if aggregator is not None:
            defence, self.rule = split_defence(aggregator)
            control.defence = copy.deepcopy(defence)

    def payload(self, reference: Sequence[np.ndarray], sites: int) -> np.ndarray:
        """``c`` encoded with the downlink codec, through the server's error feedback (kept
        as the plug-in's ``residual``: checkpointed with it)."""
        sizes = float_sizes(reference)
        c = self.control.control(sum(sizes), sites)
        feedback = ErrorFeedback(self.codec)
        if self.control.residual.size == c.size:
            feedback.load_state(self.control.residual)
        payload = feedback.step(c, segments=sizes)
        self.control.residual = feedback.state()
        return payload

    def attach(self, instructions: Instructions) -> None:
        """A train exchange's ``instructions`` with ``c`` in their arrays (sized by the
        instructions' ``reference``, ``N`` from their ``sites``) and the method and codec in
        their configs; a record shared by several nodes stays shared. Evaluate: nothing.

        Raises
        ------
        FederationError
            For train instructions without the model's arrays or the site book.
        """
        if instructions.message_type != MessageType.TRAIN:
            return
        if instructions.sites is None or not instructions.reference:
            raise FederationError("SCAFFOLD's c is sized by the round's model and N by the "
                                  "site book: the train instructions carry neither")
        entry = Array(self.payload(instructions.reference, federation_size(instructions.sites)))
        records: dict[int, ArrayRecord] = {}
        packed = instructions.packed()
        for node in instructions.node_ids:
            record = packed[node]
            if id(record) not in records:
                records[id(record)] = ArrayRecord({**dict(record.items()), keys.CONTROL_C: entry})
            packed[node] = records[id(record)]
            instructions.settings[node].update({keys.CONTROL_VARIATES: "scaffold",
                                                keys.CONTROL_CODEC: self.codec})

    def observe(self, report: RoundReport, replies: RoundReplies) -> Info:
        """Every accepted reply's site has saved its ``c_i``: :meth:`add` their ``Delta c_i``
        (``N`` from the site book, the refusals from ``report``'s drops)."""
        return self.add(replies.accepted, replies.plan, replies.reference,
                        federation_size(replies.sites), report.train_dropped)

    def add(self, replies: Sequence[TrainReply], plan: TrainPlan,
            reference: Sequence[np.ndarray], sites: int,
            dropped: Mapping[str, str] | None = None) -> Info:
        """Decode each accepted reply's ``Delta c_i`` (the round's codec and the node's seed)
        and let the plug-in add them, after telling it which sites ``dropped`` (site ->
        reason) refused to train under their policy; what to track."""
        refused = [site for site, why in (dropped or {}).items() if refused_rule(why)]
        self.control.decline(refused, [reply.site for reply in replies])
        sizes = float_sizes(reference)
        deltas, missing = [], 0
        for reply in replies:
            try:
                control_delta = reply.channels.get(keys.CONTROL_DELTA)
                if control_delta is None:
                    raise ValueError("the reply carries none")
                vector = decode(np.asarray(control_delta), plan.codec, sum(sizes),
                                seed=plan.seed_of(reply.node_id), segments=sizes)
                if not np.isfinite(vector).all():
                    raise ValueError("not finite")
            except ValueError as exc:
                log(WARNING, "scaffold: %s's Delta c_i left out: %s", reply.site, exc)
                missing += 1
                continue
            deltas.append(replace(reply, delta=[vector]))
        kept, defended = self.defended(deltas)
        info = {**defended, **self.control.observe(kept, sites)}
        return {**info, "scaffold-dc-missing": float(missing)} if missing else info

    def defended(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], Info]:
        """What ``total`` adds for ``replies`` (each ``delta`` one decoded ``Delta c_i``): the
        kept ``Delta c_i`` after the plug-in's defence, each replaced by the robust rule's
        combination of them behind a robust aggregator (module docstring); the defence's
        records prefixed ``scaffold-``. The defence learns the kept norms."""
        defence = self.control.defence
        kept, info = defence.filter(replies)
        vectors = [reply.delta[0] for reply in kept]
        if kept and self.rule is not None and self.rule.needs_all_updates:
            combined, _ = self.rule.aggregate(kept)
            vectors = [combined[0]] * len(kept)
        learnt = defence.observe([update_norm(reply.delta) for reply in kept])
        return vectors, {f"scaffold-{key}": value for key, value in {**info, **learnt}.items()}

    def snapshot(self) -> dict[str, Any]:
        """The plug-in (``c``, its residual and its defence's state) under
        ``control-variates``."""
        return {"control-variates": self.control}

    def restore(self, state: Mapping[str, Any]) -> None:
        """The checkpoint's plug-in."""
        self.control = state["control-variates"]
