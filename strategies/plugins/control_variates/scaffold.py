r"""SCAFFOLD's server side: the control variate ``c`` (Karimireddy et al., ICML 2020).

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020, Algorithm 1 with option II. Each site
``i`` keeps its own control variate ``c_i`` (:mod:`clients.site.site_scaffold`) and
runs its ``K`` local steps as ``y <- y - eta_l (g_i(y) - c_i + c)``; then

.. math:: c_i^+ = c_i - c + \frac{x - y}{K \eta_l}, \qquad
          \Delta c_i = c_i^+ - c_i ,

and the server, over the sites ``S`` of the round, of ``N`` in the federation:

.. math:: x \leftarrow x + \eta_g \frac{1}{|S|}\sum_{i \in S} \Delta y_i, \qquad
          c \leftarrow c + \frac{|S|}{N} \frac{1}{|S|}\sum_{i \in S} \Delta c_i .

The model step is the aggregator's ``Delta`` (any aggregator, under any server
optimizer: its step is :math:`\eta_g`); this plug-in holds ``c``. It keeps the sum
``total`` of every ``Delta c_i`` it received and sends ``c = total / N``, so
``c`` is the mean of all sites' ``c_i`` (each starts at 0) after every round, full
or partial participation alike: the paper's update for a fixed ``N``.

**N**, the number of sites in the federation that train: the coordinator's roster when
it has one (``federation.roster``), else the most sites seen so far, connected or known
by name, less the sites that refused a train instruction under their site policy (an
evaluate-only site, a site whose policy refuses SCAFFOLD: their ``c_i`` stays 0 for
good, :meth:`Scaffold.decline`; a declined site that trains again counts again). A site
that joins late starts with ``c_i = 0`` and raises ``N``: ``c`` is then rescaled to the
mean over the larger federation (``total / N``), which the paper's fixed-``N`` rule
would not do. A reply that is dropped (late, invalid) after its site saved ``c_i^+``
leaves that site's ``c_i`` ahead of ``total``; every reply the server accepted counts,
whether or not its update survives the defence.

**A malicious site** chooses its ``Delta c_i``, and ``c`` keeps every one it was given: one
finite ``Delta c_i`` 3e3 times an honest one (1 site of 3, round 1) took ``c``'s norm from
1.6 to 2.5e3 for good and the model 7.8e3 away from the clean run's after 3 rounds (model
norm 64). So the rounds defend the ``Delta c_i`` like the updates
(:mod:`strategies.plugins.control_variates.control_variate_round`): :attr:`Scaffold.defence`
is a copy of the run's ``strategy.defence`` (same options, state of its own: norm-bound's
history of the accepted ``Delta c_i`` norms, checkpointed with ``c``), and under a robust aggregator
(median, trimmed mean) the round's ``Delta c_i`` are combined by its rule: ``c`` moves by
``|S| / N`` times the rule over the round's ``Delta c_i``, the paper's mean replaced by a
robust one. A site whose ``Delta c_i`` is clipped keeps its own ``c_i`` ahead of ``total``,
as a dropped reply does.

The vector of ``c`` runs over the model's floating-point arrays in model order (the
sites' normalisation buffers hold 0). With a downlink codec ``c`` is sent compressed
with the server's own error feedback ``residual`` (:class:`ErrorFeedback` on the full
vector: the sent values average to ``c`` over the rounds), ``Delta c_i`` with the
round's uplink codec and the site's own residual.

Refused (:meth:`Scaffold.requires`, naming the keys): an optimizer other than ``sgd``
(option II divides by the steps' learning rate; with heavy-ball momentum or a proximal
term the site divides by the solver's ``||a||_1 eta_l``, FedNova's effective steps,
``K eta_l`` for plain SGD), DP-SGD (its clipping and noise replace the corrected
gradient), secure aggregation (the coordinator would need each site's ``Delta c_i``;
summing them securely too is future work) and pruning (``c`` over compacted arrays
whose layout changes with the mask).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from strategies.plugins.defences.none import NoDefence
from strategies.plugins.protocols import Defence
from strategies.plugins.registries import CONTROL_VARIATES
from strategies.plugins.run_settings import RunSettings
from strategies.wire.plugin_options import Plugin, PluginError

__all__ = ["Scaffold"]

_KEY = "run config key 'strategy.control-variates' = 'scaffold'"


@CONTROL_VARIATES.register("scaffold")
class Scaffold(Plugin):
    """The server's control variate: the sum of the sites' ``c_i`` and the federation's size."""

    #: True: the rounds send ``c`` and read each reply's ``Delta c_i``.
    active = True

    def __init__(self) -> None:
        #: Sum of every ``Delta c_i`` received (float64), the model's float arrays flattened.
        self.total = np.zeros(0, np.float64)
        #: ``N`` of the last round (the federation's sites that train, module docstring).
        self.sites = 0
        #: The most sites seen (connected, named or on the roster), declined ones included.
        self.seen = 0
        #: Sites that refused a train instruction under their policy (not counted in ``N``).
        self.declined: set[str] = set()
        #: The downlink codec's error-feedback residual of ``c`` (empty: none yet).
        self.residual = np.zeros(0, np.float32)
        #: The ``Delta c_i`` channel's defence: a copy of the run's ``strategy.defence``
        #: that the rounds set (:class:`~strategies.plugins.control_variates.
        #: control_variate_round.ControlVariateRound`), with its own state (norm-bound's
        #: history of accepted norms).
        self.defence: Defence = NoDefence()

    @staticmethod
    def requires(options: object, settings: RunSettings) -> None:
        """Refuse, naming both keys, a run whose sites cannot apply option II."""
        refusals = [
            (settings.optimizer != "sgd", f"optimizer = {settings.optimizer!r}: option II's "
             "c_i update divides by the SGD steps' learning rate (needs optimizer = \"sgd\")"),
            (settings.privacy, "privacy.noise-multiplier > 0: DP-SGD's clipping and noise "
             "replace the corrected gradient"),
            (settings.secure_aggregation != "none",
             f"strategy.secure-aggregation = {settings.secure_aggregation!r}: the coordinator "
             "needs each site's Delta c_i, which SecAgg+ does not sum"),
            (settings.pruning != "none", f"strategy.pruning = {settings.pruning!r}: c would "
             "cover compacted arrays whose layout changes with the mask")]
        for refused, why in refusals:
            if refused:
                raise PluginError(f"{_KEY} is refused with {why}")

    def _count(self, sites: int) -> None:
        """``N`` from ``sites`` seen this round: the most seen, less the declined ones."""
        self.seen = max(self.seen, int(sites))
        self.sites = max(self.seen - len(self.declined), 1)

    def decline(self, refused: Iterable[str], trained: Iterable[str]) -> None:
        """The sites that ``refused`` this round's train instruction under their policy leave
        ``N``; the sites that ``trained`` (an accepted reply) count again."""
        self.declined = (self.declined | set(refused)) - set(trained)

    def control(self, size: int, sites: int) -> np.ndarray:
        """``c = total / N`` over ``size`` coordinates (zeros before any ``Delta c_i``);
        ``sites`` is the number of sites seen this round (``N`` adds no declined site and
        never drops a site once seen)."""
        self._count(sites)
        if self.total.size != size:
            self.total = np.zeros(size, np.float64)
        return (self.total / self.sites).astype(np.float32)

    def observe(self, deltas: list[np.ndarray], sites: int) -> dict[str, float]:
        """Add the round's ``deltas`` to ``total``: each kept site's ``Delta c_i`` after the
        defence (or the robust rule's combination in its place); ``sites`` as for
        :meth:`control`."""
        self._count(sites)
        for delta in deltas:
            if self.total.size != delta.size:  # the first round after a fresh start
                self.total = np.zeros(delta.size, np.float64)
            self.total = self.total + np.asarray(delta, np.float64)
        c = self.total / self.sites
        return {"scaffold-c-norm": float(np.linalg.norm(c)),
                "scaffold-sites": float(self.sites),
                "scaffold-replies": float(len(deltas))}
