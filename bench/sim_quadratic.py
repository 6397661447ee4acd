"""Simulation helpers shared by the FedNova and AdaComm benchmarks.

Two small federated problems whose behaviour is known in closed form, plus the
book-chapter runtime model of local-update SGD. Everything is pure numpy and
uses the project's aggregation and schedule code
(:func:`strategies.aggregation.fedavg_delta`,
:func:`strategies.aggregation.fednova_delta`,
:func:`strategies.local_steps.adacomm_tau`,
:class:`strategies.local_steps.LossSmoother`); nothing here re-implements their
math. Sign convention as everywhere in the project: ``delta_i = x_global -
x_local_i`` and ``x_new = x_global - aggregated_delta``.

1. **Isotropic quadratics** (FedNova benchmark): site ``i`` minimises
   ``F_i(x) = 1/2 ||x - c_i||^2``. Any linear local solver (SGD, heavy-ball
   momentum) started from ``x`` ends at ``x_local = c_i + s_i (x - c_i)`` with a
   scalar *response* ``s_i`` (plain SGD: ``s_i = (1 - lr)^tau_i``), so the fixed
   points of FedAvg and FedNova are weighted averages of the ``c_i``:

   * FedAvg:  weights ``p_i (1 - s_i)``;
   * FedNova: weights ``p_i (1 - s_i) / ||a_i||_1``;

   normalised to sum to one, while the true optimum of ``sum_i p_i F_i`` is
   ``x* = sum_i p_i c_i`` (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020, Sec. 3-4).

2. **Non-IID least squares** (AdaComm benchmark): site ``i`` holds ``(X_i, y_i)``
   and minimises ``F_i(x) = ||X_i x - y_i||^2 / (2 n_i)`` with mini-batch SGD.

3. **Runtime model** (Wang & Joshi, SysML 2019; Joshi's book chapter on
   local-update SGD): one round with ``tau`` local steps takes
   ``max_i sum_{k=1..tau} Y_{i,k} + D``, the slowest site's compute time plus a
   communication delay ``D``; the per-step times ``Y_{i,k}`` are i.i.d.
   shifted exponentials.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from strategies.aggregation import (  # noqa: E402
    fedavg_delta,
    fednova_delta,
    local_solver_norm,
)
from strategies.local_steps import LossSmoother, adacomm_tau  # noqa: E402

__all__ = [
    "LeastSquaresFederation",
    "RunTrace",
    "aggregate",
    "average_iterate",
    "closed_form_fixed_point",
    "iterate_to_fixed_point",
    "local_response",
    "local_sgd_least_squares",
    "local_sgd_quadratic",
    "loss_on_grid",
    "make_least_squares_federation",
    "round_time",
    "run_local_update_sgd",
    "sample_step_times",
    "time_to_reach",
    "trailing_mean",
]


# --------------------------------------------------------------------------- #
# Shared: one server step with the project's aggregators
# --------------------------------------------------------------------------- #
def aggregate(
    x_global: np.ndarray,
    x_local: np.ndarray,
    num_examples: Sequence[int],
    method: str,
    a_norms: Sequence[float] | None = None,
) -> np.ndarray:
    """Return the new global model ``x_global - agg(delta_i)``.

    ``x_local`` has one leading site axis (``x_local[i]`` has ``x_global``'s
    shape); ``method`` is ``"fedavg"`` or ``"fednova"`` (then ``a_norms`` is
    required). The aggregation is done by ``strategies.aggregation``.
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


# --------------------------------------------------------------------------- #
# 1. Isotropic quadratics F_i(x) = 1/2 ||x - c_i||^2
# --------------------------------------------------------------------------- #
def local_sgd_quadratic(
    x_global: np.ndarray,
    centers: np.ndarray,
    steps: Sequence[int],
    lr: float,
    momentum: float = 0.0,
    noise_std: float = 0.0,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Run every site's local solver on ``F_i(x) = 1/2 ||x - c_i||^2``.

    The solver is PyTorch ``SGD`` (heavy-ball ``momentum``, first buffer = the
    gradient, buffer reset every round) on the stochastic gradient
    ``g = x - c_i + noise_std * xi`` with ``xi ~ N(0, I)``. Site ``i`` runs
    ``steps[i]`` steps; sites that are done stay where they are.

    Parameters
    ----------
    x_global : numpy.ndarray, shape (d,) or (K, d)
        Global model; a leading axis runs ``K`` independent chains at once.
    centers : numpy.ndarray, shape (M, d)
        Site optima ``c_i``.
    steps : sequence of int, length M
        Local steps ``tau_i``.
    lr, momentum, noise_std : float
        Learning rate, heavy-ball momentum in ``[0, 1)``, gradient noise std.
    rng : numpy.random.Generator, optional
        Required when ``noise_std > 0``.

    Returns
    -------
    numpy.ndarray, shape (M,) + x_global.shape
        The local models.
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


# --------------------------------------------------------------------------- #
# 2. Non-IID least squares with mini-batch SGD
# --------------------------------------------------------------------------- #
@dataclass
class LeastSquaresFederation:
    """Sites' least-squares data, zero-padded to a common length.

    ``features[i, :n_i]`` and ``targets[i, :n_i]`` are site ``i``'s data; the
    global objective is ``F(x) = sum_i p_i ||X_i x - y_i||^2 / (2 n_i)`` with
    ``p_i = n_i / sum_j n_j``.
    """

    features: np.ndarray  # (M, n_max, d)
    targets: np.ndarray  # (M, n_max)
    num_examples: np.ndarray  # (M,) int
    hessian: np.ndarray = field(init=False, repr=False)  # H = sum_i p_i X_i^T X_i / n_i
    linear: np.ndarray = field(init=False, repr=False)  # b = sum_i p_i X_i^T y_i / n_i
    constant: float = field(init=False, repr=False)  # c = sum_i p_i ||y_i||^2 / (2 n_i)

    def __post_init__(self) -> None:
        dim = self.features.shape[2]
        self.hessian, self.linear, self.constant = np.zeros((dim, dim)), np.zeros(dim), 0.0
        for p, n, xi, yi in zip(self.weights, self.num_examples, self.features, self.targets):
            xi, yi = xi[:n], yi[:n]
            self.hessian += p * xi.T @ xi / n
            self.linear += p * xi.T @ yi / n
            self.constant += p * float(yi @ yi) / (2 * n)

    @property
    def weights(self) -> np.ndarray:
        """Data weights ``p_i = n_i / sum_j n_j``."""
        n = self.num_examples.astype(np.float64)
        return n / n.sum()

    def loss(self, x: np.ndarray) -> float:
        """Exact global training loss ``F(x) = x^T H x / 2 - b^T x + c``."""
        return float(0.5 * x @ self.hessian @ x - self.linear @ x + self.constant)

    def optimum(self) -> np.ndarray:
        """Minimiser ``x* = H^{-1} b`` of ``F``."""
        return np.linalg.solve(self.hessian, self.linear)


def make_least_squares_federation(
    num_sites: int,
    dim: int,
    seed: int,
    min_examples: int = 200,
    max_examples: int = 1000,
    signal_norm: float = 10.0,
    heterogeneity: float = 0.3,
    label_noise: float = 0.3,
    scale_spread: float = 2.0,
) -> LeastSquaresFederation:
    """Draw a non-IID least-squares federation.

    Site ``i`` has ``n_i ~ U{min_examples..max_examples}`` rows
    ``x = z * s_i`` with ``z ~ N(0, I)`` and per-site, per-feature scales
    ``s_i = exp(U(-scale_spread, scale_spread)) / exp(scale_spread / 2)``
    (different curvature at each site: client drift), labels
    ``y = x^T (w + heterogeneity * h_i) + label_noise * eps`` with
    ``||w|| = signal_norm`` and ``h_i, eps`` standard normal. Starting from
    ``x = 0`` the initial loss is about ``signal_norm^2 / 2`` times the mean
    squared scale, far above the optimum's loss.
    """
    rng = np.random.default_rng(seed)
    n = rng.integers(min_examples, max_examples + 1, num_sites)
    features = np.zeros((num_sites, int(n.max()), dim))
    targets = np.zeros((num_sites, int(n.max())))
    w = rng.standard_normal(dim)
    w *= signal_norm / np.linalg.norm(w)
    for i in range(num_sites):
        scales = np.exp(rng.uniform(-scale_spread, scale_spread, dim) - scale_spread / 2)
        xi = rng.standard_normal((n[i], dim)) * scales
        wi = w + heterogeneity * rng.standard_normal(dim)
        features[i, : n[i]] = xi
        targets[i, : n[i]] = xi @ wi + label_noise * rng.standard_normal(n[i])
    return LeastSquaresFederation(features, targets, n.astype(np.int64))


def local_sgd_least_squares(
    fed: LeastSquaresFederation,
    x_global: np.ndarray,
    steps: int,
    lr: float,
    batch_size: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` mini-batch SGD steps at every site from ``x_global``.

    Mini-batches are drawn uniformly with replacement from each site's rows.
    Returns the local models ``(M, d)`` and each site's loss on its first
    mini-batch, i.e. at the global model (what a site reports as its initial
    training loss; an unbiased estimate of ``F_i(x_global)``).
    """
    num_sites = fed.features.shape[0]
    rows = np.arange(num_sites)[:, None]
    n = fed.num_examples[:, None]
    x = np.repeat(x_global[None, :], num_sites, axis=0)
    first_losses = np.zeros(num_sites)
    all_idx = (rng.random((steps, num_sites, batch_size)) * n).astype(np.int64)
    for k in range(steps):
        xb, yb = fed.features[rows, all_idx[k]], fed.targets[rows, all_idx[k]]
        residual = (xb @ x[:, :, None])[:, :, 0] - yb  # (M, B)
        if k == 0:
            first_losses = 0.5 * np.mean(residual**2, axis=1)
        x -= (lr / batch_size) * (residual[:, None, :] @ xb)[:, 0, :]
    return x, first_losses


# --------------------------------------------------------------------------- #
# 3. Runtime model
# --------------------------------------------------------------------------- #
def sample_step_times(
    rng: np.random.Generator, num_sites: int, steps: int, shift: float, scale: float
) -> np.ndarray:
    """Per-step compute times ``Y = shift + Exp(scale)``, shape ``(M, steps)``."""
    return shift + rng.exponential(scale, (num_sites, steps))


def round_time(step_times: np.ndarray, comm_delay: float) -> float:
    """Wall-clock time of one round: ``max_i sum_k Y_{i,k} + D``.

    Every site must finish its ``tau`` local steps before the (synchronous)
    averaging, so the slowest site sets the compute time; the communication
    delay ``D`` is paid once per round.
    """
    return float(step_times.sum(axis=1).max()) + float(comm_delay)


@dataclass
class RunTrace:
    """One run of local-update SGD: model after each round and its time."""

    times: np.ndarray  # (R + 1,), times[0] = 0
    losses: np.ndarray  # (R + 1,), exact F(x) after each round (losses[0] = F(x0))
    taus: np.ndarray  # (R,), local steps used in each round
    loss_estimates: np.ndarray  # (R,), the (smoothed) loss the schedule saw


def run_local_update_sgd(
    fed: LeastSquaresFederation,
    schedule: int | str,
    time_budget: float,
    lr: float,
    batch_size: int,
    comm_delay: float,
    step_shift: float,
    step_scale: float,
    seed: int,
    tau0: int = 16,
    tau_min: int = 1,
    tau_max: int | None = None,
    smoothing: float = 0.9,
) -> RunTrace:
    """Simulate FedAvg local-update SGD until ``time_budget`` is used.

    ``schedule`` is a fixed ``tau`` (int) or ``"adacomm"``: every round, the
    sites' first-batch losses at the global model are averaged with weights
    ``p_i``, smoothed with :class:`LossSmoother` (``beta=smoothing``), and the
    next round uses ``adacomm_tau(F_l, F_0, tau0, tau_min, tau_max)`` with
    ``F_0`` the first (smoothed = raw) observation; the first round uses
    ``tau0``. The run stops after the first round that ends at or past
    ``time_budget``.
    """
    rng = np.random.default_rng(seed)
    num_sites, _, dim = fed.features.shape
    weights = fed.weights
    adaptive = schedule == "adacomm"
    if not adaptive and (isinstance(schedule, bool) or not isinstance(schedule, int)):
        raise ValueError(f"schedule must be an int or 'adacomm', got {schedule!r}")
    tau = tau0 if adaptive else int(schedule)
    smoother = LossSmoother(smoothing)
    initial_loss: float | None = None
    x = np.zeros(dim)
    t = 0.0
    times, losses, taus, seen = [0.0], [fed.loss(x)], [], []
    while t < time_budget:
        x_local, first_losses = local_sgd_least_squares(fed, x, tau, lr, batch_size, rng)
        t += round_time(sample_step_times(rng, num_sites, tau, step_shift, step_scale), comm_delay)
        x = aggregate(x, x_local, fed.num_examples, "fedavg")
        taus.append(tau)
        smoothed = smoother.update(float(weights @ first_losses))
        seen.append(smoothed)
        if adaptive:
            if initial_loss is None:
                initial_loss = smoothed
            tau = adacomm_tau(smoothed, initial_loss, tau0, tau_min, tau_max)
        times.append(t)
        losses.append(fed.loss(x))
    return RunTrace(np.array(times), np.array(losses), np.array(taus), np.array(seen))


def loss_on_grid(times: np.ndarray, losses: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Loss of the latest model available at each grid time (step function)."""
    idx = np.searchsorted(times, grid, side="right") - 1
    return losses[np.clip(idx, 0, len(losses) - 1)]


def trailing_mean(curve: np.ndarray, window: int) -> np.ndarray:
    """Mean of ``curve[max(0, i - window + 1) : i + 1]`` for every ``i``."""
    csum = np.concatenate(([0.0], np.cumsum(curve)))
    idx = np.arange(len(curve))
    start = np.maximum(0, idx - window + 1)
    return (csum[idx + 1] - csum[start]) / (idx + 1 - start)


def time_to_reach(grid: np.ndarray, curve: np.ndarray, target: float) -> float:
    """First grid time at which ``curve <= target`` (``inf`` if never)."""
    hit = np.nonzero(curve <= target)[0]
    return float(grid[hit[0]]) if hit.size else float("inf")
