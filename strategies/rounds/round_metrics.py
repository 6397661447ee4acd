"""The federation's value of each site metric: the example-weighted mean over the replies.

Every metric that all accepted replies report (but ``num-examples``) is
averaged with the sites' numbers of examples as weights
(:func:`strategies.weighted_mean.weighted_mean`); ``num-examples`` becomes the
total. These are the ``train-*`` / ``val-*`` aggregates tracked in MLflow.
"""

from __future__ import annotations

from collections.abc import Sequence

from strategies import message_keys as keys
from strategies.replies import MetricsReply, TrainReply
from strategies.weighted_mean import weighted_mean

__all__ = ["example_weighted_metrics"]


def example_weighted_metrics(replies: Sequence[TrainReply | MetricsReply]) -> dict[str, float]:
    """Example-weighted mean of every metric all ``replies`` share, plus the total examples."""
    if not replies:
        return {}
    shared = set.intersection(*(set(r.metrics) for r in replies)) - {keys.NUM_EXAMPLES}
    out = {name: weighted_mean((r.metrics[name], r.num_examples) for r in replies)
           for name in sorted(shared)}
    out[keys.NUM_EXAMPLES] = float(sum(r.num_examples for r in replies))
    return out
