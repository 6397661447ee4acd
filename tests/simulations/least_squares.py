"""Non-IID federated least squares and the runtime model of local-update SGD (AdaComm simulation).

* **Least squares**: site ``i`` holds ``(X_i, y_i)`` and minimises
  ``F_i(x) = ||X_i x - y_i||^2 / (2 n_i)`` with mini-batch SGD; the global
  objective is ``F(x) = sum_i p_i F_i(x)``, ``p_i = n_i / sum_j n_j``.
* **Runtime model** (Wang & Joshi, "Adaptive communication strategies to
  achieve the best error-runtime trade-off in local-update SGD", SysML 2019;
  Joshi's book chapter on local-update SGD): one round with ``tau`` local
  steps takes ``max_i sum_{k=1..tau} Y_{i,k} + D``, the slowest site's
  compute time plus a communication delay ``D``; the per-step times
  ``Y_{i,k}`` are i.i.d. shifted exponentials.

A run aggregates with the project's FedAvg (:func:`quadratic.aggregate`
over :func:`strategies.aggregation.fedavg_delta`) and picks ``tau`` with the
project's :func:`strategies.local_steps.adacomm_tau` and
:class:`strategies.local_steps.LossSmoother`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from strategies.local_steps import LossSmoother, adacomm_tau
from tests.simulations.quadratic import aggregate


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
