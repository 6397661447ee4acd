"""Selecting a round's sites: what a selector may use, the query fan-out, the record.

A selector (:mod:`strategies.plugins`) picks the sites of a round from the
connected ones. It may use known data sizes (each site's first declaration, of
a train or a query reply, held to the site book's relative cap:
:meth:`~strategies.rounds.site_book.SiteBook.capped_sizes`, so a lying query
size buys a site no more candidacy than weight in the aggregate) and last train
losses, and it may ask candidates for the current global model's loss with Flower ``query``
messages (Power-of-Choice, Cho, Wang, Joshi, AISTATS 2022): the fan-out is one
exchange under the round policy; it keeps the valid answers and counts their bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from flwr.app import ArrayRecord
from flwr.serverapp import Grid

from strategies.plugins.protocols import Selector
from strategies.replies import parse_metrics_reply, wire_size
from strategies.rounds.exchange import exchange
from strategies.rounds.instructions import query_messages
from strategies.rounds.reply_intake import ReplyIntake
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.round_report import RoundReport
from strategies.rounds.site_book import SiteBook
from strategies.wire import message_keys as keys

__all__ = ["SelectionContext", "query_losses", "record_selection"]


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

    One exchange (:func:`strategies.rounds.exchange.exchange`): valid answers from a
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
