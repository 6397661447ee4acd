"""The ``server-opt.*`` section and the base class of every server optimizer.

A server optimizer turns the round's pseudo-gradient ``Delta`` (what the aggregator made of
the sites' updates: FedAvg, FedNova, a robust rule, or the unmasked SecAgg+ sum) into the
step ``s`` the global model takes, ``x <- x - s`` (sign convention of DESIGN.md). It acts on
the float parameter arrays only (``trained`` in :meth:`ServerOptPlugin.step`): integer
buffers (a BatchNorm's ``num_batches_tracked``) and normalisation running statistics
(``running_mean``, ``running_var``; :mod:`strategies.rounds.normalisation_statistics`) are
estimates the sites' forward passes write, not trained by a gradient, so they take the plain
``Delta`` (the server's checks of them then hold as without an optimizer).

One section serves every optimizer (a run chooses one): ``eta`` the server learning rate
(0: the optimizer's own default, :attr:`ServerOptPlugin.default_eta`), ``momentum`` (avgm),
``beta1``, ``beta2``, ``tau`` (adagrad, adam, yogi). A key the chosen optimizer does not
read must keep its default (:meth:`ServerOptPlugin.requires`), so a setting meant for
another optimizer is never silently ignored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from strategies.plugins.run_settings import RunSettings
from strategies.wire.plugin_options import Plugin, PluginError, PluginOptions, option

__all__ = ["ServerOptOptions", "ServerOptPlugin"]


@dataclass(frozen=True)
class ServerOptOptions(PluginOptions):
    """Run-config section ``server-opt`` (every server optimizer's; each reads some keys).

    Attributes
    ----------
    eta : float
        ``server-opt.eta``: the server learning rate (eta of Reddi et al.; Hsu et al.'s
        server learning rate), > 0; 0 (default): the chosen optimizer's default.
    momentum : float
        ``server-opt.momentum``: FedAvgM's server momentum beta in [0, 1).
    beta1, beta2 : float
        ``server-opt.beta1``, ``server-opt.beta2``: the decay of the first and second
        moments, in [0, 1) (beta2: adam and yogi only).
    tau : float
        ``server-opt.tau``: the adaptivity (epsilon) added to ``sqrt(v)``, > 0.
    """

    section = "server-opt"
    eta: float = option(0.0, at_least=0.0)
    momentum: float = option(0.9, at_least=0.0, below=1.0)
    beta1: float = option(0.9, at_least=0.0, below=1.0)
    beta2: float = option(0.99, at_least=0.0, below=1.0)
    tau: float = option(1e-3, at_least=0.0)

    def check(self) -> None:
        """tau > 0: it keeps the adaptive step finite where ``v`` is 0."""
        if self.tau <= 0.0:
            self.fail("tau", "must be > 0 (it keeps eta m / (sqrt(v) + tau) finite)")


class ServerOptPlugin(Plugin, ABC):
    """Base of a server optimizer: options, refusals, the arrays it acts on.

    A subclass sets :attr:`name`, :attr:`reads` and :attr:`default_eta`, and implements
    :meth:`_step` on the trained arrays; its state (moments, round count) lives in plain
    attributes, so the strategy checkpoint saves and restores it
    (:mod:`strategies.rounds.checkpoint`).
    """

    Options = ServerOptOptions
    #: Its ``strategy.server-opt`` name.
    name: ClassVar[str] = ""
    #: The ``server-opt.*`` fields it reads (``eta`` first, always).
    reads: ClassVar[tuple[str, ...]] = ("eta",)
    #: Its server learning rate when ``server-opt.eta = 0``.
    default_eta: ClassVar[float] = 1.0

    def __init__(self, eta: float = 0.0, **options: float) -> None:
        unknown = sorted(set(options) - set(self.reads))
        if unknown:
            raise TypeError(f"{type(self).__name__} reads {list(self.reads)}, not {unknown}")
        checked = ServerOptOptions(eta=eta, **options)
        self.eta = checked.eta or self.default_eta
        #: Rounds applied so far (t of Reddi et al.'s Algorithm 2).
        self.rounds = 0
        for name in self.reads[1:]:
            setattr(self, name, getattr(checked, name))

    @classmethod
    def requires(cls, options: ServerOptOptions, settings: RunSettings | None) -> None:
        """Refuse a key it does not read set away from its default, and pruning.

        Raises
        ------
        PluginError
            Naming the key: a ``server-opt.*`` key the optimizer ignores; with
            ``strategy.pruning``, any optimizer but ``sgd`` (its moments are per
            coordinate of the compacted model, whose shape changes at each re-pruning).
        """
        for f in fields(options):
            if f.name not in cls.reads and getattr(options, f.name) != f.default:
                raise PluginError(
                    f"run config key '{options.key(f.name)}' is not read by "
                    f"strategy.server-opt = {cls.name!r} (it reads "
                    f"{[options.key(n) for n in cls.reads]}); leave it at {f.default!r}")
        if settings is not None and settings.pruning != "none" and cls.name != "sgd":
            raise PluginError(
                f"run config key 'strategy.server-opt' = {cls.name!r} cannot run with "
                f"'strategy.pruning' = {settings.pruning!r}: the optimizer keeps its state per "
                "coordinate of the pruned model, whose kept coordinates change at each "
                "re-pruning; use strategy.server-opt = 'sgd'")

    @property
    def active(self) -> bool:
        """Whether its step is other than the plain ``x - Delta`` (every optimizer's is)."""
        return True

    @classmethod
    def from_options(cls, options: ServerOptOptions,
                     settings: RunSettings | None) -> ServerOptPlugin:
        """The optimizer with the section's keys it reads."""
        return cls(**{name: getattr(options, name) for name in cls.reads})

    def step(self, delta: list[np.ndarray], trained: Sequence[bool]) -> list[np.ndarray]:
        """The step ``s`` (``x <- x - s``, model order and dtypes) for the round's ``Delta``.

        ``trained[j]``: array ``j`` is a float parameter the optimizer acts on; the others
        take ``delta[j]`` itself. Advances the state (moments, :attr:`rounds`).
        """
        self.rounds += 1
        positions = [j for j, flag in enumerate(trained) if flag]
        steps = self._step([np.asarray(delta[j], dtype=np.float64) for j in positions])
        out = list(delta)
        for j, s in zip(positions, steps):
            out[j] = s.astype(delta[j].dtype, copy=False)
        return out

    @abstractmethod
    def _step(self, delta: list[np.ndarray]) -> list[np.ndarray]:
        """The steps (float64) of the trained arrays ``delta`` (float64); updates the state."""
