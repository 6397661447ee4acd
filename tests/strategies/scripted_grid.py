"""Scripted sites on the in-process engine, for the round machinery's tests.

A test states what each node answers (a function of the instruction it receives);
the engine (:class:`app.engine.InProcessGrid`) carries the messages as Flower's
grids do: fresh message ids, ``reply_to``, the replying node as source, each side
its own serialised copy, the SuperLink's answer for a node that is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord

from app.engine import InProcessGrid, SiteFaults, VirtualSite

__all__ = ["Answer", "connected", "flower_round", "scripted_grid"]

#: A site's reply to the instruction it received.
Answer = Callable[[Message], Message]

_SILENT = SiteFaults(silent_from_round=0)


def _never(message: Message) -> Message:
    raise AssertionError(f"node {message.metadata.dst_node_id} was not expected a message")


def scripted_grid(answers: Mapping[int, Answer], silent: Iterable[int] = (),
                  faults: Mapping[int, SiteFaults] | None = None) -> InProcessGrid:
    """Node ``n`` answers each instruction with ``answers[n](instruction)``.

    Nodes in ``silent`` take instructions and never answer; ``faults`` gives a node
    other faults (latency, failure, disconnection).
    """
    faults = dict(faults or {})
    faults.update({node: _SILENT for node in silent})

    def handler(answer: Answer) -> Callable[[Message, Context], Message]:
        return lambda message, _context: answer(message)

    nodes = sorted(set(answers) | set(faults))
    return InProcessGrid([VirtualSite({}, handler(answers.get(node, _never)),
                                      faults.get(node, SiteFaults()), node_id=node)
                          for node in nodes])


def connected(nodes: Iterable[int]) -> InProcessGrid:
    """A grid on which ``nodes`` are connected and expect no message (a test of
    ``configure_train`` / ``configure_evaluate`` alone)."""
    return scripted_grid(dict.fromkeys(nodes, _never))


def flower_round(strategy, server_round: int, grid: InProcessGrid, arrays: ArrayRecord,
                 config: ConfigRecord | None = None
                 ) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """One train round as Flower's ``Strategy.start`` runs it: ``configure_train``, the
    grid's ``send_and_receive``, ``aggregate_train`` (the product's ``start`` takes each
    reply in during its own exchange instead)."""
    messages = strategy.configure_train(server_round, arrays, config or ConfigRecord(), grid)
    return strategy.aggregate_train(server_round, grid.send_and_receive(messages, timeout=5.0))
