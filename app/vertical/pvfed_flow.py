"""pvFed's coordinator (Nishikawa et al., "pvFed", IEEJ Trans. 2024): :func:`run_pvfed`.

After the patient alignment (every site holds the same N patients in the same order):

1. stage ``pvfed-local``: each site trains its local model and sends its local encoder
   (clients/vertical/pvfed_site.py); its local-best metrics are logged as round 0;
2. each round r = 1 .. ``num-server-rounds`` (:func:`global_step`): every local
   encoder is evaluated on the patients ``0 .. N-1`` (``Z_k``, ``(N, d_k)``); the
   aggregation ``vertical.aggregation`` (mean, AE or PCA of ``[Z_1 .. Z_K]``,
   strategies/vertical/pvfed_aggregation.py) gives the targets ``T``; the global
   encoder (an ID encoder, warm-started from the previous round's) is distilled
   to mimic ``T`` (MSE, ``vertical.global-epochs``, ``vertical.encoder-lr``);
3. stage ``pvfed-round`` sends the global encoder to every site, which retrains its
   redefined output layer on ``[g, own features]`` and replies its metrics, and
   (every round but the last) its local encoder trained again.

A site whose reply to either stage is unusable (an error, a policy refusal, a malformed
record: :mod:`app.vertical.messages`) is left out of that step, its reason logged: the
next global encoder is distilled from the local encoders that came back, and the site is
sent it like every other (a round in which no site's encoder came back stops the run).
Each round is logged per site (``<department>/pvfed-test-auc``, ...) and as the mean
over sites. The global encoder, like the local ones, is one vector per patient: it
goes to every site of the federation, which learns from it a summary of the other
sites' data about their shared patients (docs/VERTICAL.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from app.vertical.federation import VerticalContext, VerticalResult
from app.vertical.messages import StageAnswer, VerticalError
from clients.vertical.pvfed_site import ENCODE
from models.pvfed import IdEncoder, encoder_arrays, encoder_from_arrays, fit_id_encoder
from strategies.vertical.pvfed_aggregation import AggregationSettings, aggregate
from strategies.wire.errors import ReplyError
from strategies.wire.seeds import round_seed
from strategies.wire.vertical_options import VerticalOptions

__all__ = ["GLOBAL_PREFIX", "GlobalStep", "global_step", "run_pvfed"]

#: Name prefix of the global encoder's weights in the result's arrays.
GLOBAL_PREFIX = "global-encoder."


@dataclass(frozen=True)
class GlobalStep:
    """One round's coordinator step: the aggregated targets, the global encoder fitted to them."""

    targets: np.ndarray
    encoder: IdEncoder
    loss: float


def _outputs(local_encoders: Mapping[str, Mapping[str, np.ndarray]]) -> list[np.ndarray]:
    """``Z_k``: each site's local encoder on the patients ``0 .. N-1``.

    Raises
    ------
    ReplyError
        If a site's arrays are not an ID encoder (naming the site).
    """
    outputs = []
    for department, arrays in local_encoders.items():
        try:
            outputs.append(encoder_from_arrays(arrays).vectors())
        except ValueError as exc:
            raise ReplyError(f"pvFed: the local encoder of {department}: {exc}") from exc
    return outputs


def global_step(local_encoders: Mapping[str, Mapping[str, np.ndarray]], options: VerticalOptions,
                seed: int, server_round: int, previous: IdEncoder | None = None) -> GlobalStep:
    """Aggregate the local encoders' outputs and distil the global encoder to mimic them.

    Parameters
    ----------
    local_encoders : mapping
        Department -> its local encoder's weights (:func:`models.pvfed.encoder_arrays`).
    options : VerticalOptions
        ``aggregation``, ``dim``, ``hidden``, ``global_epochs``, ``encoder_lr``.
    seed : int
        The run seed (the autoencoder's and a new global encoder's initial weights).
    server_round : int
        The round (the autoencoder's seed).
    previous : IdEncoder, optional
        Last round's global encoder, continued when it has the targets' shape.

    Raises
    ------
    ReplyError
        A local encoder that is no ID encoder, or encoders of different patient counts.
    ConfigError
        Settings the aggregation refuses (``mean`` of unequal widths, ``dim`` too large).
    """
    settings = AggregationSettings(dim=options.dim, hidden=options.hidden,
                                   epochs=options.global_epochs, lr=options.encoder_lr,
                                   seed=round_seed(seed, server_round, 0))
    targets = aggregate(options.aggregation, _outputs(local_encoders), settings,
                        sources=list(local_encoders))
    encoder = previous
    if encoder is None or (encoder.num_ids, encoder.width) != targets.shape:
        encoder = IdEncoder(targets.shape[0], options.hidden, targets.shape[1],
                            seed=round_seed(seed, 0, 0, 1))
    losses = fit_id_encoder(encoder, targets, options.global_epochs, options.encoder_lr)
    return GlobalStep(targets, encoder, losses[-1])


def _site_metrics(ctx: VerticalContext, answers: Mapping[int, StageAnswer]) -> dict[str, dict]:
    """Department -> the metrics of its answer."""
    return {ctx.department(node): dict(answer.metrics) for node, answer in answers.items()}


def _encoders(ctx: VerticalContext,
              answers: Mapping[int, StageAnswer]) -> dict[str, dict[str, np.ndarray]]:
    """Department -> the local encoder its answer carries, in the sites' order."""
    return {ctx.department(node): dict(answers[node].arrays)
            for node in ctx.nodes if node in answers}


def run_pvfed(ctx: VerticalContext) -> VerticalResult:
    """pvFed's rounds over the aligned sites (see the module docstring).

    After each round the global encoder and the local encoders that came back are
    checkpointed (:meth:`VerticalContext.save_round`); a resumed federation starts from
    them, after the round they were kept in, without the local stage again.

    Raises
    ------
    VerticalError
        A round in which no site's local encoder came back.
    ReplyError, ConfigError
        From :func:`global_step`.
    """
    rounds = ctx.config.num_server_rounds
    arrays, state = ctx.resumed_state()
    encoder = None
    if state:  # resumed: the global encoder and the local encoders of the checkpoint
        local_encoders, site_metrics = state["local-encoders"], state["site-metrics"]
        kept = {k.removeprefix(GLOBAL_PREFIX): v for k, v in arrays.items()}
        encoder = encoder_from_arrays(kept) if kept else None
    else:
        answers = ctx.send("pvfed-local", {node: ({}, {}) for node in ctx.nodes}, 0,
                           required=False)
        local_encoders, site_metrics = _encoders(ctx, answers), _site_metrics(ctx, answers)
        ctx.log_sites(0, site_metrics)
    for server_round in range(ctx.first_round, rounds + 1):
        if not local_encoders:
            raise VerticalError(f"pvFed round {server_round}: no site's local encoder came "
                                "back (every reply of the previous stage was dropped)")
        step = global_step(local_encoders, ctx.options, ctx.seed, server_round, encoder)
        encoder, arrays = step.encoder, encoder_arrays(step.encoder)
        answers = ctx.send("pvfed-round", {node: ({ENCODE: server_round < rounds}, arrays)
                                           for node in ctx.nodes}, server_round, required=False)
        site_metrics = _site_metrics(ctx, answers)
        ctx.log_sites(server_round, site_metrics, {"global-encoder-loss": step.loss})
        local_encoders = {department: arrays for department, arrays
                          in _encoders(ctx, answers).items() if arrays}
        ctx.save_round(server_round, _global_arrays(encoder),
                       {"local-encoders": local_encoders}, site_metrics)
    return VerticalResult(site_metrics=site_metrics, arrays=_global_arrays(encoder))


def _global_arrays(encoder: IdEncoder | None) -> dict[str, np.ndarray]:
    """The global encoder's weights under :data:`GLOBAL_PREFIX` (``{}``: none yet)."""
    return {} if encoder is None else {f"{GLOBAL_PREFIX}{name}": value
                                       for name, value in encoder_arrays(encoder).items()}
