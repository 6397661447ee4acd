r"""Which personalisation methods fit which run configs; the rest is refused up front.

Sign convention (DESIGN.md): a site's update is :math:`\Delta_i = x - x_i`, the
new global model :math:`x - \sum_i p_i \Delta_i`.

**Per-FedAvg-Reptile** (Xia & Cui, "Personalized federated learning algorithm
based on Reptile", Computer Systems & Applications 2022, Algorithm 2; Nichol,
Achiam, Schulman, "On first-order meta-learning algorithms", arXiv:1803.02999,
2018, Algorithm 1). From :math:`w_0 = x` a site runs :math:`\tau_{out}` tasks;
task :math:`t` takes :math:`\tau_{in}` SGD steps from :math:`w_t` to
:math:`\tilde w_t` and then the meta step

.. math:: w_{t+1} = w_t - \alpha (w_t - \tilde w_t),

and replies :math:`\Delta_i = x - w_{\tau_{out}}`. With plain SGD (step
:math:`\eta`, gradients :math:`g_{t,k}`), :math:`w_t - \tilde w_t = \eta
\sum_k g_{t,k}`, so

.. math:: \Delta_i = \alpha\, \eta \sum_{t=0}^{\tau_{out}-1} \sum_{k=0}^{\tau_{in}-1} g_{t,k}:

in FedNova's form :math:`\Delta_i = \eta \sum_k a_{i,k} g_k` (Wang, Liu, Liang,
Joshi, Poor, NeurIPS 2020, eq. (6)-(7)) every coefficient is :math:`\alpha`,
:math:`\|a_i\|_1 = \alpha s_i` with :math:`s_i` the SGD steps done. The server
computes :math:`\|a_i\|_1 = s_i` (it does not know :math:`\alpha`); with one
:math:`\alpha` for all sites it cancels:
:math:`\sum_i p_i \Delta_i / (\alpha s_i) \cdot \sum_j p_j \alpha s_j =
\sum_i p_i \Delta_i / s_i \cdot \sum_j p_j s_j`, so FedNova stays exact, also for
a site stopped early at a deadline. With heavy-ball momentum :math:`\rho` the
optimiser restarts every task, :math:`\|a_i\|_1 = \alpha \tau_{out}
\sum_{k=1}^{\tau_{in}} (1-\rho^k)/(1-\rho)`, which is not the continuous-momentum
norm the server computes from :math:`s_i`: Reptile with FedNova and momentum is
refused. Under FedAvg a Reptile round moves the model about :math:`\alpha` times as
far as :math:`s_i` plain SGD steps would (the gradients are taken at other points).

**Per-FedAvg-FO** (Fallah, Mokhtari, Ozdaglar, "Personalized federated learning
with theoretical guarantees: a model-agnostic meta-learning approach", NeurIPS
2020, first-order variant): each local step is one step of the site's SGD with the
gradient taken at :math:`w - \alpha_{in} \nabla f(w)`; the coefficients are
those of plain local SGD, so FedNova's a-norm from the step count is exact,
momentum included. Its inner optimiser is SGD.

**FedBN** (Li, Jiang, Zhang, Kamp, Dou, "FedBN: federated learning on non-IID
features via local batch normalization", ICLR 2021): a site keeps its
normalisation layers; their entries of :math:`\Delta_i` are 0, so the global
model's normalisation layers never move and any aggregator is consistent.

**Fine-tuning** ("FedAvg with one update" of Xia & Cui 2022) trains as FedAvg;
the k adaptation steps happen only at evaluation.

The methods that adapt on the training data at evaluation (all but ``none`` and
``fedbn``) release metrics of a model trained outside DP-SGD's accountant, and
Reptile's inner loop is not DP-SGD: they are refused with
``privacy.noise-multiplier > 0``. Whether the model has normalisation layers
(FedBN) needs the model; the app checks it
(:func:`clients.training.personalisation.site_personalisation.require_local_layers`).

Each method's flags (:class:`~strategies.plugins.personalisation.method.PersonalisationMethod`:
``adapts``, ``sgd_only``) select the generic rules below; Reptile's own are in
``methods/per_fedavg_reptile.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.plugins.personalisation.method import refuse
from strategies.wire.personalisation_options import PERSONALISATION, PersonalisationOptions

__all__ = ["PersonalisationRun", "check_personalisation"]


@dataclass(frozen=True)
class PersonalisationRun:
    """What the rules read from the rest of the run config (keys in brackets)."""

    #: ``local-steps``.
    local_steps: int
    #: ``optimizer``.
    optimizer: str
    #: ``momentum``.
    momentum: float
    #: ``proximal-mu``.
    proximal_mu: float
    #: ``strategy.aggregator``.
    aggregator: str
    #: ``strategy.schedule``.
    schedule: str
    #: ``privacy.noise-multiplier``.
    dp_noise_multiplier: float


def check_personalisation(options: PersonalisationOptions, run: PersonalisationRun) -> None:
    """Refuse a method (``personalisation.method``) that does not fit the rest of the run config.

    Raises
    ------
    PluginError
        Naming ``personalisation.method``, the other key and the rule; an unknown
        method names the registered ones.
    """
    name = options.method
    method = PERSONALISATION.get(name)
    if method.adapts and run.dp_noise_multiplier > 0:
        refuse(name, "adapts on the training data outside DP-SGD's accountant: not with "
                     "privacy.noise-multiplier > 0 (use 'fedbn' or 'none')")
    if method.sgd_only:
        if run.optimizer != "sgd":
            refuse(name, f"needs optimizer = \"sgd\" (its inner optimiser), got {run.optimizer!r}")
        if run.proximal_mu:
            refuse(name, "with proximal-mu > 0 is not defined (its steps do not start from the "
                         "received model); set proximal-mu = 0")
    method.requires(options, run)
