"""The coordinator's patient alignment: the PSI plan run over the federation's messages.

:func:`align` sends each step of strategies/vertical/psi_plan.py to its sites through
``VerticalContext.send`` and routes what comes back: the requests of the first stage
to the sites that serve them, each server's answer (setup + response) to the site that
finishes with it. The coordinator relays curve points only (clients/vertical/psi.py),
of items keyed by the sites' PSI secret, which it never holds (a request it forged would
match nothing, and each site bounds and counts the requests it serves): it sees the size of each padded set that enters a message and, at the end, the
intersection's size, which every site reports (metric ``psi-size``; checked equal here,
logged to MLflow by :func:`app.vertical.federation.federate_vertical`).
docs/VERTICAL.md, "Patient alignment (PSI)".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from clients.vertical.psi_stages import (
    LAST, PSI_SIZE, REQUEST, RESPONSE, SERVE, SETUP, request_key, response_key)
from strategies.vertical.psi_plan import PsiTask, REQUEST_STAGE, psi_plan
from strategies.wire.errors import FederationError

if TYPE_CHECKING:
    from app.vertical.federation import VerticalContext
    from app.vertical.messages import StageAnswer

__all__ = ["PSI_ROUND", "align"]

#: The server round the PSI's messages carry: before the first round of training.
PSI_ROUND = 0

#: (server node, client node) -> the server's setup and its response to that client.
Answers = dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]


def align(ctx: VerticalContext) -> int:
    """Align the patients of ``ctx.nodes`` by PSI; return the intersection's size.

    Every site ends holding its shared patients' ids in the common order
    (clients/vertical/alignment.py).

    Raises
    ------
    FederationError
        If a reply lacks an array or metric the plan needs, or the sites report
        different intersection sizes (``ctx.send`` raises its own for a site's error
        reply, a policy refusal included).
    """
    requests: dict[int, np.ndarray] = {}
    answers: Answers = {}
    sizes: dict[int, int] = {}
    for step in psi_plan(ctx.nodes):
        sent = {task.node: _message(task, requests, answers) for task in step.tasks}
        replies = ctx.send(step.stage, sent, server_round=PSI_ROUND)
        for task in step.tasks:
            reply = replies[task.node]
            if step.stage == REQUEST_STAGE:
                requests[task.node] = _array(ctx, reply, REQUEST)
            for number, client in enumerate(task.serve):
                answers[(task.node, client)] = (_array(ctx, reply, SETUP),
                                                _array(ctx, reply, response_key(number)))
            if task.last:
                sizes[task.node] = _size(ctx, reply)
    if len(set(sizes.values())) != 1:
        reported = {ctx.department(node): size for node, size in sizes.items()}
        raise FederationError(f"PSI: the sites report different intersection sizes: {reported}")
    return sizes[ctx.nodes[0]]


def _message(task: PsiTask, requests: Mapping[int, np.ndarray], answers: Answers
             ) -> tuple[dict[str, int | bool], dict[str, np.ndarray]]:
    """The config entries and arrays of ``task``'s message (its answer is consumed)."""
    arrays = {request_key(number): requests[client] for number, client in enumerate(task.serve)}
    if task.finish_with is not None:
        arrays[SETUP], arrays[RESPONSE] = answers.pop((task.finish_with, task.node))
    return {SERVE: len(task.serve), LAST: task.last}, arrays


def _array(ctx: VerticalContext, reply: StageAnswer, name: str) -> np.ndarray:
    """Array ``name`` of a site's reply."""
    if name not in reply.arrays:
        raise FederationError(f"PSI: site {ctx.department(reply.node_id)} replied without array "
                              f"{name!r}")
    return reply.arrays[name]


def _size(ctx: VerticalContext, reply: StageAnswer) -> int:
    """The intersection size a site's last finish reports."""
    size = reply.metrics.get(PSI_SIZE)
    if not isinstance(size, (int, float)) or size < 0 or int(size) != size:
        raise FederationError(f"PSI: site {ctx.department(reply.node_id)} reported no valid "
                              f"metric {PSI_SIZE!r} (got {size!r})")
    return int(size)
