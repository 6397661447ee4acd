"""The coordinator's plan of the private set intersection: which site does what, when.

The chain of two-party DH-PSI exchanges that NVIDIA FLARE's ``dh_psi`` workflow runs
(``nvflare/app_common/psi/dh_psi``: a forward pass that narrows the intersection from
site to site, then a backward pass from the site that holds it), over the sites
n0..nm in the coordinator's fixed order, m >= 1:

1. ``psi-request`` (every site, in parallel): a client key and one request over the
   site's own salted ids. n0's request is served in the backward pass only, nm's in
   the forward pass only, the others' in both (one request, two servers).
2. Forward, for k = 1..m in turn, one message to n(k-1): it finishes its own request
   with n(k-2)'s answer (k >= 2: its set becomes the intersection of n0..n(k-1)),
   then serves n(k)'s request over that set.
3. One message to nm: it finishes with n(m-1)'s answer, so holds the intersection of
   every site (its last finish), and serves the requests of n0..n(m-1) over it.
4. n0..n(m-1), in parallel: each finishes with nm's answer, its last finish: every
   site now holds the full intersection.

That is m + 3 sequential messages (FLARE's backward pass asks for a second request
first: one message more). A site's set narrows only by its own finishes and it serves
only its current set, so each site learns its intersection with the sites before it
(forward) and then the full intersection, never an id that is not shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strategies.wire.errors import ConfigError

__all__ = ["REQUEST_STAGE", "STEP_STAGE", "PsiTask", "PsiStep", "psi_plan"]

#: The site's two PSI stages (clients/vertical/psi_stages.py).
REQUEST_STAGE = "psi-request"
STEP_STAGE = "psi-step"


@dataclass(frozen=True)
class PsiTask:
    """One site's part in one step of the PSI.

    Attributes
    ----------
    node : int
        The site's node id.
    finish_with : int or None
        The node whose answer (setup and response) to this site's request it finishes
        with first; ``None``: no finish in this step.
    serve : tuple of int
        The nodes whose requests the site then serves, in this order.
    last : bool
        The finish completes the site's intersection (it saves it and reports its size).
    """

    node: int
    finish_with: int | None = None
    serve: tuple[int, ...] = ()
    last: bool = False


@dataclass(frozen=True)
class PsiStep:
    """One sequential step: one stage sent to the listed sites at once."""

    stage: str
    tasks: tuple[PsiTask, ...]


def psi_plan(nodes: Sequence[int]) -> list[PsiStep]:
    """The steps of the PSI over ``nodes`` (n0..nm, in the coordinator's order).

    Raises
    ------
    ConfigError
        If fewer than two nodes are given or a node is listed twice.
    """
    order = list(nodes)
    if len(order) < 2 or len(set(order)) != len(order):
        raise ConfigError(f"a PSI needs at least two distinct sites, got nodes {order}")
    last = len(order) - 1
    steps = [PsiStep(REQUEST_STAGE, tuple(PsiTask(node) for node in order))]
    for k in range(1, last + 1):
        steps.append(PsiStep(STEP_STAGE, (PsiTask(
            order[k - 1], finish_with=order[k - 2] if k >= 2 else None, serve=(order[k],)),)))
    steps.append(PsiStep(STEP_STAGE, (PsiTask(
        order[last], finish_with=order[last - 1], serve=tuple(order[:last]), last=True),)))
    steps.append(PsiStep(STEP_STAGE, tuple(
        PsiTask(node, finish_with=order[last], last=True) for node in order[:last])))
    return steps
