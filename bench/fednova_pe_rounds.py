"""The in-process federation of ``bench/fednova_pe_task.py``: rounds, the fixed objective, curves.

Each site is a :class:`clients.pe_seg.task.PESegTask`. A round: every site
starts from the global weights, runs ``task.train(..., optimizer="sgd")`` for
its ``tau_i`` steps (seed :func:`round_seeds.round_seed` of ``(seed, round,
site)``, the same for both rules) and returns ``delta_i = x_global -
x_local_i``; the server aggregates with
:func:`strategies.aggregation.fedavg_delta` or
:func:`strategies.aggregation.fednova_delta` (``a_i =
local_solver_norm(steps_done, momentum)``, ``p_i = len(task.train_set) /
total``) and sets ``x <- x - delta`` (Wang et al., NeurIPS 2020).

The true objective ``F(x) = sum_i p_i F_i(x)`` is the task's loss on a FIXED
set of each site's training slabs (:func:`fixed_eval_set`), and FedAvg's
surrogate ``F~`` weighs the same ``F_i`` with ``w_i = p_i ||a_i||_1 / sum_j
p_j ||a_j||_1`` (Thm. 1).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from clients.pe_seg.task import PESegTask
from clients.training.device import ComputeDevice
from model_arrays import load_arrays, state_arrays
from round_seeds import round_seed
from strategies.aggregation import fedavg_delta, fednova_delta, local_solver_norm

__all__ = ["METHODS", "CPU", "RoundResult", "run_round", "FixedEvalSet", "fixed_eval_set",
           "site_objectives", "RunSpec", "Curves", "surrogate_weights", "run_federation",
           "tail_stats"]

log = logging.getLogger("fednova_pe_task")

METHODS = ("fedavg", "fednova")
CPU = ComputeDevice(torch.device("cpu"), None)


# --------------------------------------------------------------------------- #
# One round
# --------------------------------------------------------------------------- #
@dataclass
class RoundResult:
    """What one federated round produced.

    Attributes
    ----------
    new_global : list of numpy.ndarray
        ``x_global - aggregated_delta``.
    deltas : list of list of numpy.ndarray
        ``delta_i = x_global - x_local_i`` per site.
    num_examples : list of int
        ``n_i = len(task.train_set)``.
    a_norms : list of float
        ``||a_i||_1 = local_solver_norm(steps_done_i, momentum)``.
    steps_done : list of int
        Local steps each site ran.
    train_losses : list of float
        Mean local training loss per site.
    """

    new_global: list[np.ndarray]
    deltas: list[list[np.ndarray]]
    num_examples: list[int]
    a_norms: list[float]
    steps_done: list[int]
    train_losses: list[float]


def run_round(
    tasks: Sequence[PESegTask],
    model: nn.Module,
    global_arrays: Sequence[np.ndarray],
    taus: Sequence[int],
    *,
    method: str,
    lr: float,
    momentum: float,
    seed: int,
    round_index: int,
    compute: ComputeDevice = CPU,
) -> RoundResult:
    """One in-process federated round: local SGD at every site, then aggregation.

    ``model`` is a scratch module (same architecture as the global model); its
    weights are overwritten. Site ``i`` trains from ``global_arrays`` for
    ``taus[i]`` steps with seed :func:`round_seed` ``(seed, round_index, i)``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if len(taus) != len(tasks):
        raise ValueError(f"{len(taus)} local-step counts for {len(tasks)} sites")
    deltas, n, a_norms, steps, losses = [], [], [], [], []
    for i, (task, tau) in enumerate(zip(tasks, taus)):
        load_arrays(model, global_arrays)
        result = task.train(model, int(tau), lr, momentum, compute,
                            seed=round_seed(seed, round_index, i), optimizer="sgd")
        local = state_arrays(model)
        deltas.append([g - x for g, x in zip(global_arrays, local)])
        n.append(len(task.train_set))
        a_norms.append(local_solver_norm(result.steps_done, momentum=momentum))
        steps.append(result.steps_done)
        losses.append(result.mean_loss)
    if method == "fedavg":
        agg = fedavg_delta(deltas, n)
    else:
        agg = fednova_delta(deltas, n, a_norms)
    new_global = [g - d for g, d in zip(global_arrays, agg)]
    return RoundResult(new_global, deltas, n, a_norms, steps, losses)


# --------------------------------------------------------------------------- #
# Deterministic objective
# --------------------------------------------------------------------------- #
@dataclass
class FixedEvalSet:
    """Fixed mini-batches of one site's training slabs for ``F_i``."""

    batches: list[tuple[torch.Tensor, torch.Tensor]]
    indices: list[int]
    num_positive: int


def fixed_eval_set(task: PESegTask, num_slabs: int, seed: int) -> FixedEvalSet:
    """Pick ``num_slabs`` training slabs (about half positive, as the sampler draws them).

    Without replacement, seeded; grouped into mini-batches of the training batch size.
    """
    ds = task.train_set
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xF1]))
    positives = sorted(set(ds.positive_indices))
    negatives = sorted(set(range(len(ds))) - set(positives))
    num_slabs = min(num_slabs, len(ds))
    want_pos = min(len(positives), int(round(task.settings.positive_fraction * num_slabs)))
    want_neg = min(len(negatives), num_slabs - want_pos)
    want_pos = min(len(positives), num_slabs - want_neg)
    chosen = (rng.choice(positives, want_pos, replace=False).tolist()
              + rng.choice(negatives, want_neg, replace=False).tolist())
    chosen = [int(i) for i in rng.permutation(chosen)]
    bs = task.settings.batch_size
    batches = []
    for start in range(0, len(chosen), bs):
        items = [ds[i] for i in chosen[start:start + bs]]
        batches.append((torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])))
    return FixedEvalSet(batches, chosen, want_pos)


@torch.no_grad()
def site_objectives(model: nn.Module, eval_sets: Sequence[FixedEvalSet],
                    loss_fn: nn.Module) -> list[float]:
    """``F_i(x)`` per site: mean task loss over the fixed mini-batches, eval mode."""
    model.eval()
    out = []
    for es in eval_sets:
        losses = [float(loss_fn(model(x).float(), y)) for x, y in es.batches]
        out.append(float(np.mean(losses)))
    return out


# --------------------------------------------------------------------------- #
# One federation
# --------------------------------------------------------------------------- #
@dataclass
class RunSpec:
    """One federation to run."""

    name: str
    method: str
    taus: tuple[int, ...]
    lr: float
    momentum: float


@dataclass
class Curves:
    """Per-round measurements (index 0 = the initial model)."""

    F: list[float] = field(default_factory=list)
    F_surrogate: list[float] = field(default_factory=list)
    F_sites: list[list[float]] = field(default_factory=list)
    val_dice: list[float] = field(default_factory=list)
    val_dice_sites: list[list[float]] = field(default_factory=list)
    train_loss: list[float | None] = field(default_factory=list)
    update_norm: list[float | None] = field(default_factory=list)


def surrogate_weights(p: np.ndarray, a_norms: Sequence[float]) -> np.ndarray:
    """FedAvg's implicit weights ``p_i ||a_i||_1 / sum_j p_j ||a_j||_1`` (Wang et al. 2020, Thm. 1)."""
    w = p * np.asarray(a_norms, dtype=np.float64)
    return w / w.sum()


def run_federation(
    spec: RunSpec, tasks: Sequence[PESegTask], eval_sets: Sequence[FixedEvalSet],
    rounds: int, seed: int,
) -> Curves:
    """Run ``rounds`` rounds of ``spec`` from the seeded initial model and record curves."""
    torch.manual_seed(seed)
    model = tasks[0].build_model()
    scratch = tasks[0].build_model()
    x = state_arrays(model)
    n = np.array([len(t.train_set) for t in tasks], dtype=np.float64)
    p = n / n.sum()
    w = surrogate_weights(p, [local_solver_norm(t, momentum=spec.momentum) for t in spec.taus])
    loss_fn = tasks[0].loss_fn()
    curves = Curves()

    def measure(train_loss: float | None, update_norm: float | None) -> None:
        load_arrays(model, x)
        f_sites = site_objectives(model, eval_sets, loss_fn)
        dice = [t.evaluate(model, CPU).metrics["dice"] for t in tasks]
        curves.F.append(float(p @ f_sites))
        curves.F_surrogate.append(float(w @ f_sites))
        curves.F_sites.append(f_sites)
        curves.val_dice.append(float(np.mean(dice)))
        curves.val_dice_sites.append([float(d) for d in dice])
        curves.train_loss.append(train_loss)
        curves.update_norm.append(update_norm)

    measure(None, None)
    for r in range(1, rounds + 1):
        res = run_round(tasks, scratch, x, spec.taus, method=spec.method, lr=spec.lr,
                        momentum=spec.momentum, seed=seed, round_index=r)
        step = [a - b for a, b in zip(x, res.new_global)]
        x = res.new_global
        norm = float(np.sqrt(sum(float(np.sum(np.square(s, dtype=np.float64))) for s in step)))
        measure(float(p @ res.train_losses), norm)
        log.info("%-22s round %3d  F %.4f  F~ %.4f  dice %.3f", spec.name, r,
                 curves.F[-1], curves.F_surrogate[-1], curves.val_dice[-1])
    return curves


def tail_stats(values: Sequence[float], tail: int) -> tuple[float, float]:
    """Mean and standard deviation of the last ``tail`` values."""
    arr = np.asarray(values[-tail:], dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0
