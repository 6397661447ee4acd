"""FedAvg's and FedNova's weights applied at the site, before masking; the coordinator's
normalisation of the unmasked sum.

Under secure aggregation the coordinator sees only ``S = sum_i c_i delta_i``, so a
site scales its own update first. With ``w_i = min(1, n_i / r)`` (``r``: the weight
reference the coordinator sends, the largest size it was told) a site cannot weigh
more than 1, and a coordinator cannot single one site out (it sets no site's weight).

* FedAvg: ``c_i = w_i``; ``sum_i p_i delta_i = S / sum_i w_i`` (exact while
  ``n_i <= r``).
* FedNova (Wang et al., NeurIPS 2020, eq. (7)): ``c_i = w_i a_f / a_i`` with the
  a-norm floored at ``a_f`` (``fednova.min-steps-fraction`` x the a-norm of tau), so
  ``c_i <= 1``; ``sum_i p_i delta_i / a_i = S / (a_f sum_i w_i)`` and
  ``Delta = tau_eff S / (a_f sum_i w_i)``, ``tau_eff = sum_i w_i a_i / sum_i w_i``.

The coordinator computes ``w_i`` and ``a_i`` from the sizes and steps the sites report
in the clear, as in a plain round; a site that reports other numbers than it used
moves its own weight within ``(0, 1]`` and its coordinates within ``[-clip, clip]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strategies.secure_aggregation.errors import SecAggError

__all__ = ["fedavg_from_sum", "fednova_from_sum", "fednova_tau_eff", "site_coefficient",
           "size_weight"]


def size_weight(num_examples: float, reference: float) -> float:
    """``w_i = min(1, n_i / r)``."""
    if not reference > 0:
        raise SecAggError(f"the weight reference must be > 0, got {reference!r}")
    return min(1.0, max(0.0, float(num_examples)) / float(reference))


def site_coefficient(num_examples: float, reference: float, a_norm: float = 0.0,
                     a_floor: float = 0.0) -> float:
    """``c_i``: FedAvg's ``w_i``, or FedNova's ``w_i a_f / max(a_i, a_f)`` when ``a_floor > 0``."""
    weight = size_weight(num_examples, reference)
    if a_floor > 0:
        weight *= a_floor / max(float(a_norm), a_floor)
    return weight


def fedavg_from_sum(total: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """``S / sum_i w_i``: FedAvg's example-weighted mean of the summed sites."""
    weight = float(np.sum(weights))
    if not weight > 0:
        raise SecAggError("the summed sites' weights add up to 0")
    return total / weight


def fednova_tau_eff(weights: Sequence[float], a_norms: Sequence[float], a_floor: float) -> float:
    """``tau_eff = sum_i w_i max(a_i, a_f) / sum_i w_i`` (the floored a-norms the sites used)."""
    w = np.asarray(weights, dtype=np.float64)
    if not (w.sum() > 0 and a_floor > 0):
        raise SecAggError("FedNova under secure aggregation needs weights and an a-norm floor > 0")
    return float(np.dot(w, np.maximum(np.asarray(a_norms, dtype=np.float64), a_floor)) / w.sum())


def fednova_from_sum(total: np.ndarray, weights: Sequence[float], a_norms: Sequence[float],
                     a_floor: float) -> np.ndarray:
    """``tau_eff S / (a_f sum_i w_i)``: FedNova's update from the sum of ``w_i a_f delta_i / a_i``."""
    tau_eff = fednova_tau_eff(weights, a_norms, a_floor)
    return tau_eff * total / (a_floor * float(np.sum(weights)))
