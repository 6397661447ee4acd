"""The vector a site masks in a securely aggregated round: its update, weighted and clipped.

Under SecAgg+ (Bell et al., CCS 2020) the coordinator sees only the sum of the sites'
vectors, so each site applies its own aggregation weight before masking
(:mod:`strategies.wire.secure_aggregation.weights`) and only codecs that sum across sites
apply (:mod:`strategies.wire.secure_aggregation.vector`). From the round's
:class:`~clients.site.site_feature.LocalUpdate`:

1. ``v``: the update's float arrays as one vector (FedBN's own layers already zero;
   integer buffers are not sent, the coordinator advances them);
2. rand-k with the round's shared seed (every site keeps the same coordinates; the
   normalisation statistics, the model's float buffers, whole): with
   error feedback (EF-SGD, Karimireddy et al. 2019, Algorithm 2) ``z = e + v`` and the
   kept coordinates of ``z`` are sent; ``none`` and ``fp16``: all of ``v`` (the
   ``b``-bit quantisation replaces fp16);
3. ``c_i`` (:func:`~strategies.wire.secure_aggregation.weights.site_coefficient`): FedAvg's
   ``min(1, n_i / r)`` with the instruction's weight reference ``r``, times FedNova's
   ``a_f / max(a_i, a_f)`` when the instruction names an a-norm floor ``a_f``; the
   site's own a-norm ``a_i`` is that of the steps it ran, by the run's local solver
   (:class:`~strategies.wire.local_solver.LocalSolver`, as the coordinator computes it);
4. the weighted values are clipped to the plan's ``[-clip, clip]`` (what one site can
   add to the sum, at most), and the residual keeps what was not sent:
   ``e <- z - scatter(clip(c_i z_kept) / c_i)``, in the site's state store as in a plain
   round (``ef-residual``).

A train instruction of a securely aggregated round names its stage (``secagg-stage``) and
carries the round's plan (:class:`~strategies.wire.secure_aggregation.settings.RoundPlan`) and
the stage's protocol entries (``secagg-*``): its :class:`SecureInstruction`. In the collect
stage's round the update is sealed by the :class:`SecureMasking` feature
(:class:`~clients.site.site_feature.SiteFeature`): these values, masked by the site's
:class:`~strategies.wire.secure_aggregation.participant.Participant`
(:mod:`clients.site.secure_round`, which holds it between stages).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from clients.site.site_feature import RESIDUAL_NAME, LocalUpdate, SiteFeature, config_value
from clients.site.state_store import SiteStateStore
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from strategies.wire.local_solver import LocalSolver
from strategies.wire.secure_aggregation.errors import SecAggError
from strategies.wire.secure_aggregation.settings import RoundPlan
from strategies.wire.secure_aggregation.vector import flatten_float, kept_indices, shared_codec_seed
from strategies.wire.secure_aggregation.weights import site_coefficient

if TYPE_CHECKING:  # the participant (and Flower's primitives) load only in a SecAgg+ round
    from clients.site.instruction import Instruction, SiteRunSettings
    from strategies.wire.secure_aggregation.participant import Participant

__all__ = ["SecureInstruction", "SecureMasking", "coefficient_of", "secure_values"]


@dataclass(frozen=True)
class SecureInstruction:
    """The SecAgg+ entries of a train instruction.

    Attributes
    ----------
    secagg_stage : str
        The SecAgg+ stage (``secagg-stage``: one of
        :data:`~strategies.wire.message_keys.SECAGG_STAGES`); "" for a plain train.
    plan : RoundPlan or None
        The stage's round plan (``None`` without a stage).
    secagg : dict of str to Any
        The stage's config entries as sent (``server-round`` and every ``secagg-*``).
    """

    KEYS: ClassVar[frozenset[str]] = frozenset({keys.SECAGG_STAGE})

    secagg_stage: str = ""
    plan: RoundPlan | None = None
    secagg: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, kind: str, config: Mapping[str, Any]) -> SecureInstruction | None:
        """The stage of a train message; ``None`` for a plain train and the other kinds.

        Raises
        ------
        ConfigError
            For an unknown stage.
        SecAggError
            For a stage whose round plan is missing or malformed (naming the entry).
        """
        stage = config_value(config, keys.SECAGG_STAGE, str, "") if kind == "train" else ""
        if not stage:
            return None
        if stage not in keys.SECAGG_STAGES:
            raise ConfigError(f"train instruction key {keys.SECAGG_STAGE!r} = {stage!r}: "
                              f"expected one of {', '.join(keys.SECAGG_STAGES)}; request refused")
        return cls(stage, RoundPlan.parse(config),
                   {key: value for key, value in config.items()
                    if key == keys.SERVER_ROUND or key.startswith("secagg-")})


def _number(entries: dict, key: str, default: float | None) -> float:
    """``entries[key]`` as a float (``default`` when absent; ``None``: required)."""
    value = entries.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SecAggError(f"secure aggregation entry {key!r} = {value!r} is missing or not a "
                          "number")
    return float(value)


def coefficient_of(local: LocalUpdate, instruction: Instruction, run: SiteRunSettings) -> float:
    """``c_i`` of this site's update in (0, 1] (:func:`site_coefficient`).

    Raises
    ------
    SecAggError
        When the weight reference is missing or not > 0, or the a-norm floor is not a number.
    """
    reference = _number(instruction.secagg, keys.SECAGG_WEIGHT_REFERENCE, None)
    a_floor = _number(instruction.secagg, keys.SECAGG_A_FLOOR, 0.0)
    solver = LocalSolver(optimizer=run.optimizer, momentum=run.momentum, lr=run.lr,
                         proximal_mu=run.proximal_mu)
    a_norm = solver.a_norm(int(local.metrics[keys.STEPS])) if a_floor > 0 else 0.0
    coefficient = site_coefficient(local.metrics[keys.NUM_EXAMPLES], reference, a_norm, a_floor)
    if not coefficient > 0:
        raise SecAggError("the site's aggregation weight is 0 (no training examples)")
    return coefficient


def secure_values(local: LocalUpdate, instruction: Instruction, run: SiteRunSettings,
                  state_dir: Path) -> np.ndarray:
    """The float64 vector this site masks: its kept coordinates, weighted by ``c_i``, clipped.

    Parameters
    ----------
    local : LocalUpdate
        The round's update (``delta``) and metrics (``num-examples``, ``steps``).
    instruction : Instruction
        The collect stage: its plan (clip, round), codec, error-feedback flag, weight
        reference and a-norm floor.
    run : SiteRunSettings
        The run seed (rand-k's shared seed) and the local solver (FedNova's a-norm).
    state_dir : Path
        The site's state dir (the error-feedback residual).

    Raises
    ------
    SecAggError, SecAggConfigError
        A malformed weight entry; a codec that does not sum across sites.
    """
    plan = instruction.plan
    if plan is None:
        raise SecAggError("a masked update needs the round's plan (secagg-* entries)")
    vector = flatten_float(local.delta)
    kept = kept_indices(local.delta, instruction.codec,
                        shared_codec_seed(run.seed, plan.server_round), whole=local.buffers)
    coefficient = coefficient_of(local, instruction, run)
    store = SiteStateStore(state_dir)
    feedback = kept is not None and instruction.error_feedback
    if feedback:
        saved = store.load(instruction.federation, RESIDUAL_NAME)
        if saved is not None and saved.shape == vector.shape:  # else: a fresh residual
            vector = vector + saved
    values = vector if kept is None else vector[kept]
    sent = np.clip(coefficient * values, -plan.clip, plan.clip)
    if feedback:
        residual = vector.copy()
        residual[kept] -= sent / coefficient
        store.save(instruction.federation, RESIDUAL_NAME, residual)
    return sent


class SecureMasking(SiteFeature):
    """The collect stage's seal: the update's :func:`secure_values`, masked.

    Parameters
    ----------
    participant : Participant
        The site's side of the round, its neighbours' shares received.
    instruction : Instruction
        The collect stage.
    run : SiteRunSettings
        The run's seed and local solver.
    state_dir : Path
        The site's state dir (the error-feedback residual).
    """

    def __init__(self, participant: Participant, instruction: Instruction, run: SiteRunSettings,
                 state_dir: Path) -> None:
        self.participant, self.instruction = participant, instruction
        self.run, self.state_dir = run, state_dir

    def seal(self, update: LocalUpdate) -> dict[str, np.ndarray]:
        """The packed masked vector (``secagg-masked``).

        Raises
        ------
        SecAggError, SecAggConfigError
            As :func:`secure_values`.
        """
        values = secure_values(update, self.instruction, self.run, self.state_dir)
        return {keys.SECAGG_MASKED: self.participant.mask(values)}
