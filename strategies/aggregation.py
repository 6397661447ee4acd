"""Server-side aggregation of client updates: FedAvg and FedNova.

Sign convention (see ``docs/ARCHITECTURE.md``): a client update is
``delta_i = x_global - x_local_i`` (the descent direction) and the new global
model is ``x_global - aggregated_delta``. Every update is a list of numpy
arrays in the model's parameter order. Pure numpy, like all of the
functional core.

Both rules are weighted sums of the sites' updates, built one update at a time
(:class:`RunningSum`, ``S = sum_i w_i Delta_i``): accumulating in float64, one
update after the other, keeps the aggregation's memory at one float64 buffer per
array position, whatever the number of updates (an update can be dropped as soon
as it is added). Float arrays and integer buffers (e.g. BatchNorm's
``num_batches_tracked``) carry separate weights.

References
----------
.. [1] McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient
   Learning of Deep Networks from Decentralized Data", AISTATS 2017 (FedAvg).
.. [2] Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency
   Problem in Heterogeneous Federated Optimization", NeurIPS 2020 (FedNova).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

import numpy as np
from strategies.wire.errors import ReplyError
from strategies.wire.local_solver import local_solver_coefficients, local_solver_norm

__all__ = [
    "AggregationError",
    "RunningSum",
    "apply_update",
    "check_update",
    "fedavg_delta",
    "fedavg_finish",
    "fedavg_fold",
    "fednova_delta",
    "local_solver_coefficients",
    "local_solver_norm",
    "positive_weight",
]


class RunningSum:
    """``S_j = sum_i w_i Delta_{i,j}`` per array position ``j``, in float64.

    Parameters
    ----------
    reference : sequence of numpy.ndarray
        The model's arrays: the shapes and dtypes of the sum (its values are not used).
    """

    def __init__(self, reference: Sequence[np.ndarray]) -> None:
        self._dtypes = [np.dtype(array.dtype) for array in reference]
        self._sums = [np.zeros(np.shape(array), dtype=np.float64) for array in reference]
        self.count = 0

    def add(self, update: Sequence[np.ndarray], float_weight: float, int_weight: float) -> None:
        """``S += w Delta``: ``float_weight`` on float arrays, ``int_weight`` on integer ones.

        ``update`` must match the reference's layout (the caller checks it,
        :func:`strategies.aggregation.check_update`).
        """
        for total, array, dtype in zip(self._sums, update, self._dtypes):
            weight = float_weight if dtype.kind == "f" else int_weight
            total += np.multiply(array, weight, dtype=np.float64)
        self.count += 1

    def result(self, float_scale: float = 1.0, int_scale: float = 1.0) -> list[np.ndarray]:
        """``scale x S`` in each array's dtype.

        Float arrays are cast back to their dtype; integer arrays are rounded
        half-to-even and clipped to their dtype's range.
        """
        out: list[np.ndarray] = []
        for total, dtype in zip(self._sums, self._dtypes):
            if dtype.kind == "f":
                scaled = total if float_scale == 1.0 else total * float_scale
                out.append(scaled.astype(dtype))
            else:
                info = np.iinfo(dtype)
                scaled = total if int_scale == 1.0 else total * int_scale
                out.append(np.clip(np.rint(scaled), info.min, info.max).astype(dtype))
        return out


class AggregationError(ReplyError):
    """Raised when client updates cannot be aggregated (bad layout, values or weights).

    ``index`` is the position of the update (reply) at fault, ``None`` when no
    single one is; the round loop drops that reply and aggregates the others
    (:mod:`strategies.rounds.update_stream`). Invalid local solver settings
    raise :class:`strategies.wire.local_solver.LocalSolverError`.
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


# --------------------------------------------------------------------------- #
# Validation helpers
# --------------------------------------------------------------------------- #
def positive_weight(value: object, name: str, index: int) -> float:
    """``value`` as a float after checking it is a finite real number > 0 (``name[index]``)."""
    if isinstance(value, bool) or not isinstance(value, (Real, np.number)):
        raise AggregationError(
            f"{name}[{index}] must be a real number, got {type(value).__name__}", index=index
        )
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise AggregationError(f"{name}[{index}] must be finite and > 0, got {value!r}",
                               index=index)
    return value


def _check_count(values: Sequence[float], name: str, count: int) -> None:
    """Check that ``values`` has one entry per update."""
    if len(values) != count:
        raise AggregationError(
            f"{name} has {len(values)} entries but there are {count} updates"
        )


def _positive_finite(values: Sequence[float], name: str, count: int) -> np.ndarray:
    """Return ``values`` as float64 after checking length, finiteness and sign."""
    _check_count(values, name, count)
    return np.array([positive_weight(value, name, i) for i, value in enumerate(values)],
                    dtype=np.float64)


def check_update(index: int, delta: Sequence[np.ndarray],
                 reference: Sequence[np.ndarray], against: str = "update 0") -> None:
    """Check that update ``index`` has ``reference``'s layout and finite float entries.

    ``against`` names the reference in the messages (``update 0``, ``the global model``).
    """
    if len(delta) != len(reference):
        raise AggregationError(
            f"update {index} has {len(delta)} arrays but {against} has {len(reference)}",
            index=index)
    for j, array in enumerate(delta):
        if not isinstance(array, np.ndarray):
            raise AggregationError(
                f"update {index}, array {j}: expected numpy.ndarray, got "
                f"{type(array).__name__}", index=index)
        ref = reference[j]
        if array.shape != ref.shape:
            raise AggregationError(
                f"update {index}, array {j}: shape {array.shape} != {ref.shape} ({against})",
                index=index)
        if array.dtype != ref.dtype:
            raise AggregationError(
                f"update {index}, array {j}: dtype {array.dtype} != {ref.dtype} ({against})",
                index=index)
        if array.dtype.kind == "f":
            if not np.isfinite(array).all():
                raise AggregationError(f"update {index}, array {j} contains NaN or inf",
                                       index=index)
        elif array.dtype.kind not in "iu":
            raise AggregationError(
                f"update {index}, array {j}: unsupported dtype {array.dtype} "
                "(expected a float or integer array)", index=index)


def _check_updates(deltas: Sequence[Sequence[np.ndarray]]) -> None:
    """Check that all updates have the same layout and finite float entries."""
    if len(deltas) == 0:
        raise AggregationError("no updates to aggregate (empty list of deltas)")
    for i, delta in enumerate(deltas):
        check_update(i, delta, deltas[0])


def _weighted_sum(
    deltas: Sequence[Sequence[np.ndarray]],
    float_weights: np.ndarray,
    int_weights: np.ndarray,
) -> list[np.ndarray]:
    """Return ``sum_i w_i * delta_i`` per position, in each array's dtype.

    Float arrays use ``float_weights`` and are accumulated in float64; integer
    arrays use ``int_weights`` and the result is rounded half-to-even and
    clipped to the integer dtype's range.
    """
    total = RunningSum(deltas[0])
    for delta, float_weight, int_weight in zip(deltas, float_weights, int_weights):
        total.add(delta, float_weight, int_weight)
    return total.result()


# --------------------------------------------------------------------------- #
# Aggregators
# --------------------------------------------------------------------------- #
def fedavg_fold(total: RunningSum, delta: Sequence[np.ndarray], num_examples: object,
                index: int) -> float:
    r"""Fold one update into FedAvg's running sum, :math:`S \mathrel{+}= n_i \Delta_i`.

    The one FedAvg path: :func:`fedavg_delta` folds a whole set with it, the
    ``fedavg`` aggregator each reply as it arrives
    (:mod:`strategies.rounds.update_stream`). ``delta`` must have the sum's layout
    (:func:`check_update`); ``index`` names the update in the error.

    Returns
    -------
    float
        :math:`n_i`, the update's weight.

    Raises
    ------
    AggregationError
        If ``num_examples`` is not a finite number > 0.
    """
    weight = positive_weight(num_examples, "num_examples", index)
    total.add(delta, weight, weight)
    return weight


def fedavg_finish(total: RunningSum, examples: float) -> list[np.ndarray]:
    r"""FedAvg's update from its running sum: :math:`\Delta = S / \sum_i n_i` (``examples``)."""
    return total.result(1.0 / examples, 1.0 / examples)


def fedavg_delta(
    deltas: Sequence[Sequence[np.ndarray]], num_examples: Sequence[int]
) -> list[np.ndarray]:
    r"""Aggregate client updates with FedAvg weights.

    Implements the FedAvg server update of McMahan et al. (2017) [1]_ written
    on updates,

    .. math:: \Delta = \sum_i p_i \Delta_i, \qquad p_i = n_i / \sum_j n_j,

    where the sum runs over the replies actually received this round
    (partial participation renormalises ``p`` over the received replies).

    Parameters
    ----------
    deltas : sequence of sequence of numpy.ndarray
        One update per client, ``delta_i = x_global - x_local_i``, each a list of
        arrays in the model's parameter order. All updates must have identical
        shapes and dtypes per position.
    num_examples : sequence of int
        Number of training examples ``n_i > 0`` of each client, same order.

    Returns
    -------
    list of numpy.ndarray
        The aggregated update. Float arrays are accumulated in float64 and
        returned in their input dtype; integer arrays (e.g. BatchNorm
        ``num_batches_tracked``) are averaged and rounded half-to-even back to
        their integer dtype.

    Raises
    ------
    AggregationError
        If there are no updates, the updates differ in length, shape or dtype,
        contain non-finite values, or some ``n_i`` is not a positive number.
    """
    _check_updates(deltas)
    _check_count(num_examples, "num_examples", len(deltas))
    total = RunningSum(deltas[0])
    examples = sum(fedavg_fold(total, delta, n, i)
                   for i, (delta, n) in enumerate(zip(deltas, num_examples)))
    return fedavg_finish(total, examples)


def fednova_delta(
    deltas: Sequence[Sequence[np.ndarray]],
    num_examples: Sequence[int],
    a_norms: Sequence[float],
) -> list[np.ndarray]:
    r"""Aggregate client updates with FedNova normalised averaging.

    Implements the normalised averaging of Wang et al. (2020) [2]_ (the FedNova
    update rule with normalized gradients
    :math:`d_i = G_i a_i / \|a_i\|_1`): each client's cumulative update is divided
    by the :math:`\ell_1` norm of its local-solver coefficient vector
    :math:`a_i` (see :func:`local_solver_norm`) and the average normalised
    update is rescaled by the effective number of steps,

    .. math::

        \Delta = \tau_\text{eff} \sum_i p_i \frac{\Delta_i}{\|a_i\|_1},
        \qquad \tau_\text{eff} = \sum_i p_i \|a_i\|_1,
        \qquad p_i = n_i / \sum_j n_j .

    With equal :math:`\|a_i\|_1` this reduces exactly to :func:`fedavg_delta`.

    Parameters
    ----------
    deltas : sequence of sequence of numpy.ndarray
        One update per client, ``delta_i = x_global - x_local_i``.
    num_examples : sequence of int
        Number of training examples ``n_i > 0`` of each client.
    a_norms : sequence of float
        :math:`\|a_i\|_1 > 0` of each client's local solver, as returned by
        :func:`local_solver_norm` for the steps it actually ran.

    Returns
    -------
    list of numpy.ndarray
        The aggregated update, float arrays in their input dtype. Integer
        buffers (e.g. ``num_batches_tracked``) are not gradient-like and are
        not normalised: they get the plain :func:`fedavg_delta` treatment.

    Raises
    ------
    AggregationError
        On the same conditions as :func:`fedavg_delta`, or if some
        :math:`\|a_i\|_1` is not finite and positive (drop clients that ran zero
        steps before aggregating).

    Notes
    -----
    The weights are deliberately *not* renormalised by their sum. Flower's
    ``baselines/fednova`` strategy passes ``tau_eff * p_i / a_i`` to the generic
    weighted ``aggregate``, which divides by :math:`\sum_i p_i / a_i`; that
    silently replaces :math:`\tau_\text{eff}` by the weighted harmonic mean
    :math:`1 / \sum_i (p_i / \|a_i\|_1)` of the solver norms, which is smaller
    than the paper's arithmetic mean whenever the clients' steps differ.
    """
    _check_updates(deltas)
    counts = _positive_finite(num_examples, "num_examples", len(deltas))
    norms = _positive_finite(a_norms, "a_norms", len(deltas))
    p = counts / counts.sum()
    tau_eff = float(np.dot(p, norms))
    return _weighted_sum(deltas, tau_eff * p / norms, p)


def apply_update(global_arrays: list[np.ndarray], delta: list[np.ndarray],
                 keys: list[str]) -> tuple[list[np.ndarray] | None, str]:
    """The new global arrays ``x - Delta`` in ``x``'s dtypes, or ``None`` and why not.

    ``None`` when an entry is NaN or infinite (the reason names the array's
    key): the caller keeps the old model, so nothing non-finite is ever
    checkpointed (finite updates can still overflow, e.g. float32 near 3.4e38).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        updated = [np.asarray(g - d).astype(g.dtype, copy=False)
                   for g, d in zip(global_arrays, delta)]
    for key, array in zip(keys, updated):
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            return None, (f"aggregation failed: new global array '{key}' is not finite; "
                          "the previous model is kept")
    return updated, ""
