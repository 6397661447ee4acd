"""FedAvg's and FedNova's weights applied at the site, before masking, and the sum's scale.

Under secure aggregation the coordinator sees only ``S = sum_i c_i delta_i``, so a
site scales its own update first. With ``w_i = min(1, n_i / r)`` (``r``: the weight
reference the coordinator sends, the largest size it was told) a site cannot weigh
more than 1, and a coordinator cannot single one site out (it sets no site's weight).

* FedAvg: ``c_i = w_i``;
* FedNova (Wang et al., NeurIPS 2020, eq. (7)): ``c_i = w_i a_f / a_i`` with the
  a-norm floored at ``a_f`` (``fednova.min-steps-fraction`` x the a-norm of tau), so
  ``c_i <= 1``.

Either way ``c_i = kappa m_i / a_i`` (FedAvg ``a_i = 1``; FedNova the floored a-norm),
with ``m_i = min(n_i, r)`` and the round's constant ``kappa`` (:func:`sum_scale`:
``1 / r``, FedNova ``a_f / r``): ``kappa`` times the weight the aggregator's fold gives
a site of ``m_i`` examples. So ``S / kappa`` is the running sum of a plain round, and the
aggregator finishes it as one
(:class:`~strategies.plugins.protocols.SecureSumAggregator`): FedAvg
``Delta = S / (kappa sum_i m_i)``, FedNova ``Delta = tau_eff S / (kappa sum_i m_i)``.

The coordinator counts ``m_i`` and ``a_i`` from the sizes and steps the sites report
in the clear, as in a plain round; a site that reports other numbers than it used
moves its own weight within ``(0, 1]`` and its coordinates within ``[-clip, clip]``.
"""

from __future__ import annotations

from strategies.wire.secure_aggregation.errors import SecAggError

__all__ = ["site_coefficient", "size_weight", "sum_scale"]


def _reference(reference: float) -> float:
    """``r`` as a float after checking it is > 0."""
    if not reference > 0:
        raise SecAggError(f"the weight reference must be > 0, got {reference!r}")
    return float(reference)


def size_weight(num_examples: float, reference: float) -> float:
    """``w_i = min(1, n_i / r)``."""
    return min(1.0, max(0.0, float(num_examples)) / _reference(reference))


def sum_scale(reference: float, a_floor: float = 0.0) -> float:
    """``kappa``: ``1 / r``, or FedNova's ``a_f / r`` when ``a_floor > 0``
    (``c_i = kappa m_i / a_i``)."""
    return (float(a_floor) if a_floor > 0 else 1.0) / _reference(reference)


def site_coefficient(num_examples: float, reference: float, a_norm: float = 0.0,
                     a_floor: float = 0.0) -> float:
    """``c_i``: FedAvg's ``w_i``, or FedNova's ``w_i a_f / max(a_i, a_f)`` when ``a_floor > 0``."""
    weight = size_weight(num_examples, reference)
    if a_floor > 0:
        weight *= a_floor / max(float(a_norm), a_floor)
    return weight
