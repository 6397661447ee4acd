"""Isotropic quadratics for the FedNova simulation, with the project's aggregators.

Site ``i`` minimises ``F_i(x) = 1/2 ||x - c_i||^2``. Any linear local solver
(SGD, heavy-ball momentum) started from ``x`` ends at ``x_local = c_i + s_i
(x - c_i)`` with a scalar *response* ``s_i`` (plain SGD: ``s_i = (1 -
lr)^tau_i``), so the fixed points of FedAvg and FedNova are weighted averages
of the ``c_i``:

* FedAvg:  weights ``p_i (1 - s_i)``;
* FedNova: weights ``p_i (1 - s_i) / ||a_i||_1``;

normalised to sum to one, while the true optimum of ``sum_i p_i F_i`` is
``x* = sum_i p_i c_i`` (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020, Sec. 3-4).

Pure numpy on the project's own math
(:func:`strategies.aggregation.fedavg_delta`,
:func:`strategies.aggregation.fednova_delta`); nothing here re-implements it.
Sign convention as everywhere in the project: ``delta_i = x_global -
x_local_i`` and ``x_new = x_global - aggregated_delta``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strategies.aggregation import fedavg_delta, fednova_delta, local_solver_norm


def aggregate(
    x_global: np.ndarray,
    x_local: np.ndarray,
    num_examples: Sequence[int],
    method: str,
    a_norms: Sequence[float] | None = None,
) -> np.ndarray:
    """One server step ``x_global - agg(delta_i)`` by ``strategies.aggregation``.

    ``x_local`` has one leading site axis; ``method`` is ``"fedavg"`` or
    ``"fednova"`` (then ``a_norms`` is required).
    """
    deltas = [[x_global - x_local[i]] for i in range(x_local.shape[0])]
    if method == "fedavg":
        agg = fedavg_delta(deltas, num_examples)
    elif method == "fednova":
        if a_norms is None:
            raise ValueError("fednova needs a_norms")
        agg = fednova_delta(deltas, num_examples, a_norms)
    else:
        raise ValueError(f"unknown aggregation method {method!r}")
    return x_global - agg[0]


def local_sgd_quadratic(
    x_global: np.ndarray,
    centers: np.ndarray,
    steps: Sequence[int],
    lr: float,
    momentum: float = 0.0,
    noise_std: float = 0.0,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Every site's local solver on ``F_i``: the local models, shape ``(M,) + x_global.shape``.

    The solver is PyTorch ``SGD`` (heavy-ball ``momentum``, first buffer = the
    gradient, buffer reset every round) on the stochastic gradient
    ``g = x - c_i + noise_std * xi`` with ``xi ~ N(0, I)`` (``rng`` required
    when ``noise_std > 0``). Site ``i`` (``centers[i]``) runs ``steps[i]``
    steps; sites that are done stay where they are. A leading axis of
    ``x_global`` (shape ``(K, d)``) runs ``K`` independent chains at once.
    """
    steps_arr = np.asarray(steps, dtype=np.int64)
    num_sites = centers.shape[0]
    if steps_arr.shape != (num_sites,):
        raise ValueError(f"steps must have {num_sites} entries, got {steps_arr.shape}")
    if noise_std > 0.0 and rng is None:
        raise ValueError("noise_std > 0 needs an rng")
    expand = (slice(None),) + (None,) * (x_global.ndim - 1) + (slice(None),)
    c = centers[expand]  # (M, 1.., d), broadcasts against the chains
    x = np.broadcast_to(x_global, (num_sites,) + x_global.shape).copy()
    buf = np.zeros_like(x)
    mask_shape = (num_sites,) + (1,) * x_global.ndim
    for k in range(int(steps_arr.max(initial=0))):
        grad = x - c
        if noise_std > 0.0:
            grad = grad + noise_std * rng.standard_normal(x.shape)
        buf = grad if k == 0 else momentum * buf + grad
        active = (steps_arr > k).astype(np.float64).reshape(mask_shape)
        x -= (lr * active) * buf
    return x


def local_response(steps: int, lr: float, momentum: float = 0.0) -> float:
    """Scalar response ``s`` of the local solver: ``x_local - c = s (x - c)``.

    Exact for the noiseless quadratic (the solver is linear); plain SGD gives
    ``(1 - lr) ** steps``.
    """
    out = local_sgd_quadratic(np.ones(1), np.zeros((1, 1)), [steps], lr, momentum)
    return float(out[0, 0])


def closed_form_fixed_point(
    centers: np.ndarray,
    num_examples: Sequence[int],
    responses: Sequence[float],
    a_norms: Sequence[float] | None = None,
) -> np.ndarray:
    """Closed-form fixed point of FedAvg (``a_norms=None``) or FedNova.

    Setting ``x_new = x`` in ``x_new = x - sum_i w_i (1 - s_i)(x - c_i)`` gives
    ``x = sum_i v_i c_i / sum_i v_i`` with ``v_i = p_i (1 - s_i)`` for FedAvg and
    ``v_i = p_i (1 - s_i) / ||a_i||_1`` for FedNova (its global factor
    ``tau_eff`` does not move the fixed point).
    """
    n = np.asarray(num_examples, dtype=np.float64)
    v = n / n.sum() * (1.0 - np.asarray(responses, dtype=np.float64))
    if a_norms is not None:
        v = v / np.asarray(a_norms, dtype=np.float64)
    return (v / v.sum()) @ centers


def iterate_to_fixed_point(
    centers: np.ndarray,
    num_examples: Sequence[int],
    steps: Sequence[int],
    lr: float,
    method: str,
    momentum: float = 0.0,
    tol: float = 1e-13,
    max_rounds: int = 200_000,
) -> tuple[np.ndarray, int]:
    """Run noiseless rounds from ``x = 0`` until ``||x_new - x|| <= tol``.

    FedNova uses ``a_i = local_solver_norm(tau_i, momentum)``. Returns the last
    model and the number of rounds; raises ``RuntimeError`` if not converged.
    """
    a_norms = [local_solver_norm(int(t), momentum=momentum) for t in steps]
    x = np.zeros(centers.shape[1])
    for rounds in range(1, max_rounds + 1):
        x_local = local_sgd_quadratic(x, centers, steps, lr, momentum)
        x_new = aggregate(x, x_local, num_examples, method, a_norms)
        if np.linalg.norm(x_new - x) <= tol:
            return x_new, rounds
        x = x_new
    raise RuntimeError(f"{method} did not converge in {max_rounds} rounds")


def average_iterate(
    centers: np.ndarray,
    num_examples: Sequence[int],
    steps: Sequence[int],
    lr: float,
    method: str,
    noise_std: float,
    chains: int,
    burn_in: int,
    rounds: int,
    seed: int,
    momentum: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Time-averaged global model of ``chains`` independent noisy runs.

    Runs ``burn_in`` rounds from ``x = 0`` (discarded) then ``rounds`` rounds
    whose global models are averaged per chain. Returns ``(mean, per_chain)``
    where ``per_chain`` has shape ``(chains, d)`` (independent estimates, for a
    standard error) and ``mean`` is their average.
    """
    rng = np.random.default_rng(seed)
    a_norms = [local_solver_norm(int(t), momentum=momentum) for t in steps]
    x = np.zeros((chains, centers.shape[1]))
    acc = np.zeros_like(x)
    for r in range(burn_in + rounds):
        x_local = local_sgd_quadratic(x, centers, steps, lr, momentum, noise_std, rng)
        x = aggregate(x, x_local, num_examples, method, a_norms)
        if r >= burn_in:
            acc += x
    per_chain = acc / rounds
    return per_chain.mean(axis=0), per_chain
