"""Pruning's round feature: what travels down, what comes back, re-pruning.

With ``strategy.pruning = "prunefl"`` (:mod:`strategies.plugins.pruning`) the global model
the strategy holds keeps its full shapes, pruned coordinates at 0, and the plug-in holds the
mask (checkpointed with the strategy). A round then

* sends each covered array **compacted**, its kept values only
  (:func:`~strategies.wire.pruning_mask.compact`): the packed downlink, the downlink codec
  and its error feedback see the kept weights only; a mask change changes their layout, so
  the downlink restarts from a dense snapshot of the kept weights
  (:class:`~strategies.downlink.ServerDownlink`);
* adds the mask itself (one bit per covered coordinate,
  :func:`~strategies.wire.pruning_mask.mask_record`) to the instruction of a node that has
  not acknowledged its version (``pruning-version`` of its last accepted train reply), and
  names the version, the mode and, in a re-pruning round, the codec of the squared gradients
  in every config (:meth:`PruningRound.settings`, :meth:`PruningRound.attach`);
* sends the evaluate instructions the same way, no report asked;
* validates and aggregates the sites' compacted updates against the compacted model (so the
  uplink codec and the sites' error feedback act on the kept weights only), expands the new
  model back to full shapes, lets the plug-in observe the round with the sites' squared
  gradients, each clipped and then robustly combined (:func:`squared_gradients`; PruneFL's
  re-pruning), and zeroes what the new mask prunes (:meth:`PruningRound.conclude`).

It is a :class:`~strategies.rounds.round_feature.RoundFeature` of the train stage, built
only when ``strategy.pruning`` is active (:mod:`strategies.rounds.active_features`); its
checkpoint key is ``pruning`` (the plug-in, whose state is the mask).

Example::

    rounds = PruningRound(prunefl)
    model = rounds.start(initial_record, structure)    # initial magnitude pruning
    sent = rounds.outgoing(model)                      # what the instructions carry
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, MessageType
from flwr.supercore import log

from strategies.compression import decode
from strategies.plugins.protocols import Info, Pruning
from strategies.rounds.reply_intake import TrainReply
from strategies.wire import message_keys as keys
from strategies.wire.pruning_mask import apply_mask, compact, expand, mask_record
from strategies.robust import (NormBound, clip_factors, coordinate_median, coordinatewise, scaled,
                               update_norm)
from strategies.rounds.instructions import Instructions, named_arrays, record_of
from strategies.rounds.round_feature import RoundFeature, RoundReplies
from strategies.rounds.round_report import RoundReport

__all__ = ["REPORT_BOUND", "PruningRound", "squared_gradients"]


#: The per-site bound of the squared-gradient reports: the norm-bound defence's rule with its
#: default ``kappa`` (``norm-bound.kappa`` = 1.5) over the round's report norms.
REPORT_BOUND = NormBound(kappa=1.5)


def _float_arrays(named: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in named.items() if np.issubdtype(v.dtype, np.floating)}


def squared_gradients(replies: Sequence[TrainReply], named: Mapping[str, np.ndarray],
                      codec: str) -> tuple[dict[str, np.ndarray] | None, Info]:
    """The sites' squared gradients combined robustly, in ``named``'s full shapes; what to track.

    Each site sends one vector ``s_i`` over the model's floating-point arrays in model order,
    encoded with ``codec`` (run config ``pruning.report-codec``). A payload that does not
    decode, or decodes to a negative or non-finite value, is left out with a logged reason (its
    update still counts). None when no reply sent one.

    PruneFL's criterion reads the sites' sum ``sum_i s_i`` (Jiang et al., TNNLS 2022:
    ``Delta(M) = sum_{j in M} g_j^2``, :mod:`strategies.plugins.pruning.prunefl`), which one
    site alone can make as large as it likes on the units it wants kept. The ``n`` reports are
    instead

    1. clipped per site as the update's norm-bound defence clips an update (Sun et al.,
       *Can You Really Backdoor Federated Learning?*, 2019, eq. 1): ``s_i min(1, M / ||s_i||_2)``
       with ``M`` = :data:`REPORT_BOUND` (1.5 x the lower median of the round's non-zero
       report norms, :func:`strategies.robust.clip_factors`: a report of zeros sets no bound,
       or one site of 2 reporting zeros would clip the other to zeros and empty the mask);
    2. combined by ``n`` x their coordinate-wise median (Yin et al., *Byzantine-Robust
       Distributed Learning*, ICML 2018, Def. 1, :func:`strategies.robust.coordinate_median`),
       the sum's robust estimate: ``n`` keeps the paper's scale (``pruning-objective``), and the
       mask does not depend on it (the greedy's order and its test ``v_u / c_u > N / D`` are
       invariant to one factor on every ``g^2``).

    Bound: with ``f < n / 2`` lying reports, each coordinate of the median lies between the
    smallest and the largest honest clipped value of that coordinate, so a unit that no honest
    site finds important is not made so; from 3 sites up one liar cannot choose the mask. With
    2 sites the median is their mean: the clip alone bounds the liar, to 1.5 x the honest
    report's norm. The cost: a unit only one honest site finds important counts as little as
    a liar's, and with 3 or more honest sites the median is not the mean, so a unit at the
    greedy's margin may be chosen otherwise than by the plain sum. With a sparse report codec
    (``topk``) a coordinate a site did not send is 0 in its report: a unit then counts only
    where a majority of the sites sent it, and PruneFL adds fewer units back at a re-pruning
    (``bench/pruning.py``, seed 0, 3 sites, ``topk:0.05``: synthetic-pe keeps 0.114 of the
    parameters instead of 0.172, final Dice 0.158 instead of 0.162, dense 0.138;
    pneumoniamnist 0.159 instead of 0.178, AUC 0.979 both). With 2 sites and no clip the
    combination is the sum bit for bit (their median is ``(a + b) / 2``, and twice that is
    ``a + b`` exactly in binary floating point).

    Memory: the ``n`` decoded reports are held as float64 (``8 n d`` bytes, ``d`` the model's
    floating-point coordinates), stacked one array at a time for the median.

    Tracked: ``pruning-reports`` (``n``), ``pruning-report-bound`` (``M``) and
    ``pruning-clip-factor/<site>`` (``min(1, M / ||s_i||)``, 1 = not clipped).
    """
    floats = _float_arrays(named)
    size = sum(a.size for a in floats.values())
    ends = np.cumsum([a.size for a in floats.values()])[:-1]
    sites, reports = [], []
    for reply in replies:
        sqgrad = reply.channels.get(keys.PRUNING_SQGRAD)
        if sqgrad is None:
            continue
        try:
            vector = decode(np.asarray(sqgrad), codec, size)
        except ValueError as exc:
            log(WARNING, "pruning: %s's squared gradients left out: %s", reply.site, exc)
            continue
        if not np.isfinite(vector).all() or (vector < 0).any():
            log(WARNING, "pruning: %s's squared gradients left out: negative or not finite",
                reply.site)
            continue
        sites.append(reply.site)
        reports.append(np.split(vector.astype(np.float64), ends))
    if not reports:
        return None, {}
    norms = np.array([update_norm(r) for r in reports])
    factors, bound, sent = np.ones_like(norms), 0.0, norms > 0.0
    if sent.any():  # a report of zeros is no norm: it would make M = 0 and zero the others
        factors[sent], bound = clip_factors(norms[sent], REPORT_BOUND)
    clipped = [r if f >= 1.0 else scaled(r, f) for r, f in zip(reports, factors)]
    median = coordinatewise(clipped, coordinate_median)
    out = {name: len(reports) * m.reshape(a.shape)
           for (name, a), m in zip(floats.items(), median)}
    info = {"pruning-reports": float(len(reports)), "pruning-report-bound": bound,
            **{f"pruning-clip-factor/{site}": float(f) for site, f in zip(sites, factors)}}
    return out, info


class PruningRound(RoundFeature):
    """The pruning plug-in's part in each round (see the module docstring).

    Parameters
    ----------
    pruning : Pruning
        The run's active pruning plug-in (``strategy.pruning``); its state is the mask.
    """

    #: A re-pruning round's squared gradients, from the sites it asked.
    channels = (keys.PRUNING_SQGRAD,)

    def __init__(self, pruning: Pruning) -> None:
        self.pruning = pruning
        #: Per node, the mask version its last accepted train reply acknowledged.
        self.acknowledged: dict[int, int] = {}

    def start(self, arrays: ArrayRecord, structure: Mapping) -> tuple[ArrayRecord, Info]:
        """The first global model: the plug-in's initial pruning of ``arrays`` (nothing new on a
        resumed run, whose mask came with the checkpoint), pruned coordinates zeroed."""
        named = named_arrays(arrays)
        info = self.pruning.initialise(named, structure)
        return record_of(apply_mask(named, self.pruning.masks)), info

    def outgoing(self, arrays: ArrayRecord) -> ArrayRecord:
        """``arrays`` (full shapes) as the instructions carry them: covered arrays compacted."""
        return record_of(compact(named_arrays(arrays), self.pruning.masks))

    def settings(self, server_round: int) -> dict:
        """The config entries of every train instruction of ``server_round``."""
        report = self.pruning.report_codec if self.pruning.report_due(server_round) else ""
        return {keys.PRUNING_VERSION: int(self.pruning.version),
                keys.PRUNING_MODE: self.pruning.mode, keys.PRUNING_REPORT: report}

    def with_mask(self, node_ids: Sequence[int],
                  records: Mapping[int, ArrayRecord]) -> dict[int, ArrayRecord]:
        """Each node's model record, plus the mask for a node that does not hold its version
        (a fresh record: the others may share one object)."""
        version = int(self.pruning.version)
        mask = {name: Array(value) for name, value in mask_record(self.pruning.masks).items()}
        out = {}
        for node in node_ids:
            record = records[node]
            if self.acknowledged.get(node) != version:
                record = ArrayRecord({**dict(record.items()), **mask})
            out[node] = record
        return out

    def attach(self, instructions: Instructions) -> None:
        """The version and mode in every config (in a train exchange's re-pruning round, the
        report codec too), the mask to each node that does not hold its version."""
        settings = self.settings(instructions.server_round)
        if instructions.message_type != MessageType.TRAIN:
            settings[keys.PRUNING_REPORT] = ""
        for node in instructions.node_ids:
            instructions.settings[node].update(settings)
        instructions.records = self.with_mask(instructions.node_ids, instructions.packed())

    def acknowledge(self, replies: Sequence[TrainReply], asked: Iterable[int]) -> None:
        """Record the mask version each accepted reply trained (``pruning-version``); a node
        ``asked`` whose reply was not accepted (it may have lost its mask) gets the mask again."""
        version = int(self.pruning.version)
        for node in asked:
            self.acknowledged.pop(node, None)
        for reply in replies:
            if reply.metrics.get(keys.PRUNING_VERSION) == version:
                self.acknowledged[reply.node_id] = version

    def observe(self, report: RoundReport, replies: RoundReplies) -> Info:
        """The mask version each accepted reply trained (:meth:`acknowledge`); nothing to
        track (the squared gradients are read when the round has a new model)."""
        self.acknowledge(replies.accepted, replies.plan.tau)
        return {}

    def conclude(self, report: RoundReport, names: Sequence[str], updated: list[np.ndarray],
                 used: Sequence[TrainReply]) -> tuple[list[np.ndarray], Info]:
        """The round's new model in full shapes, after the plug-in observed the round.

        ``updated`` is the new compacted model (``names`` in order), ``used`` the updates
        it aggregated: their squared gradients (a re-pruning round: clipped and combined,
        :func:`squared_gradients`) and train seconds go to :meth:`Pruning.observe`; what its
        new mask prunes is set to 0. The info adds the reports' bound and clip factors.
        """
        server_round = report.server_round
        named = expand(dict(zip(names, updated)), self.pruning.masks)
        sqgrad, reported = (squared_gradients(used, named, self.pruning.report_codec)
                            if self.pruning.report_due(server_round) else (None, {}))
        seconds = [float(r.metrics.get(keys.TRAIN_SECONDS, 0.0)) for r in used]
        info = self.pruning.observe(server_round, named, sqgrad,
                                    float(np.mean(seconds)) if seconds else 0.0)
        return list(apply_mask(named, self.pruning.masks).values()), {**reported, **info}

    def snapshot(self) -> dict[str, Any]:
        """The plug-in (its mask) under ``pruning``."""
        return {"pruning": self.pruning}

    def restore(self, state: Mapping[str, Any]) -> None:
        """The checkpoint's plug-in (its mask)."""
        self.pruning = state["pruning"]
