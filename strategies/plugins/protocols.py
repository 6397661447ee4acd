"""What the round machinery relies on from each kind of strategy plug-in.

One :class:`typing.Protocol` per registry of :mod:`strategies.plugins.registries`;
the rounds (:mod:`strategies.rounds`) read these attributes and call these
methods directly, never probing with ``getattr``. A plug-in class meets two
contracts:

* :class:`PluginClass`, the class itself: ``Options``, ``from_options`` and
  ``requires`` (what :func:`strategies.plugins.registries.build` calls);
  :class:`~strategies.wire.plugin_options.Plugin` gives the defaults;
* the Protocol of its kind, for the instance built for a run.

An instance's attributes are its state: a checkpoint saves them and restores
them onto the object the run config builds (:mod:`strategies.rounds.checkpoint`),
so a plug-in keeps what it learns (a schedule's ``tau``, a selector's random
generator and counts, server momentum) in plain attributes: numbers, strings,
lists, dicts, numpy arrays and generators.

Sign convention (DESIGN.md): an update is ``delta_i = x_global - x_local_i``;
the new global model is ``x_global - Delta``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from strategies.aggregation import RunningSum
    from strategies.plugins.run_settings import RunSettings
    from strategies.plugins.schedules.codec_rate import SiteRound
    from strategies.rounds.reply_intake import TrainReply
    from strategies.rounds.round_metrics import SelectionContext
    from strategies.wire.codecs.spec import CodecSpec
    from strategies.wire.plugin_options import PluginOptions
    from strategies.wire.secure_aggregation.settings import SecAggSettings

__all__ = ["Aggregator", "CodecRate", "ControlVariates", "Defence", "PluginClass", "Pruning",
           "Schedule", "SecureAggregation", "SecureSumAggregator", "Selector", "ServerOptimizer",
           "StreamingAggregator"]

#: What a plug-in returns to track for the round (MLflow metrics): name -> value.
Info = dict[str, float]


@runtime_checkable
class PluginClass(Protocol):
    """A registered plug-in class: its typed options and how a run builds it."""

    #: Its run-config section (:class:`~strategies.wire.plugin_options.NoOptions`: none).
    Options: ClassVar[type[PluginOptions]]

    @classmethod
    def from_options(cls, options: PluginOptions, settings: RunSettings) -> Any:
        """The plug-in for a run, from its section's options and the run settings."""

    @staticmethod
    def requires(options: PluginOptions, settings: RunSettings | None) -> None:
        """Refuse (``PluginError``, naming the keys) a run config the plug-in cannot serve."""


@runtime_checkable
class Aggregator(Protocol):
    """``strategy.aggregator``: the round's accepted replies -> the update ``Delta``."""

    #: False: linear, the replies may be folded one by one as they arrive
    #: (then it is a :class:`StreamingAggregator`); True: every update of the
    #: round is held until :meth:`aggregate`, bounded by ``round.max-held-mb``.
    needs_all_updates: bool

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], Info]:
        """``Delta`` over ``replies`` (model order) and what to track."""

    def update_scale(self, reply: TrainReply) -> float:
        """The factor on ``reply``'s update as it enters the aggregate, next to the others'
        (1 for FedAvg; FedNova's ``tau / ||a_i||_1``): a defence measures that update."""


@runtime_checkable
class StreamingAggregator(Aggregator, Protocol):
    """A linear aggregator (``needs_all_updates = False``): fold each reply, then finish.

    ``finish(fold(r_1), ..., fold(r_n))`` equals ``aggregate([r_1, ..., r_n])``.
    """

    def fold(self, total: RunningSum, reply: TrainReply, index: int) -> Info:
        """Add ``reply`` (the ``index``-th of the round) to the running sum ``total``."""

    def finish(self, total: RunningSum, replies: list[TrainReply]) -> tuple[list[np.ndarray], Info]:
        """``Delta`` from ``total`` over the folded ``replies``, and what to track."""


@runtime_checkable
class SecureSumAggregator(StreamingAggregator, Protocol):
    """A linear aggregator that finishes from a secure sum: SecAgg+ serves only these.

    Under SecAgg+ (Bell et al., CCS 2020; :mod:`strategies.rounds.secure_train`) the
    coordinator sees only ``S = sum_i c_i delta_i``: each site weighs its own update before
    masking, ``c_i = site_coefficient(n_i, r, a_i, a_f)``
    (:mod:`strategies.wire.secure_aggregation.weights`), with the round's weight reference ``r``
    and the aggregator's a-norm floor ``a_f`` (:meth:`secure_a_floor`). ``c_i`` is
    ``kappa = sum_scale(r, a_f)`` times the weight :meth:`fold` gives a site of
    ``min(n_i, r)`` examples, so ``S / kappa`` is the round's running sum and
    :meth:`finish` makes ``Delta`` of it: the rule is written once, for both paths.
    """

    def secure_a_floor(self, tau_a_norm: float) -> float:
        """``a_f`` of the sites' coefficients in a round whose tau has the a-norm
        ``tau_a_norm`` (0: each site weighs its update by its size alone)."""


@runtime_checkable
class Defence(Protocol):
    """``strategy.defence``: what is done to the accepted replies before the aggregator."""

    #: False: each reply is treated on its own (a linear aggregator behind it
    #: still streams, one reply at a time); True: it needs the round's set.
    needs_all_updates: bool

    def filter(self, replies: list[TrainReply],
               scales: Sequence[float] | None = None) -> tuple[list[TrainReply], Info]:
        """The replies to aggregate (scaled or a subset, in order) and what to track;
        ``scales[k]`` is the aggregator's factor on update ``k`` (its ``update_scale``),
        so the defence judges the updates as they enter the aggregate (None: all 1)."""

    def observe(self, accepted_norms: Sequence[float]) -> Info:
        """Learn from the round's aggregated updates: the L2 norms of the kept ones, after
        the defence and with their scales (norm-bound's history); what to track."""


@runtime_checkable
class Schedule(Protocol):
    """``strategy.schedule``: the local steps ``tau`` of the next round."""

    #: Local steps the next round's sites run.
    tau: int

    def observe(self, replies: list[TrainReply]) -> Info:
        """Learn from the round's accepted replies (may change ``tau``); what to track."""


@runtime_checkable
class CodecRate(Protocol):
    """``strategy.codec-rate``: the uplink codec's kept fraction of each round."""

    #: False for ``fixed`` (the codec's own fraction): the round neither asks nor tells it.
    active: bool

    def rate_for(self, spec: CodecSpec) -> float | None:
        """This round's kept fraction for the codec ``spec``; None keeps the spec's own."""

    def observe(self, rate: float | None, sites: Sequence[SiteRound]) -> Info:
        """Learn from the round run at ``rate`` (its accepted sites); what to track."""


@runtime_checkable
class Selector(Protocol):
    """``strategy.selector``: the sites that train this round."""

    #: The last choice, for the round report: ``selected`` and, where the
    #: selector has them, ``candidates``, ``losses`` (by node id), ``d``, ``m``.
    last: dict[str, Any]
    #: Rounds each node id was selected.
    times_selected: dict[int, int]

    def select(self, server_round: int, nodes: list[int], ctx: SelectionContext) -> list[int]:
        """The node ids (sorted, a subset of ``nodes``) to train in ``server_round``."""


@runtime_checkable
class SecureAggregation(Protocol):
    """``strategy.secure-aggregation``: how the sites' updates reach the coordinator.

    With settings, the train half of each round is a SecAgg+ round
    (:mod:`strategies.rounds.secure_train`): the coordinator learns only the sum of
    the sites' masked inputs; without (``none``), each site's update arrives on its own.
    """

    #: The run's ``secagg.*`` settings; None: updates are sent in the clear.
    settings: SecAggSettings | None


@runtime_checkable
class Pruning(Protocol):
    """``strategy.pruning``: which coordinates of the model are kept, sent and trained.

    The global model stays in full shapes with zeros at the pruned coordinates; the mask
    (:mod:`strategies.wire.pruning_mask`) covers the arrays that have prunable units.
    """

    #: False for ``none``: the model stays dense.
    active: bool
    #: ``"unstructured"`` (weights) or ``"structured"`` (channels); ``""`` for ``none``.
    mode: str
    #: The mask's version: 0 before :meth:`initialise`, +1 each time the mask changes.
    version: int
    #: The current mask: array name -> bool array of its full shape (True = kept).
    masks: dict[str, np.ndarray]
    #: Codec spec of the sites' squared-gradient report (``pruning.report-codec``; ``""`` for none).
    report_codec: str

    def initialise(self, named: Mapping[str, np.ndarray], structure: Mapping[str, Any]) -> Info:
        """Initial pruning of the initial model ``named`` over ``structure``'s units;
        a no-op when ``version > 0`` (a resumed run); what to track."""

    def report_due(self, server_round: int) -> bool:
        """Whether the sites send their squared gradients with ``server_round``'s update."""

    def observe(self, server_round: int, named: Mapping[str, np.ndarray],
                sqgrad: Mapping[str, np.ndarray] | None, seconds: float) -> Info:
        """After ``server_round``'s aggregation: ``named`` the new global model (full shapes),
        ``sqgrad`` the sites' summed squared gradients (full shapes) or None, ``seconds`` the
        sites' mean round time; re-prunes when due; what to track."""


@runtime_checkable
class ControlVariates(Protocol):
    """``strategy.control-variates``: the server's control variate ``c`` (SCAFFOLD).

    The vector runs over the model's floating-point arrays in model order
    (:mod:`strategies.rounds.control_variate_round` sends and reads it).
    """

    #: False for ``none``: no control variate is sent or read back.
    active: bool
    #: The downlink codec's error-feedback residual of ``c`` (float32; empty: none yet).
    residual: np.ndarray

    def control(self, size: int, sites: int) -> np.ndarray:
        """The control variate ``c`` to send (``size`` coordinates, float32); ``sites`` is
        the number of sites seen this round (roster, connected or named)."""

    def observe(self, deltas: list[np.ndarray], sites: int) -> Info:
        """Learn from the round's accepted ``Delta c_i`` (decoded); ``sites``: the sites seen."""

    def decline(self, refused: Iterable[str], trained: Iterable[str]) -> None:
        """The sites that ``refused`` the round's train instruction under their site policy
        (they never train: not counted in ``N``), and those that ``trained`` (counted)."""


@runtime_checkable
class ServerOptimizer(Protocol):
    """``strategy.server-opt``: the aggregator's ``Delta`` (the pseudo-gradient) -> the step.

    Composes with every aggregator (and the unmasked SecAgg+ sum): the aggregator makes
    ``Delta``, the optimizer the step ``s`` of ``x <- x - s``
    (:mod:`strategies.plugins.server_opt`). Its state (moments, round count) is checkpointed
    with the strategy; a round whose new model is refused keeps the state as it was.
    """

    #: Rounds applied so far.
    rounds: int
    #: False where the step is the plain ``x - Delta`` (``sgd`` at ``eta`` 1): the round
    #: takes ``Delta`` itself and never enters the optimizer (its state stays as it is).
    active: bool

    def step(self, delta: list[np.ndarray], trained: Sequence[bool]) -> list[np.ndarray]:
        """The step for ``delta`` (model order and dtypes); ``trained[j]``: array ``j`` is a
        float parameter it acts on (integer buffers and normalisation statistics take
        ``delta[j]`` as it is); advances the state."""
