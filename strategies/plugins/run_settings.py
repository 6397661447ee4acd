"""What the plug-ins read from the rest of the run config, outside their own sections.

The schedules start from ``local-steps``, the selectors draw with the run's
``seed`` over ``num-server-rounds``, FedNova checks the sites' ``optimizer``,
secure aggregation the other plug-ins chosen, pruning secure aggregation,
personalisation and DP-SGD.
The run config (``app/config/run_config.py``) builds one :class:`RunSettings`
and the registry hands it to every plug-in it builds.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RunSettings"]


@dataclass(frozen=True)
class RunSettings:
    """What plug-ins read from the rest of the run config (keys in brackets).

    Attributes
    ----------
    local_steps : int
        Local steps per round, tau_0 of the schedules (``local-steps``).
    num_rounds : int
        Rounds of the federation (``num-server-rounds``).
    fraction_train : float
        Fraction of the connected sites to train when ``selection.m = 0``
        (``fraction-train``).
    min_nodes : int
        Sites the server waits for before a round (``min-nodes``); not the
        number trained, which is ``selection.m`` or ``fraction-train``.
    seed : int
        Seed of the selectors' random draws (``seed``).
    optimizer : str
        The sites' local optimiser (``optimizer``).
    codec : str
        The uplink codec spec (``strategy.codec``), validated.
    codec_warmup_rounds : int
        Rounds of the codec's kept-fraction warm-up (``strategy.codec-warmup-rounds``).
    aggregator, defence, codec_rate : str
        The other plug-ins chosen (``strategy.aggregator``, ``strategy.defence``,
        ``strategy.codec-rate``): secure aggregation refuses those that need each
        site's update.
    secure_aggregation : str
        ``strategy.secure-aggregation``: pruning refuses SecAgg+.
    personalisation : str
        ``personalisation.method``: structured pruning refuses FedBN.
    privacy : bool
        Whether the sites train with DP-SGD (``privacy.noise-multiplier > 0``):
        structured pruning refuses it.
    pruning : str
        ``strategy.pruning``: SCAFFOLD's control variates refuse it, and every server
        optimizer but ``sgd``.
    server_opt : str
        ``strategy.server-opt``: FedNova refuses its own server momentum with another.
    """

    local_steps: int
    num_rounds: int
    fraction_train: float
    min_nodes: int
    seed: int
    optimizer: str
    codec: str = "none"
    codec_warmup_rounds: int = 0
    aggregator: str = "fedavg"
    defence: str = "none"
    codec_rate: str = "fixed"
    secure_aggregation: str = "none"
    personalisation: str = "none"
    privacy: bool = False
    pruning: str = "none"
    server_opt: str = "sgd"
