"""The federation's value of each site metric: the example-weighted mean over the replies.

Each metric (but ``num-examples``) is averaged over the replies that report
it, with those sites' numbers of examples as weights
(:func:`strategies.weighted_mean.weighted_mean`): a metric undefined at one
site (a one-class validation split has no AUC, so the site omits it) does not
remove it from the round. ``num-examples`` becomes the total. These are the
``train-*`` / ``val-*`` aggregates tracked in MLflow.
"""

from __future__ import annotations

from collections.abc import Sequence

from strategies import message_keys as keys
from strategies.replies import MetricsReply, TrainReply
from strategies.weighted_mean import weighted_mean

__all__ = ["example_weighted_metrics"]


def example_weighted_metrics(replies: Sequence[TrainReply | MetricsReply]) -> dict[str, float]:
    """Example-weighted mean of each metric over the replies reporting it, plus the total examples."""
    if not replies:
        return {}
    names = set().union(*(r.metrics for r in replies)) - {keys.NUM_EXAMPLES}
    out = {name: weighted_mean((r.metrics[name], r.num_examples) for r in replies if name in r.metrics)
           for name in sorted(names)}
    out[keys.NUM_EXAMPLES] = float(sum(r.num_examples for r in replies))
    return out
