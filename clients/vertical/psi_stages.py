"""The site's stages of the patient alignment: ``psi-request`` and ``psi-step``.

The coordinator runs the chain of DH-PSI exchanges that NVIDIA FLARE's ``dh_psi``
workflow runs (strategies/vertical/psi_plan.py): a forward pass along the sites
n0..nm leaves the full intersection at nm, a backward pass from nm gives it to every
other site. A site answers two stages (clients/vertical/psi.py does the cryptography):

- ``psi-request``: a fresh client key and ONE request over all the site's salted ids
  (reply array ``request``). The same request is served twice: by the previous site
  of the chain (forward) and by the last site (backward).
- ``psi-step``: first, when given the arrays ``setup`` and ``response`` (a server's
  answer to the site's request), *finish*: the site's current set shrinks to the
  items that server holds; then, when config ``psi-serve`` = r > 0, *serve* the
  requests ``request-0`` .. ``request-(r-1)`` over the current set (reply arrays
  ``setup`` and ``response-0`` ..). Config ``psi-last`` marks the finish that
  completes the site's intersection: the aligned ids are saved
  (clients/vertical/alignment.py) and the reply's metric ``psi-size`` is the
  intersection's size, the only size a site reports.

The salted ids are keyed by the sites' PSI secret (clients/vertical/psi_secret.py, rule
``vertical.psi-secret``), which the coordinator never sees. The site's ids, after every
finish its current set, and the set it serves must hold at least the policy's
``vertical.min-intersection`` patients, else the site refuses (PolicyRefusal of that
rule) and keeps the refusal: every later per-patient stage of the federation is
refused too, and so is a new PSI in it. Serving answers "which of these items do I
hold", so a served request is also bounded (issue #46, found item 4):

- ``vertical.max-request-ratio`` = q: a request may hold at most q x P items, P the
  size of the site's own *padded* set (its own request: all its salted ids padded to a
  multiple of :data:`~clients.vertical.psi.PAD`, at least one). Padded, because every
  honest request is padded: against the raw size, a peer of the same 20 patients (64
  items) would be 3.2 x the site; and the site's own full set, not its current one,
  because the last site of the chain serves the other sites' full-set requests over
  the (smaller) intersection. A peer much larger than the site is refused: at q = 2 a
  60-patient site (64 padded) serves at most 128 items, never 2 x 20,000. The ratio
  is checked before the request is counted;
- ``vertical.max-psi-requests``: each served request is counted per dataset, all
  federations together (:func:`clients.site.query_budget.take_request`, counter
  ``psi-requests``), in the site's ``request-counts`` folder. The hospital's runtime
  counts the same requests again in its own folder before the worker runs
  (app/site_runtime/runtime_gate.py): two counts, each under the cap, as loss queries
  are (``take_query``), so a runtime-ledger site counts in both places, once in each.

Between messages the site keeps its key, its request's items and its current set in
``psi-client.json`` in the federation's state folder; the last finish removes it,
leaving only the aligned ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from clients.site.atomic_file import write_atomic
from clients.site.policy import PolicyRefusal
from clients.site.query_budget import PSI_REQUESTS, QUERY_COUNTS, take_request
from clients.vertical.alignment import ALIGNMENT_FILE, load_alignment, save_alignment, save_refusal
from clients.vertical.psi import (PsiClientState, finish, new_request, request_size,
                                  salted_items, serve)
from clients.vertical.psi_secret import site_secret
from clients.vertical.stages import VerticalReply, VerticalRequest
from strategies.wire.errors import SiteError

__all__ = ["REQUEST", "SETUP", "RESPONSE", "SERVE", "LAST", "PSI_SIZE", "CLIENT_FILE",
           "RATIO_RULE", "REQUESTS_RULE", "request_key", "response_key", "psi_request",
           "psi_step"]

#: Array names and config entries of the two stages (the coordinator's side:
#: app/vertical/psi_flow.py).
REQUEST = "request"
SETUP = "setup"
RESPONSE = "response"
SERVE = "psi-serve"
LAST = "psi-last"
PSI_SIZE = "psi-size"
CLIENT_FILE = "psi-client.json"
#: The policy rules that bound what a site serves.
RATIO_RULE = "vertical.max-request-ratio"
REQUESTS_RULE = "vertical.max-psi-requests"


def request_key(number: int) -> str:
    """The name of the ``number``-th request a ``psi-step`` serves."""
    return f"{REQUEST}-{number}"


def response_key(number: int) -> str:
    """The name of the response to the ``number``-th request in a ``psi-step`` reply."""
    return f"{RESPONSE}-{number}"


def psi_request(request: VerticalRequest) -> VerticalReply:
    """Stage ``psi-request``: a new client key and the request over all the site's ids.

    A previous alignment of the federation is dropped; a recorded refusal is raised again.

    Raises
    ------
    PolicyRefusal
        Rule ``vertical.min-intersection``: recorded before, or the site holds fewer
        patients than its policy's minimum; rule ``vertical.psi-secret``: no usable secret.
    """
    state_dir = request.site.state_dir
    if (state_dir / ALIGNMENT_FILE).is_file():
        load_alignment(state_dir)  # raises the refusal the site keeps
        (state_dir / ALIGNMENT_FILE).unlink()
    items = salted_items(site_secret(request.site.site), request.federation,
                         request.site.task().report.loaded)
    _check_minimum(request, len(items))
    state, payload = new_request(sorted(items))
    _save_client(state_dir, state)
    return VerticalReply(arrays={REQUEST: np.frombuffer(payload, np.uint8)})


def psi_step(request: VerticalRequest) -> VerticalReply:
    """Stage ``psi-step``: finish the site's request if answered, then serve the requests given.

    Raises
    ------
    PolicyRefusal
        Rule ``vertical.min-intersection`` if a finish leaves, or the set served holds,
        fewer shared patients than the site's policy allows; ``vertical.max-request-ratio``
        for a request too large; ``vertical.max-psi-requests`` once the dataset has
        served its cap; ``vertical.psi-secret`` (the last finish) for no usable secret.
    SiteError
        If the site has no pending request, an array is missing or not bytes, a PSI
        message is malformed, or the site's loaded patients changed since its request.
    """
    state_dir = request.site.state_dir
    state = _load_client(state_dir)
    reply = VerticalReply()
    if SETUP in request.arrays:
        state = finish(state, _bytes(request.arrays, SETUP), _bytes(request.arrays, RESPONSE))
        _check_minimum(request, len(state.current))
        if bool(request.config.get(LAST, False)):
            ids = salted_items(site_secret(request.site.site), request.federation,
                               request.site.task().report.loaded)
            if not set(state.current) <= set(ids):
                raise SiteError("PSI: the site's loaded patients changed since its request; "
                                "the alignment must run again")
            save_alignment(state_dir, [ids[item] for item in state.current])
            (state_dir / CLIENT_FILE).unlink()
            reply.metrics[PSI_SIZE] = len(state.current)
        else:
            _save_client(state_dir, state)
    served = int(request.config.get(SERVE, 0))
    if served > 0:
        requests = [_bytes(request.arrays, request_key(number)) for number in range(served)]
        _check_serving(request, state, requests)
        setup, responses = serve(state.current, requests)
        reply.arrays[SETUP] = np.frombuffer(setup, np.uint8)
        reply.arrays.update({response_key(number): np.frombuffer(response, np.uint8)
                             for number, response in enumerate(responses)})
    return reply


def _check_minimum(request: VerticalRequest, size: int) -> None:
    """Refuse, and keep the refusal, if ``size`` patients are fewer than the policy's minimum."""
    minimum = request.site.rules.min_intersection
    if size < minimum:
        (request.site.state_dir / CLIENT_FILE).unlink(missing_ok=True)
        raise save_refusal(request.site.state_dir, f"{size} patients left to align, fewer than "
                                                   f"the minimum {minimum}")


def _check_serving(request: VerticalRequest, state: PsiClientState,
                   requests: list[bytes]) -> None:
    """Refuse to serve ``requests`` over ``state.current`` unless every rule allows it; count them.

    The current set must hold the policy's minimum (the refusal is kept), each request at
    most ``max-request-ratio`` x the site's own padded set (``len(state.items)``, see the
    module docstring); then each request is counted against ``max-psi-requests``.
    """
    rules = request.site.rules
    _check_minimum(request, len(state.current))
    own = len(state.items)
    for number, payload in enumerate(requests):
        size = request_size(payload, f"request {number}")
        if size > rules.max_request_ratio * own:
            raise PolicyRefusal(RATIO_RULE, f"request {number} holds {size} items, more than "
                                f"{rules.max_request_ratio:g} x the {own} of this site's own "
                                f"padded set")
    for _ in requests:
        take_request(request.site.site.state_dir / QUERY_COUNTS, request.site.data_path,
                     PSI_REQUESTS, rules.max_psi_requests, REQUESTS_RULE)


def _bytes(arrays: Mapping[str, np.ndarray], name: str) -> bytes:
    """The bytes array ``name`` carries (a 1-D uint8 array)."""
    if name not in arrays:
        raise SiteError(f"PSI: the message has no array {name!r}")
    array = np.asarray(arrays[name])
    if array.dtype != np.uint8 or array.ndim != 1:
        raise SiteError(f"PSI: array {name!r} must be 1-D uint8 bytes, got {array.dtype} "
                        f"of shape {array.shape}")
    return array.tobytes()


def _save_client(state_dir: Path, state: PsiClientState) -> None:
    """Keep the site's side of its PSI request in ``state_dir``."""
    data = state.to_json()
    write_atomic(state_dir / CLIENT_FILE, lambda handle: handle.write(data))


def _load_client(state_dir: Path) -> PsiClientState:
    """The site's side of its PSI request, kept by :func:`psi_request`."""
    path = state_dir / CLIENT_FILE
    if not path.is_file():
        raise SiteError(f"{CLIENT_FILE}: no pending PSI request in this federation; "
                        f"stage psi-request must come first")
    return PsiClientState.from_json(path.read_bytes())
