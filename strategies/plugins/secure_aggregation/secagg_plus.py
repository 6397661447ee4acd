"""SecAgg+ (``strategy.secure-aggregation = "secagg+"``): the coordinator learns only the sum.

Bell, Bonawitz, Gascón, Lepoint, Raykova, "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", CCS 2020: each site masks its clipped, weighted and
quantised update with pairwise masks agreed with its ``k`` neighbours and a self
mask; the masks cancel in the sum mod ``m``, and the coordinator removes what is
left of the drop-outs' (pairwise) and the survivors' (self) masks from Shamir
shares the neighbours hold (:mod:`strategies.secure_aggregation`). The round
itself is :mod:`strategies.rounds.secure_train`.

Run-config section ``secagg`` (:class:`SecAggOptions`):

* ``secagg.clip`` (1.0): each coordinate of a site's weighted update is clipped to
  ``[-clip, clip]`` at the site; it is also what a malicious site can add, at most,
  to each coordinate of the sum (it can add any value within that range, unseen);
* ``secagg.bits`` (20): ``b``, the stochastic-rounding precision of a coordinate;
  the sum of ``n`` sites is exact in ``Z_m`` with ``m = 2^ceil(log2(n (2^b - 1) + 1))``;
* ``secagg.neighbours`` (0): ``k``, each site's neighbours; 0: ``6 ceil(log2 n)``;
* ``secagg.threshold`` (0.5): ``t`` as a fraction of the ``k + 1`` holders of a site's
  shares (its neighbours and itself; ``t > (k + 1) / 2`` always);
* ``secagg.min-participants`` (2): the coordinator unmasks no sum of fewer inputs.

Refused with it (:meth:`SecAggPlus.requires`, naming the key): a defence
(``strategy.defence`` other than ``none``: norm-bound, Multi-Krum need each
update), an aggregator that cannot finish from the sum (``strategy.aggregator``: one that
is no :class:`~strategies.plugins.protocols.SecureSumAggregator`; median and trimmed mean
need each update), a codec that is not linear across sites
(``strategy.codec`` other than ``none``, ``fp16`` or ``randk:<f>``: top-k's indices
differ per site, QSGD's and sign's scales too) and the adaptive compression rate
(``strategy.codec-rate``: it measures each site's reply).
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.compression import parse_spec
from strategies.plugins.protocols import SecureSumAggregator
from strategies.plugins.registries import AGGREGATORS, SECURE_AGGREGATION
from strategies.plugins.run_settings import RunSettings
from strategies.wire.plugin_options import Plugin, PluginError, PluginOptions, option
from strategies.wire.secure_aggregation.errors import SecAggConfigError
from strategies.wire.secure_aggregation.settings import MAX_BITS, SecAggSettings
from strategies.wire.secure_aggregation.vector import SUMMABLE_CODECS

__all__ = ["SecAggOptions", "SecAggPlus"]

_WHY = "the coordinator sees only the sum of the sites' updates"


@dataclass(frozen=True)
class SecAggOptions(PluginOptions):
    """Run-config section ``secagg``.

    :class:`~strategies.wire.secure_aggregation.settings.SecAggSettings` holds its values.
    """

    section = "secagg"
    clip: float = option(1.0, at_least=0.0)
    bits: int = option(20, at_least=2, below=MAX_BITS + 1)
    neighbours: int = option(0, at_least=0)
    threshold: float = option(0.5, at_least=0.5)
    min_participants: int = option(2, at_least=2)

    def check(self) -> None:
        """The settings' own rules (clip > 0, threshold <= 1, neighbours 0 or >= 2)."""
        try:
            self.settings()
        except SecAggConfigError as exc:
            raise PluginError(f"run config key {exc}") from exc

    def settings(self) -> SecAggSettings:
        """The checked :class:`SecAggSettings`."""
        return SecAggSettings(clip=self.clip, bits=self.bits, neighbours=self.neighbours,
                              threshold=self.threshold,
                              min_participants=self.min_participants).check()


def _finishes_secure_sums(plugin: type) -> bool:
    """Whether the aggregator class ``plugin`` is a :class:`SecureSumAggregator` (the class
    carries every member of the Protocol its instances meet: the capability, not a name)."""
    return isinstance(plugin, SecureSumAggregator)


def _refuse(key: str, value: str, why: str) -> PluginError:
    return PluginError(f"run config key '{key}' = {value!r} cannot be used with "
                       f"'strategy.secure-aggregation' = 'secagg+': {why}")


@SECURE_AGGREGATION.register("secagg+")
class SecAggPlus(Plugin):
    """SecAgg+ with the run's ``secagg.*`` settings (``settings``)."""

    Options = SecAggOptions

    def __init__(self, clip: float = 1.0, bits: int = 20, neighbours: int = 0,
                 threshold: float = 0.5, min_participants: int = 2) -> None:
        self.settings: SecAggSettings | None = SecAggOptions(
            clip=clip, bits=bits, neighbours=neighbours, threshold=threshold,
            min_participants=min_participants).settings()

    @staticmethod
    def requires(options: PluginOptions, settings: RunSettings | None) -> None:
        """Refuse the plug-ins and codecs that need each site's update, naming the key."""
        if settings is None:
            return
        if settings.defence != "none":
            raise _refuse("strategy.defence", settings.defence,
                          f"a defence judges each site's update and {_WHY}; set "
                          "strategy.defence = \"none\" (secagg.clip bounds what one site adds)")
        if not _finishes_secure_sums(AGGREGATORS.get(settings.aggregator)):
            summing = [name for name, plugin in AGGREGATORS.entries().items()
                       if _finishes_secure_sums(plugin)]
            raise _refuse("strategy.aggregator", settings.aggregator,
                          f"a robust rule needs each site's update and {_WHY}; use one of "
                          f"{summing}")
        codec = parse_spec(settings.codec)
        if codec.name not in SUMMABLE_CODECS or codec.per_tensor:
            raise _refuse("strategy.codec", settings.codec,
                          "its sum over sites is not the codec of the sum (per-site indices "
                          f"or scales); use one of none, fp16, randk:<fraction>")
        if settings.codec_rate != "fixed":
            raise _refuse("strategy.codec-rate", settings.codec_rate,
                          f"it measures each site's reply and {_WHY}; use \"fixed\"")
