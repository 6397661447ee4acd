"""PruneFL: initial magnitude pruning, then adaptive re-pruning from the sites' squared gradients.

Jiang, Wang, Valls, Ko, Lee, Leung, Tassiulas, "Model Pruning Enables Efficient
Federated Learning on Edge Devices", IEEE TNNLS 2022 (arXiv 1909.12326); the
book's ch. 3, §3.3.3.

**Initial pruning** (:meth:`PruneFL.initialise`): per group of the structure
(:mod:`strategies.plugins.pruning.units`) keep the ``max(1, round(d0 n))`` units of
largest magnitude (``d0`` = ``pruning.initial-density``, ``n`` the group's units;
magnitude ``|w|`` of a weight, the root-mean-square of a channel's weights).

**Adaptive re-pruning** (:meth:`PruneFL.observe`, every ``pruning.interval`` rounds up
to ``pruning.stop-round``): the paper maximises the first-order empirical-risk
reduction of one SGD step per unit of round time, ``Delta(M) / T(M)`` with
``Delta(M) = sum_{j in M} g_j^2`` (``g_j^2``: the sites' squared gradients of coordinate
``j``, summed in the paper; here ``n`` x the median of the ``n`` sites' clipped reports, so
that one site cannot choose the mask:
:func:`strategies.plugins.pruning.pruning_round.squared_gradients`)
and ``T(M) = c + sum_{j in M} t_j``. A unit ``u`` has value
``v_u = sum of g^2 over its coordinates`` and cost ``c_u = t x (its coordinates)``.
As the reference implementation (control/algorithm.py) does it:

1. per group, the ``floor(f n_kept)`` kept units of smallest magnitude
   (``f`` = ``pruning.decrease-fraction``) and every pruned unit are candidates; the
   other kept units stay;
2. ``N = sum v`` over the staying units ``+ sum g^2`` over the coordinates of no unit,
   ``D = c + sum c_u`` over the staying units ``+ t x`` (coordinates of no unit);
3. in decreasing order of ``v_u / c_u``, add candidate ``u`` while ``v_u / c_u > N / D``
   (``N += v_u``, ``D += c_u``) and the kept units' cost stays within
   ``pruning.max-density`` x the cost of all units; stop at the first that fails;
4. no group is left without a unit: a group that keeps ``n_kept >= 1`` units (the
   initial pruning keeps one at least) has ``floor(f n_kept) < n_kept`` candidates
   for removal, as ``f < 1``.

**Time costs**: ``t`` = ``pruning.time-per-weight`` and ``c`` = ``pruning.time-constant``;
with ``pruning.measure-time = true`` the plug-in keeps ``(kept coordinates, seconds)``
of the last 50 observed rounds (``seconds``: the sites' mean round time; rounds
with none are not kept) and, once two kept counts differ, uses the least-squares line
``seconds = c + t x kept`` (``t >= 1e-12``, ``c >= 0``) instead.

The mask (``masks``), its ``version`` (+1 at each change), the structure and the
time history are plain attributes: a checkpoint saves them and a resumed run goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from strategies.compression import parse_spec
from strategies.plugins.pruning.units import MODES, Units, plain_structure
from strategies.plugins.registries import PRUNINGS
from strategies.plugins.run_settings import RunSettings
from strategies.wire.codecs.registry import UpdateCodec
from strategies.wire.errors import ConfigError
from strategies.wire.plugin_options import Plugin, PluginError, PluginOptions, option
from strategies.wire.pruning_mask import PruningError, density, kept_count
from strategies.wire.registry import Registry

__all__ = ["PruneFL", "PruningOptions"]

Info = dict[str, float]
#: Codecs of the squared-gradient report: non-negative sums (sign and QSGD make no sense),
#: by dotted path to their :data:`~strategies.wire.codecs.registry.CODECS` entry.
REPORT_CODECS: Registry[UpdateCodec] = Registry("squared-gradient report codec",
                                                "pruning.report-codec", error=PluginError)
REPORT_CODECS.add_path("none", "strategies.wire.codecs.identity:CODEC")
REPORT_CODECS.add_path("fp16", "strategies.wire.codecs.fp16:CODEC")
REPORT_CODECS.add_path("topk", "strategies.wire.codecs.topk:CODEC")

#: Rounds of (kept, seconds) the measured time fit remembers.
TIME_HISTORY = 50


@dataclass(frozen=True)
class PruningOptions(PluginOptions):
    """Run-config section ``pruning``.

    Attributes
    ----------
    mode : str
        ``pruning.mode``: ``unstructured`` (weights) or ``structured`` (channels).
    initial_density : float
        ``pruning.initial-density``: kept fraction of each group's units after the
        initial magnitude pruning, in (0, 1].
    interval : int
        ``pruning.interval``: re-prune every this many rounds; 0: initial pruning only.
    decrease_fraction : float
        ``pruning.decrease-fraction``: fraction of each group's kept units, of smallest
        magnitude, that may be removed at a re-pruning, in [0, 1).
    max_density : float
        ``pruning.max-density``: cap of the kept units' cost, in (0, 1], >= initial-density.
    time_per_weight : float
        ``pruning.time-per-weight``: seconds one kept weight adds to a round (> 0).
    time_constant : float
        ``pruning.time-constant``: seconds of a round independent of the model size (>= 0).
    measure_time : bool
        ``pruning.measure-time``: fit both from the observed round times.
    report_codec : str
        ``pruning.report-codec``: codec of the sites' squared gradients: none, fp16, topk:<f>.
    stop_round : int
        ``pruning.stop-round``: no re-pruning after this round; 0: never stop.
    """

    section = "pruning"
    mode: str = option("unstructured")
    initial_density: float = option(0.3, at_least=0.0)
    interval: int = option(5, at_least=0)
    decrease_fraction: float = option(0.3, at_least=0.0, below=1.0)
    max_density: float = option(1.0, at_least=0.0)
    time_per_weight: float = option(1e-6, at_least=0.0)
    time_constant: float = option(1.0, at_least=0.0)
    measure_time: bool = option(False)
    report_codec: str = option("fp16")
    stop_round: int = option(0, at_least=0)

    def check(self) -> None:
        """The mode, the densities, a positive time per weight and a report codec of sums."""
        if self.mode not in MODES:
            self.fail("mode", f"must be one of {list(MODES)}")
        if not 0.0 < self.initial_density <= 1.0:
            self.fail("initial_density", "must be in (0, 1]")
        if not self.initial_density <= self.max_density <= 1.0:
            self.fail("max_density", f"must be in [{self.key('initial_density')} = "
                                     f"{self.initial_density:g}, 1]")
        if self.time_per_weight <= 0.0:
            self.fail("time_per_weight", "must be > 0")
        try:
            name = parse_spec(self.report_codec).name
        except (ConfigError, ValueError) as exc:
            self.fail("report_codec", f"is not a codec spec ({exc})")
        if name not in REPORT_CODECS:
            self.fail("report_codec", f"must be one of none, fp16, topk:<fraction> (the squared "
                                      f"gradients are non-negative sums)")


@PRUNINGS.register("prunefl")
class PruneFL(Plugin):
    """PruneFL's adaptive pruning (module docstring); meets ``protocols.Pruning``."""

    Options = PruningOptions
    #: A pruning that prunes.
    active = True

    def __init__(self, mode: str = "unstructured", initial_density: float = 0.3,
                 interval: int = 5, decrease_fraction: float = 0.3, max_density: float = 1.0,
                 time_per_weight: float = 1e-6, time_constant: float = 1.0,
                 measure_time: bool = False, report_codec: str = "fp16",
                 stop_round: int = 0) -> None:
        options = PruningOptions(
            mode=mode, initial_density=initial_density, interval=interval,
            decrease_fraction=decrease_fraction, max_density=max_density,
            time_per_weight=time_per_weight, time_constant=time_constant,
            measure_time=measure_time, report_codec=report_codec, stop_round=stop_round)
        self.mode, self.initial_density = options.mode, options.initial_density
        self.interval, self.decrease_fraction = options.interval, options.decrease_fraction
        self.max_density, self.stop_round = options.max_density, options.stop_round
        self.time_per_weight, self.time_constant = options.time_per_weight, options.time_constant
        self.measure_time, self.report_codec = options.measure_time, options.report_codec
        self.version = 0
        self.masks: dict[str, np.ndarray] = {}
        self.structure: dict[str, Any] = {}
        #: ``[kept coordinates, seconds]`` of the last observed rounds (measure-time).
        self.history: list[list[float]] = []

    @staticmethod
    def requires(options: PruningOptions, settings: RunSettings | None) -> None:
        """Refuse secure aggregation, and structured pruning with FedBN or DP-SGD."""
        if settings is None:
            return
        if settings.secure_aggregation != "none":
            raise PluginError(
                "run config key 'strategy.pruning' = 'prunefl' is refused with "
                f"'strategy.secure-aggregation' = {settings.secure_aggregation!r}: SecAgg+ masks "
                "updates of one fixed length, not supported with a changing mask, and the "
                "coordinator must read the summed squared gradients per coordinate")
        if options.mode != "structured":
            return
        if settings.personalisation == "fedbn":
            raise PluginError(
                "run config key 'pruning.mode' = 'structured' is refused with "
                "'personalisation.method' = 'fedbn': FedBN keeps each site's normalisation "
                "layers, whose channels a structural change removes")
        if settings.privacy:
            raise PluginError(
                "run config key 'pruning.mode' = 'structured' is refused with DP-SGD "
                "('privacy.noise-multiplier' > 0): Opacus's GroupNorm replacement constrains "
                "the channel counts a structural change alters")

    def initialise(self, named: Mapping[str, np.ndarray], structure: Mapping[str, Any]) -> Info:
        """Initial magnitude pruning of the initial model ``named``; a no-op on a resumed run
        (``version > 0``) but for keeping the structure. Returns what to track."""
        self.structure = plain_structure(structure, self.mode)
        if self.version > 0:
            return self._info(named)
        units = Units(self.structure, _shapes(named))
        kept = []
        for magnitude in units.magnitudes(named):
            keep = np.zeros(magnitude.size, bool)
            keep[np.argsort(-magnitude, kind="stable")[:max(1, round(self.initial_density
                                                                      * magnitude.size))]] = True
            kept.append(keep)
        self.masks, self.version = units.masks(kept), 1
        return self._info(named)

    def report_due(self, server_round: int) -> bool:
        """Whether round ``server_round`` ends with a re-pruning (the sites report g^2)."""
        return (self.interval > 0 and server_round % self.interval == 0
                and (self.stop_round == 0 or server_round <= self.stop_round))

    def observe(self, server_round: int, named: Mapping[str, np.ndarray],
                sqgrad: Mapping[str, np.ndarray] | None, seconds: float) -> Info:
        """After round ``server_round``: record its time, re-prune when due; what to track.

        Raises
        ------
        PruningError
            Before :meth:`initialise`, or for squared gradients of another shape.
        """
        if self.version == 0:
            raise PruningError("pruning: observe() before initialise()")
        if self.measure_time and seconds > 0.0:
            self.history = [*self.history, [float(kept_count(named, self.masks)),
                                            float(seconds)]][-TIME_HISTORY:]
        info: Info = {}
        if sqgrad is not None and self.report_due(server_round):
            info = self._reprune(named, sqgrad)
        return {**info, **self._info(named)}

    def time_costs(self) -> tuple[float, float]:
        """``(c, t)``: the stated costs, or the measured least-squares fit (module docstring)."""
        kept = np.array([k for k, _ in self.history], np.float64)
        if not self.measure_time or np.unique(kept).size < 2:
            return self.time_constant, self.time_per_weight
        seconds = np.array([s for _, s in self.history], np.float64)
        slope, intercept = np.polyfit(kept, seconds, 1)
        return max(float(intercept), 0.0), max(float(slope), 1e-12)

    def _reprune(self, named: Mapping[str, np.ndarray],
                 sqgrad: Mapping[str, np.ndarray]) -> Info:
        """Re-choose the kept units maximising ``Delta(M) / T(M)`` (module docstring)."""
        shapes = _shapes(named)
        squared = _squared(sqgrad, shapes)
        units = Units(self.structure, shapes)
        c, t = self.time_costs()
        values, counts = units.sums(squared), units.coordinates()
        kept_before = units.kept(self.masks)
        stay = [_staying(keep, magnitude, self.decrease_fraction)
                for keep, magnitude in zip(kept_before, units.magnitudes(named))]
        cover = units.covered()
        free_value = sum(float(g[~cover[n]].sum()) if n in cover else float(g.sum())
                         for n, g in squared.items())
        free_count = sum(int(np.count_nonzero(~cover[n])) if n in cover else int(np.prod(s))
                         for n, s in shapes.items())
        numerator = free_value + sum(float(v[s].sum()) for v, s in zip(values, stay))
        denominator = c + t * (free_count + sum(float(n[s].sum()) for n, s in zip(counts, stay)))
        budget = self.max_density * t * sum(float(n.sum()) for n in counts)
        chosen = _greedy(values, [t * n for n in counts], stay, numerator, denominator,
                         budget - t * sum(float(n[s].sum()) for n, s in zip(counts, stay)))
        masks = units.masks(chosen)
        if any(not np.array_equal(masks[n], self.masks.get(n)) for n in masks):
            self.masks, self.version = masks, self.version + 1
        kept_value = free_value + sum(float(v[k].sum()) for v, k in zip(values, chosen))
        kept_time = c + t * (free_count + sum(float(n[k].sum()) for n, k in zip(counts, chosen)))
        return {"pruning-added": float(sum(int(np.sum(k & ~b))
                                           for k, b in zip(chosen, kept_before))),
                "pruning-removed": float(sum(int(np.sum(b & ~k))
                                             for k, b in zip(chosen, kept_before))),
                "pruning-objective": kept_value / kept_time if kept_time > 0 else 0.0}

    def _info(self, named: Mapping[str, np.ndarray]) -> Info:
        info = {"pruning-density": density(self.masks),
                "pruning-params-kept": float(kept_count(named, self.masks)),
                "pruning-version": float(self.version)}
        if self.measure_time:
            info["pruning-time-constant"], info["pruning-time-per-weight"] = self.time_costs()
        return info


def _shapes(named: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {name: np.shape(a) for name, a in named.items()}


def _squared(sqgrad: Mapping[str, np.ndarray],
             shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The summed squared gradients of every array (float64; zeros where none was sent)."""
    out = {}
    for name, shape in shapes.items():
        g = np.asarray(sqgrad[name], np.float64) if name in sqgrad else np.zeros(shape)
        if g.shape != shape:
            raise PruningError(f"squared gradients of array '{name}' have shape {g.shape}, "
                               f"the model {shape}")
        out[name] = g
    return out


def _staying(kept: np.ndarray, magnitude: np.ndarray, fraction: float) -> np.ndarray:
    """The kept units that are no candidates: all but the ``floor(fraction x n_kept)`` of
    smallest magnitude."""
    indices = np.flatnonzero(kept)
    removable = indices[np.argsort(magnitude[indices], kind="stable")][
        :int(np.floor(fraction * indices.size))]
    stay = kept.copy()
    stay[removable] = False
    return stay


def _greedy(values: list[np.ndarray], costs: list[np.ndarray], stay: list[np.ndarray],
            numerator: float, denominator: float, room: float) -> list[np.ndarray]:
    """The kept units: the staying ones plus the candidates added in decreasing
    ``v_u / c_u`` while ``v_u / c_u > N / D`` and their cost fits in ``room``."""
    sizes = [s.size for s in stay]
    flat = np.concatenate(stay)
    candidates = np.flatnonzero(~flat)
    value = np.concatenate(values)[candidates]
    cost = np.concatenate(costs)[candidates]
    ratio = value / cost
    order = np.argsort(-ratio, kind="stable")
    value, cost, ratio = value[order], cost[order], ratio[order]
    n_before = numerator + np.concatenate([[0.0], np.cumsum(value)[:-1]])
    d_before = denominator + np.concatenate([[0.0], np.cumsum(cost)[:-1]])
    threshold = np.divide(n_before, d_before, out=np.zeros_like(n_before), where=d_before > 0)
    fits = (ratio > threshold) & (np.cumsum(cost) <= room * (1 + 1e-12))
    flat[candidates[order][:int(np.argmin(fits)) if not fits.all() else fits.size]] = True
    return np.split(flat, np.cumsum(sizes)[:-1])
