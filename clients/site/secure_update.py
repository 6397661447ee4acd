"""The vector a site masks in a securely aggregated round: its update, weighted and clipped.

Under SecAgg+ (Bell et al., CCS 2020) the coordinator sees only the sum of the sites'
vectors, so each site applies its own aggregation weight before masking
(:mod:`strategies.secure_aggregation.weights`) and only codecs that sum across sites
apply (:mod:`strategies.secure_aggregation.vector`). From the round's
:class:`~clients.site.site_training.LocalUpdate`:

1. ``v``: the update's float arrays as one vector (FedBN's own layers already zero;
   integer buffers are not sent, the coordinator advances them);
2. rand-k with the round's shared seed (every site keeps the same coordinates; the
   normalisation statistics, the model's float buffers, whole): with
   error feedback (EF-SGD, Karimireddy et al. 2019, Algorithm 2) ``z = e + v`` and the
   kept coordinates of ``z`` are sent; ``none`` and ``fp16``: all of ``v`` (the
   ``b``-bit quantisation replaces fp16);
3. ``c_i`` (:func:`~strategies.secure_aggregation.weights.site_coefficient`): FedAvg's
   ``min(1, n_i / r)`` with the instruction's weight reference ``r``, times FedNova's
   ``a_f / max(a_i, a_f)`` when the instruction names an a-norm floor ``a_f``; the
   site's own a-norm ``a_i`` is that of the steps it ran, by the run's local solver
   (:class:`~strategies.local_solver.LocalSolver`, as the coordinator computes it);
4. the weighted values are clipped to the plan's ``[-clip, clip]`` (what one site can
   add to the sum, at most), and the residual keeps what was not sent:
   ``e <- z - scatter(clip(c_i z_kept) / c_i)``, in the site's state store as in a plain
   round (``ef-residual``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clients.site.instruction import Instruction
from clients.site.run_settings import SiteRunSettings
from clients.site.site_training import RESIDUAL_NAME, LocalUpdate
from clients.site.state_store import SiteStateStore
from strategies import message_keys as keys
from strategies.local_solver import LocalSolver
from strategies.secure_aggregation.errors import SecAggError
from strategies.secure_aggregation.vector import flatten_float, kept_indices, shared_codec_seed
from strategies.secure_aggregation.weights import site_coefficient

__all__ = ["coefficient_of", "secure_values"]


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
