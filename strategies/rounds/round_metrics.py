r"""What a round records about itself: its metrics, its bytes on the wire, its selection.

**Metrics.** The federation's value of each site metric is the example-weighted mean
over the replies (:func:`example_weighted_metrics`). Each metric (but ``num-examples``)
is averaged over the replies that report it, with those sites' numbers of examples as
weights (:func:`weighted_mean`,
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

**Traffic.** Byte accounting of a round: what each site received and sent, against
dense fp32. Bytes are the serialised sizes Flower really sends
(:func:`strategies.rounds.reply_intake.wire_size`): down is a site's train instruction
(:func:`bytes_down`), up its train reply. The baseline is the update as dense float32
(:func:`strategies.wire.model_layout.dense_bytes`); the uplink ratio
``dense / bytes up`` is the codec's compression as seen on the wire
(:func:`record_traffic`).

**Selection.** A selector (:mod:`strategies.plugins`) picks the sites of a round from
the connected ones (:class:`SelectionContext`). It may use known data sizes (each
site's first declaration, of a train or a query reply, held to the site book's
relative cap: :meth:`~strategies.rounds.site_book.SiteBook.capped_sizes`, so a lying
query size buys a site no more candidacy than weight in the aggregate) and last train
losses, and it may ask candidates for the current global model's loss with Flower
``query`` messages (Power-of-Choice, Cho, Wang, Joshi, AISTATS 2022;
:func:`query_losses`): the fan-out is one exchange under the round policy; it keeps
the valid answers and records their bytes and seconds. The choice itself, by site
name, is recorded with :func:`record_selection`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
from flwr.app import ArrayRecord, Message
from flwr.serverapp import Grid

from strategies.plugins.protocols import Selector
from strategies.rounds.instructions import exchange, query_messages
from strategies.rounds.reply_intake import (MetricsReply, ReplyIntake, TrainReply,
                                            parse_metrics_reply, wire_size)
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.round_report import RoundReport
from strategies.rounds.site_book import SiteBook
from strategies.wire import message_keys as keys
from strategies.wire.model_layout import dense_bytes

__all__ = ["SELECTED", "SelectionContext", "aggregated_replies", "bytes_down",
           "example_weighted_metrics", "query_losses", "record_selection", "record_traffic",
           "weighted_mean"]

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


def bytes_down(messages: Sequence[Message]) -> dict[int, int]:
    """Serialised bytes of each instruction, by destination node."""
    return {m.metadata.dst_node_id: wire_size(m.content) for m in messages}


def record_traffic(report: RoundReport, down: dict[int, int], accepted: Sequence[TrainReply],
                   global_arrays: Sequence[np.ndarray], label: Callable[[int], str]) -> None:
    """Per-site and total traffic of the round's train stage into ``report``.

    ``report.traffic[site]`` gets ``bytes-down``, ``bytes-up`` and
    ``uplink-ratio``; ``report.strategy`` the totals ``bytes-up``,
    ``bytes-down``, ``dense-bytes`` and, when any reply was accepted, the
    round's ``uplink-ratio`` (dense bytes of all accepted updates / bytes up).
    """
    dense = float(dense_bytes(global_arrays))
    for node, sent in down.items():
        report.traffic.setdefault(label(node), {})["bytes-down"] = float(sent)
    for reply in accepted:
        traffic = report.traffic.setdefault(reply.site, {})
        traffic["bytes-up"] = float(reply.wire_bytes)
        traffic["uplink-ratio"] = dense / max(reply.wire_bytes, 1)
    ups = [t["bytes-up"] for t in report.traffic.values() if "bytes-up" in t]
    downs = [t["bytes-down"] for t in report.traffic.values() if "bytes-down" in t]
    report.strategy.update({"bytes-up": float(sum(ups)), "bytes-down": float(sum(downs)),
                            "dense-bytes": dense})
    if ups:
        report.strategy["uplink-ratio"] = dense * len(ups) / sum(ups)


@dataclass
class SelectionContext:
    """What a client selector may use: known data sizes (held to the relative cap), last
    train losses, a query.

    ``query_losses(candidates, subset)`` sends Flower ``query`` messages and
    returns ``{node_id: loss of the current global model}`` for the sites that
    answered (on ``subset`` examples each, or all their training data if 0).
    """

    sizes: dict[int, int]
    last_losses: dict[int, float]
    query_losses: Callable[[list[int], int], dict[int, float]]


def query_losses(grid: Grid, policy: RoundPolicy, server_round: int, arrays: ArrayRecord,
                 candidates: list[int], subset: int, book: SiteBook,
                 report: RoundReport) -> dict[int, float]:
    """Ask ``candidates`` for the global model's loss on their data (Flower ``query``).

    One exchange (:func:`strategies.rounds.instructions.exchange`): valid answers from a
    node under its own site name (:meth:`SiteBook.identity_problem`) update ``book``
    (name, first declared size); bytes down/up and the seconds spent go to
    ``report.strategy`` (``query-bytes-down``, ``query-bytes-up``, ``query-seconds``).
    """
    messages = query_messages(candidates, arrays, server_round, subset)
    sent = sum(wire_size(m.content) for m in messages)
    parse = partial(parse_metrics_reply, required=keys.QUERY_REQUIRED)
    expected = {node: book.label(node) for node in candidates}
    exchanged = exchange(grid, messages, policy, ReplyIntake("query", book, parse, expected))
    losses: dict[int, float] = {}
    for reply in exchanged.taken.accepted:
        book.learn(reply.node_id, reply.site, num_examples=reply.num_examples)
        losses[reply.node_id] = reply.metrics[keys.QUERY_LOSS]
    report.strategy.update({
        "query-bytes-down": float(sent),
        "query-bytes-up": float(sum(r.wire_bytes for r in exchanged.taken.accepted)),
        "query-seconds": exchanged.seconds})
    return losses


def record_selection(report: RoundReport, selector: Selector,
                     label: Callable[[int], str]) -> None:
    """Put the selector's last choice (``selector.last``) and counts in ``report``, by site name."""
    last = selector.last
    report.selection = {
        "selected": [label(n) for n in last.get("selected", [])],
        "candidates": [label(n) for n in last.get("candidates", [])],
        "losses": {label(n): float(v) for n, v in last.get("losses", {}).items()},
    }
    for key in ("d", "m"):
        if key in last:
            report.strategy[f"selection-{key}"] = float(last[key])
    report.times_selected = {label(n): float(c) for n, c in
                             selector.times_selected.items()}
