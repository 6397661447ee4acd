r"""Compression-rate schedules (``strategy.codec-rate``): the kept fraction of each round.

``fixed`` keeps the codec's own fraction (``strategy.codec``, or its warm-up:
:mod:`strategies.wire.codecs.warmup`), as before. ``adaptive`` implements the adaptive
compression rate of the book's chapter 3, §3.3.2 (Han, Wang, Leung [1]_): the rate
is chosen to minimise the wall-clock time to reach a target empirical risk, and it
is updated once per round by *sign-based online gradient descent*, where only the
sign of the derivative of the per-round cost with respect to the rate is estimated.

The cost of round :math:`s` is its time per unit of risk reduction, the
time-to-target framing of Wang & Joshi's AdaComm [2]_:

.. math:: \theta_s = \frac{T_s}{\Delta F_s}, \qquad
          \Delta F_s = \log F_s - \log F_{s+1},

with :math:`T_s` the round's wall-clock time and :math:`F_s` the training loss of
the global model sent in round :math:`s` (the example-weighted ``initial-loss`` of
the sites' replies; :math:`F_{s+1}` arrives with the next round, so the estimate
lags one round). The reduction is measured in log-loss so that a geometric loss
curve, which any fixed rate gives far from the optimum, makes :math:`\theta_s`
stationary instead of growing round after round. With :math:`u = \log r` the
update after round :math:`t` (the step of [1]_'s sign-based online learning, in
log-rate space) is

.. math:: \hat g_t = \operatorname{sign}(\theta_{t-1} - \theta_{t-2})\,
                     \operatorname{sign}(u_{t-1} - u_{t-2}), \qquad
          u_{t+1} = \operatorname{clip}(u_t - \eta\,\hat g_t,\ \log r_{\min},
                                        \log r_{\max}),

and with ``codec-rate.interval`` :math:`m > 1` each rate is kept :math:`m` rounds
``a..b`` and :math:`t` counts intervals, whose cost is
:math:`\theta_k = \sum_{s=a}^{b} T_s / (\log F_a - \log F_{b+1})` (a noisy loss
weighs :math:`m` times less against the interval's progress). Both are
computed from the efficiencies :math:`e = \Delta F / T` as
:math:`-\operatorname{sign}(e_{t-1} - e_{t-2})` (the same sign where both are
positive; a round that made no progress, :math:`e \le 0`, ranks below any that
did, where :math:`\theta` is undefined). Until two measured rounds with different
rates exist (the first rounds, or two rounds at a bound), the rate probes: it
keeps its last direction (first: down, more compression), or moves away from the
bound it sits at. A wrong sign from noise costs one step :math:`\eta`, and the
clip bounds where any sequence of them can lead.

:math:`T_s` is the slowest accepted site's ``train-seconds`` plus its bytes (down
and up) over the link speed, :math:`\max_i (c_i + 8 b_i / L)`: a synchronous round
waits for its slowest site, so the maximum, not the sum or the median, is the
round's time. ``codec-rate.link-mbps`` gives :math:`L` (a link-speed model, for
simulation); at 0 the time is measured: the slowest site's seconds from the
instruction's push to its reply's pull (transfer, start-up and training).

References
----------
.. [1] Han, Wang, Leung, "Adaptive Gradient Sparsification for Efficient
   Federated Learning: An Online Learning Approach", ICDCS 2020; the book's
   chapter 3 (Joshi, Wang, "Communication-Efficient Distributed Optimization
   Algorithms"), §3.3.2.
.. [2] Wang, Joshi, "Adaptive Communication Strategies to Achieve the Best
   Error-Runtime Trade-off in Local-Update SGD", SysML 2019.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from strategies.plugins.registries import CODEC_RATES
from strategies.plugins.run_settings import RunSettings
from strategies.wire.codecs.spec import CodecSpec, parse_spec
from strategies.wire.plugin_options import Plugin, PluginError, PluginOptions, option

__all__ = ["AdaptiveCodecRate", "CodecRateOptions", "FixedCodecRate", "SiteRound",
           "round_seconds", "sign_ogd_step"]

#: Log-rates closer than this are the same rate (a rate goes to the sites and back).
_SAME = 1e-9


@dataclass(frozen=True)
class SiteRound:
    """What one accepted train reply tells about the round's cost and progress.

    Attributes
    ----------
    train_seconds : float
        The site's reported ``train-seconds`` (compute).
    reply_seconds : float
        Seconds from the instruction's push to the reply's pull (0: not measured).
    bytes_sent : float
        The site's bytes down (instruction) plus up (reply).
    num_examples : int
        The reply's (capped) ``num-examples``.
    initial_loss : float
        Loss of the received global model on the site's first batch.
    """

    train_seconds: float
    reply_seconds: float
    bytes_sent: float
    num_examples: int
    initial_loss: float


def round_seconds(sites: Sequence[SiteRound], link_mbps: float) -> float:
    """:math:`T = \\max_i (c_i + 8 b_i / L)` with ``L = link_mbps`` Mbit/s, or at
    ``link_mbps = 0`` the measured :math:`\\max_i \\max(\\text{reply}_i, c_i)`."""
    if link_mbps > 0:
        return max(s.train_seconds + 8.0 * s.bytes_sent / (link_mbps * 1e6) for s in sites)
    return max(max(s.reply_seconds, s.train_seconds) for s in sites)


def sign_ogd_step(log_rates: Sequence[float], efficiencies: Sequence[float],
                  direction: float) -> float:
    """The step's direction :math:`-\\hat g_t` (+1: keep more, -1: keep less).

    Parameters
    ----------
    log_rates, efficiencies : sequence of float
        :math:`u_s` and :math:`e_s = \\Delta F_s / T_s` of the measured rounds, oldest
        first.
    direction : float
        The last step's direction, kept when no sign can be estimated (fewer than two
        measured rounds, equal rates or equal efficiencies).
    """
    if len(efficiencies) < 2:
        return direction
    du = log_rates[len(efficiencies) - 1] - log_rates[len(efficiencies) - 2]
    de = efficiencies[-1] - efficiencies[-2]
    if abs(du) < _SAME or de == 0:
        return direction
    return float(np.sign(de) * np.sign(du))  # -g: theta falls where e rises


@dataclass(frozen=True)
class CodecRateOptions(PluginOptions):
    """Run-config section ``codec-rate`` (read by ``strategy.codec-rate = "adaptive"``).

    Attributes
    ----------
    min, max : float
        ``codec-rate.min`` / ``codec-rate.max``: the clip of the kept fraction,
        ``0 < min <= max <= 1``.
    step : float
        ``codec-rate.step``: :math:`\\eta`, the step in log-rate (0.5: x1.65 a round).
    link_mbps : float
        ``codec-rate.link-mbps``: link speed of the time model in Mbit/s; 0 = measure
        the time (deployment).
    interval : int
        ``codec-rate.interval``: rounds each rate is kept, :math:`m` (the cost is
        measured over the interval: a noisy loss weighs :math:`m` times less).
    """

    section = "codec-rate"
    min: float = option(0.001, at_least=0.0)
    max: float = option(1.0, at_least=0.0)
    step: float = option(0.5, at_least=0.0)
    link_mbps: float = option(0.0, at_least=0.0)
    interval: int = option(1, at_least=1)

    def check(self) -> None:
        """``0 < min <= max <= 1`` and a positive step."""
        if not 0.0 < self.min <= 1.0:
            self.fail("min", "must be in (0, 1]")
        if not self.min <= self.max <= 1.0:
            self.fail("max", f"must be in [{self.key('min')} = {self.min:g}, 1]")
        if self.step <= 0.0:
            self.fail("step", "must be > 0")


@CODEC_RATES.register("fixed")
class FixedCodecRate(Plugin):
    """The codec's own fraction every round (its warm-up included); tracks nothing.

    Not ``active``: the round neither asks it for a rate nor tells it the round.
    """

    active = False

    def rate_for(self, spec: CodecSpec) -> float | None:
        """None: the round's spec is the codec's."""
        return None

    def observe(self, rate: float | None, sites: Sequence[SiteRound]) -> dict[str, float]:
        """Nothing adapts and nothing new is tracked."""
        return {}


@CODEC_RATES.register("adaptive")
class AdaptiveCodecRate(Plugin):
    """Sign-based online gradient descent on the log kept fraction (module docstring)."""

    Options = CodecRateOptions
    active = True

    def __init__(self, min: float = 0.001, max: float = 1.0,  # pylint: disable=redefined-builtin
                 step: float = 0.5, link_mbps: float = 0.0, interval: int = 1) -> None:
        options = CodecRateOptions(min=min, max=max, step=step, link_mbps=link_mbps,
                                   interval=interval)
        self.bounds = (math.log(options.min), math.log(options.max))
        self.step, self.link_mbps = options.step, options.link_mbps
        self.interval = options.interval
        self.log_rate: float | None = None
        self.direction = -1.0
        self.log_rates: list[float] = []
        self.seconds: list[float] = []
        self.losses: list[float] = []

    @staticmethod
    def requires(options: CodecRateOptions, settings: RunSettings | None) -> None:
        """Refuse a codec the rate cannot follow, naming the keys.

        Raises
        ------
        PluginError
            With a codec that keeps no fraction (only ``topk`` and ``randk`` do), or
            with a warm-up (two schedules of one rate).
        """
        if settings is None:
            return
        if parse_spec(settings.codec).fraction is None:
            raise PluginError(f"run config key 'strategy.codec-rate' = 'adaptive' needs a codec "
                              f"that keeps a fraction ('topk:<f>', 'randk:<f>') in "
                              f"'strategy.codec', got {settings.codec!r}")
        if settings.codec_warmup_rounds:
            raise PluginError("run config key 'strategy.codec-rate' = 'adaptive' cannot be "
                              "combined with 'strategy.codec-warmup-rounds' = "
                              f"{settings.codec_warmup_rounds} (both set the kept fraction); "
                              "set one of them")

    @classmethod
    def from_options(cls, options: CodecRateOptions, settings: RunSettings) -> AdaptiveCodecRate:
        """The schedule for a run."""
        return cls(min=options.min, max=options.max, step=options.step,
                   link_mbps=options.link_mbps, interval=options.interval)

    def rate_for(self, spec: CodecSpec) -> float:
        """This round's kept fraction; the first round starts at the codec's, clipped."""
        if self.log_rate is None:
            self.log_rate = float(np.clip(math.log(float(spec.fraction)), *self.bounds))
        return math.exp(self.log_rate)

    def efficiencies(self) -> list[float]:
        """:math:`e_k` of every measured interval ``k`` of :math:`m` rounds ``a..b``:
        :math:`(\\log F_a - \\log F_{b+1}) / \\sum_{s=a}^{b} T_s`."""
        logs, m = np.log(np.maximum(self.losses, np.finfo(float).tiny)), self.interval
        return [float((logs[k * m] - logs[(k + 1) * m]) / sum(self.seconds[k * m:(k + 1) * m]))
                for k in range((len(logs) - 1) // m)]

    def observe(self, rate: float | None, sites: Sequence[SiteRound]) -> dict[str, float]:
        """Record the round run at ``rate`` and step the rate for the next one.

        Returns ``codec-rate`` (the fraction this round used) and, when a site
        replied, ``codec-rate-seconds`` (:func:`round_seconds`); nothing before the
        schedule chose a rate (:meth:`rate_for`).
        """
        if self.log_rate is None or rate is None:
            return {}
        if not sites:
            return {"codec-rate": float(rate)}
        seconds = round_seconds(sites, self.link_mbps)
        n = np.array([s.num_examples for s in sites], dtype=np.float64)
        self.log_rates.append(math.log(rate))
        self.seconds.append(max(seconds, 1e-9))
        self.losses.append(float(np.dot(n / n.sum(), [s.initial_loss for s in sites])))
        if len(self.log_rates) % self.interval == 0:  # an interval ends: step the rate
            self._step()
        return {"codec-rate": float(rate), "codec-rate-seconds": float(seconds)}

    def _step(self) -> None:
        """Sign-OGD on the intervals' log-rates and efficiencies (module docstring)."""
        low, high = self.bounds
        rates = self.log_rates[::self.interval]
        last = rates[-1]
        at_bound = (len(rates) > 1 and abs(last - rates[-2]) < _SAME
                    and min(abs(last - low), abs(last - high)) < _SAME)
        direction = (1.0 if abs(last - low) < _SAME else -1.0) if at_bound else self.direction
        self.direction = sign_ogd_step(rates, self.efficiencies(), direction)
        self.log_rate = float(np.clip(last + self.step * self.direction, low, high))
