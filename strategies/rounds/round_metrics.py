r"""The federation's value of each site metric: the example-weighted mean over the replies.

Each metric (but ``num-examples``) is averaged over the replies that report
it, with those sites' numbers of examples as weights (:func:`weighted_mean`,
the one place the example-weighted mean is written,

.. math:: \bar v = \sum_i n_i v_i \Big/ \sum_i n_i ,

the metric of the pooled data when the metric is itself a per-example mean:
McMahan et al., AISTATS 2017, FedAvg's weighting :math:`p_i = n_i / n`; the
aggregation of *updates* with the same weights is
:func:`strategies.aggregation.fedavg_delta`): a metric undefined at one
site (a one-class validation split has no AUC, so the site omits it) does not
remove it from the round. The counts (``num-examples``, ``val-studies``,
``test-studies``) become totals. These are the
``train-*`` / ``val-*`` aggregates tracked in MLflow.

The train averages are taken over the replies whose update entered the
aggregate (:func:`aggregated_replies`): a reply a defence left out (Multi-Krum)
does not move the model, so its loss does not count in ``train-loss`` either.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from strategies.replies import MetricsReply, TrainReply
from strategies.wire import message_keys as keys

__all__ = ["SELECTED", "aggregated_replies", "example_weighted_metrics", "weighted_mean"]

#: Infix of a defence's per-site selection record, ``<rule>-selected/<site>``
#: (``krum-selected/hospital-a``): 1 = kept, 0 = left out of the aggregate.
SELECTED = "-selected/"


def weighted_mean(pairs: Iterable[tuple[float, float]]) -> float:
    """Mean of the values weighted by their weights, from ``(value, weight)`` pairs.

    Parameters
    ----------
    pairs : iterable of (float, float)
        ``(v_i, n_i)``: a site's value and its weight (number of examples).

    Returns
    -------
    float
        :math:`\\sum_i n_i v_i / \\sum_i n_i`, or ``nan`` when the total weight
        is not positive (no pairs, or all weights zero). Callers that must skip
        undefined values filter the pairs first.
    """
    pairs = list(pairs)
    total = sum(weight for _, weight in pairs)
    return sum(value * weight for value, weight in pairs) / total if total > 0 else math.nan


def aggregated_replies(replies: Sequence[TrainReply],
                       info: Mapping[str, float]) -> list[TrainReply]:
    """The replies a defence did not leave out (``info[<rule>-selected/<site>] == 0``).

    ``info`` is the aggregation's record (``AggregateOutcome.info``,
    :mod:`strategies.rounds.update_stream`): every defence that leaves replies
    out records each site's selection under :data:`SELECTED` (Multi-Krum,
    Blanchard et al. 2017: the ``m`` replies of lowest Krum score are kept).
    """
    left_out = {key.split(SELECTED, 1)[1] for key, value in info.items()
                if SELECTED in key and value == 0.0}
    return [reply for reply in replies if reply.site not in left_out]


def example_weighted_metrics(replies: Sequence[TrainReply | MetricsReply]) -> dict[str, float]:
    """Example-weighted mean of each metric over the replies reporting it; counts are totals.

    ``num-examples``, ``val-studies`` and ``test-studies`` are summed (a mean of
    counts means nothing).
    """
    if not replies:
        return {}
    counts = {keys.NUM_EXAMPLES, keys.VAL_STUDIES, keys.TEST_STUDIES}
    names = set().union(*(r.metrics for r in replies)) - counts
    out = {name: weighted_mean((r.metrics[name], r.num_examples) for r in replies if name in r.metrics)
           for name in sorted(names)}
    out[keys.NUM_EXAMPLES] = float(sum(r.num_examples for r in replies))
    for name in counts - {keys.NUM_EXAMPLES}:
        if any(name in r.metrics for r in replies):
            out[name] = float(sum(r.metrics.get(name, 0.0) for r in replies))
    return out
