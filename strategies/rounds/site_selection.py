"""Selecting a round's sites: what a selector may use, the query fan-out, the record.

A selector (:mod:`strategies.plugins`) picks the sites of a round from the
connected ones. It may use known data sizes and last train losses, and it may
ask candidates for the current global model's loss with Flower ``query``
messages (Power-of-Choice, Cho, Wang, Joshi, AISTATS 2022): the fan-out sends
them under the round policy, keeps the valid answers and counts their bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from logging import WARNING

from flwr.app import ArrayRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from strategies import message_keys as keys
from strategies.replies import InvalidReplyError, parse_metrics_reply
from strategies.rounds.instructions import query_messages
from strategies.rounds.round_policy import RoundPolicy, collect_replies
from strategies.rounds.round_report import RoundReport
from strategies.rounds.site_book import SiteBook
from strategies.wire_bytes import wire_size

__all__ = ["SelectionContext", "query_losses", "record_selection"]


@dataclass
class SelectionContext:
    """What a client selector may use: known data sizes, last train losses, a query.

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

    Valid answers from a node under its own site name (:meth:`SiteBook.identity_problem`)
    update ``book`` (name, first declared size); bytes down/up and the seconds
    spent go to ``report.strategy`` (``query-bytes-down``, ``query-bytes-up``,
    ``query-seconds``).
    """
    messages = query_messages(candidates, arrays, server_round, subset)
    sent = sum(wire_size(m.content) for m in messages)
    collected = collect_replies(grid, messages, policy, lambda m: m.has_content(), {})
    losses: dict[int, float] = {}
    received = 0
    for reply in collected.replies:
        node = reply.metadata.src_node_id
        try:
            parsed = parse_metrics_reply(reply, keys.QUERY_REQUIRED)
        except InvalidReplyError as exc:
            log(WARNING, "query: dropped reply of %s: %s", book.label(node), exc)
            continue
        received += wire_size(reply.content)
        problem = book.identity_problem(node, parsed.site)
        if problem is not None:
            log(WARNING, "query: dropped reply of %s: %s", book.label(node), problem)
            continue
        book.learn(node, parsed.site, num_examples=parsed.num_examples)
        losses[node] = parsed.metrics[keys.QUERY_LOSS]
    report.strategy.update({"query-bytes-down": float(sent),
                            "query-bytes-up": float(received),
                            "query-seconds": collected.seconds})
    return losses


def record_selection(report: RoundReport, selector: object, label: Callable[[int], str]) -> None:
    """Put the selector's last choice (``selector.last``) and counts in ``report``, by site name."""
    last = getattr(selector, "last", {})
    report.selection = {
        "selected": [label(n) for n in last.get("selected", [])],
        "candidates": [label(n) for n in last.get("candidates", [])],
        "losses": {label(n): float(v) for n, v in last.get("losses", {}).items()},
    }
    for key in ("d", "m"):
        if key in last:
            report.strategy[f"selection-{key}"] = float(last[key])
    report.times_selected = {label(n): float(c) for n, c in
                             getattr(selector, "times_selected", {}).items()}
