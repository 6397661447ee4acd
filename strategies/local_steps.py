"""Local-steps schedule: AdaComm's adaptive number of local SGD steps.

References
----------
.. [1] Wang, Joshi, "Adaptive Communication Strategies to Achieve the Best
   Error-Runtime Trade-off in Local-Update SGD", SysML 2019 (AdaComm).

Notes
-----
Pure numpy/stdlib: this module must not import torch, MONAI, Flower or the
client / model layers.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from strategies.wire.errors import ConfigError

__all__ = ["LocalStepsError", "LossSmoother", "adacomm_tau"]

# Relative slack absorbed before rounding up, so that a product that is an
# integer up to floating-point rounding (e.g. sqrt(0.01) * 30 = 3.0000000000000004)
# is not bumped to the next integer.
_CEIL_RTOL = 1e-9


class LocalStepsError(ConfigError):
    """Raised for invalid inputs to the local-steps schedule."""


def _real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise LocalStepsError(f"{name} must be a real number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise LocalStepsError(f"{name} must be finite, got {out!r}")
    return out


def _int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise LocalStepsError(f"{name} must be an int, got {value!r}")
    out = int(value)
    if out < minimum:
        raise LocalStepsError(f"{name} must be >= {minimum}, got {out}")
    return out


def adacomm_tau(
    loss: float,
    initial_loss: float,
    tau0: int,
    tau_min: int = 1,
    tau_max: int | None = None,
) -> int:
    r"""Return AdaComm's number of local steps for the next round.

    Wang & Joshi (2019) [1]_ (AdaComm's loss-based rule, fixed learning rate)
    choose the communication period from the current training loss:

    .. math::

        \tau_l = \left\lceil \sqrt{F(x_l) / F(x_0)}\; \tau_0 \right\rceil ,

    i.e. many local steps while the loss is high (fast initial progress) and
    fewer as it falls (lower error floor). The result is clamped to
    ``[tau_min, tau_max]``. Pass a smoothed loss (:class:`LossSmoother`) so
    that round-to-round noise does not make :math:`\tau` jump.

    Parameters
    ----------
    loss : float
        Current global training loss :math:`F(x_l) \ge 0` (0 gives ``tau_min``).
    initial_loss : float
        Training loss :math:`F(x_0) > 0` at the start of training.
    tau0 : int
        Initial number of local steps :math:`\tau_0 \ge 1`.
    tau_min : int, default 1
        Lower clamp, ``>= 1``.
    tau_max : int or None, default None
        Upper clamp, ``>= tau_min``; ``None`` means no upper clamp.

    Returns
    -------
    int
        The number of local steps :math:`\tau_l`.

    Raises
    ------
    LocalStepsError
        If a loss is not finite, ``loss < 0``, ``initial_loss <= 0``, or the
        integer arguments are out of range.
    """
    loss_f = _real(loss, "loss")
    initial_f = _real(initial_loss, "initial_loss")
    if loss_f < 0.0:
        raise LocalStepsError(f"loss must be >= 0, got {loss_f!r}")
    if initial_f <= 0.0:
        raise LocalStepsError(f"initial_loss must be > 0, got {initial_f!r}")
    tau0_i = _int(tau0, "tau0", 1)
    tau_min_i = _int(tau_min, "tau_min", 1)
    tau_max_i = None if tau_max is None else _int(tau_max, "tau_max", tau_min_i)

    raw = math.sqrt(loss_f / initial_f) * tau0_i
    if not math.isfinite(raw):
        raise LocalStepsError(
            f"loss / initial_loss overflows ({loss_f!r} / {initial_f!r})"
        )
    tau = math.ceil(raw - _CEIL_RTOL * max(1.0, raw))
    tau = max(tau, tau_min_i)
    if tau_max_i is not None:
        tau = min(tau, tau_max_i)
    return int(tau)


class LossSmoother:
    r"""Exponential moving average of the global training loss.

    AdaComm [1]_ reads the training loss each round; the federated estimate
    (a weighted mean of the sampled sites' losses) is noisy, especially with
    partial participation, and a noisy loss makes :math:`\tau` jump up and
    down. The smoother returns

    .. math:: \bar F_l = \beta \bar F_{l-1} + (1 - \beta) F_l, \qquad \bar F_1 = F_1,

    i.e. it is initialised with the first observation (no zero-start bias to
    correct). ``beta = 0`` disables smoothing.

    Parameters
    ----------
    beta : float, default 0.9
        Smoothing factor in ``[0, 1)``; larger is smoother.

    Raises
    ------
    LocalStepsError
        If ``beta`` is outside ``[0, 1)``.

    Examples
    --------
    >>> s = LossSmoother(beta=0.5)
    >>> s.update(1.0), s.update(0.0)
    (1.0, 0.5)
    """

    def __init__(self, beta: float = 0.9) -> None:
        beta_f = _real(beta, "beta")
        if not 0.0 <= beta_f < 1.0:
            raise LocalStepsError(f"beta must be in [0, 1), got {beta_f!r}")
        self._beta = beta_f
        self._value: float | None = None

    @property
    def beta(self) -> float:
        """The smoothing factor."""
        return self._beta

    @property
    def value(self) -> float | None:
        """The current smoothed loss, ``None`` before the first update."""
        return self._value

    def update(self, loss: float) -> float:
        """Fold in a new loss observation and return the smoothed value.

        Raises
        ------
        LocalStepsError
            If ``loss`` is not finite or negative; the state is left unchanged.
        """
        loss_f = _real(loss, "loss")
        if loss_f < 0.0:
            raise LocalStepsError(f"loss must be >= 0, got {loss_f!r}")
        if self._value is None:
            self._value = loss_f
        else:
            self._value = self._beta * self._value + (1.0 - self._beta) * loss_f
        return self._value

    def state(self) -> dict[str, float | None]:
        """Return a JSON-serialisable snapshot for server checkpoints."""
        return {"beta": self._beta, "value": self._value}

    @classmethod
    def from_state(cls, state: dict[str, float | None]) -> LossSmoother:
        """Rebuild a smoother from :meth:`state` output."""
        try:
            beta, value = state["beta"], state["value"]
        except (KeyError, TypeError) as exc:
            raise LocalStepsError(
                f"smoother state must have 'beta' and 'value' keys, got {state!r}"
            ) from exc
        smoother = cls(beta if beta is not None else 0.9)
        if value is not None:
            smoother.update(value)
        return smoother
