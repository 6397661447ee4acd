"""The round features a run switches on, built once for the strategy (issue #45's seam).

:func:`active_features` is the one place that names every round feature
(:mod:`strategies.rounds.round_feature`): the compressed downlink, pruning and control
variates. It builds only the active ones, in the order the train stage calls them: the
downlink first (it chooses the records the model travels in), then pruning (which adds its
mask to them), then control variates (``c`` next to the model). The round loop
(:class:`~strategies.rounds.train_stage.TrainStage`,
:class:`~strategies.rounds.federated_strategy.FederatedStrategy`) receives the list and
names none of them; a feature that is off is never built, so never entered.

Example::

    features = active_features(aggregator=aggregator, seed=0, downlink_codec="topk:0.1",
                               pruning=PRUNINGS.create("prunefl"))
    strategy = FederatedStrategy(aggregator=aggregator, ..., features=features)
"""

from __future__ import annotations

from strategies.downlink import ServerDownlink
from strategies.downlink_feature import DownlinkFeature
from strategies.plugins.control_variates.control_variate_round import ControlVariateRound
from strategies.plugins.protocols import Aggregator, ControlVariates, Pruning
from strategies.plugins.pruning.pruning_round import PruningRound
from strategies.rounds.round_feature import RoundFeature

__all__ = ["active_features"]


def active_features(*, aggregator: Aggregator | None = None, seed: int = 0,
                    downlink_codec: str = "none", pruning: Pruning | None = None,
                    control_variates: ControlVariates | None = None) -> list[RoundFeature]:
    """The run's active round features, in the order the train stage calls them.

    Parameters
    ----------
    aggregator : Aggregator, optional
        The run's aggregator behind its defence: control variates defend and combine the
        ``Delta c_i`` as it does the updates (:class:`ControlVariateRound`).
    seed : int
        The run's seed (the downlink codec's per-round seed).
    downlink_codec : str
        ``strategy.downlink-codec``; ``none``: a dense downlink, no feature.
    pruning : Pruning, optional
        ``strategy.pruning``; an inactive one (``none``) builds no feature.
    control_variates : ControlVariates, optional
        ``strategy.control-variates``; an inactive one (``none``) builds no feature.

    Raises
    ------
    strategies.downlink.DownlinkCodecError
        For a downlink codec the downlink does not take.
    """
    downlink = ServerDownlink(downlink_codec, seed)
    features: list[RoundFeature] = [DownlinkFeature(downlink)] if downlink.active else []
    if pruning is not None and pruning.active:
        features.append(PruningRound(pruning))
    if control_variates is not None and control_variates.active:
        features.append(ControlVariateRound(control_variates, downlink.spec, aggregator))
    return features
