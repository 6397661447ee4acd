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

The site's ids, and after every finish its current set, must hold at least the policy's
``vertical.min-intersection`` patients, else the site refuses (PolicyRefusal of that
rule) and keeps the refusal: every later per-patient stage of the federation is
refused too, and so is a new PSI in it. Between messages the site keeps its key, its
request's items and its current set in ``psi-client.json`` in the federation's state
folder; the last finish removes it, leaving only the aligned ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from clients.site.atomic_file import write_atomic
from clients.vertical.alignment import ALIGNMENT_FILE, load_alignment, save_alignment, save_refusal
from clients.vertical.psi import PsiClientState, finish, new_request, salted_items, serve
from clients.vertical.stages import VerticalReply, VerticalRequest
from strategies.wire.errors import SiteError

__all__ = ["REQUEST", "SETUP", "RESPONSE", "SERVE", "LAST", "PSI_SIZE", "CLIENT_FILE",
           "request_key", "response_key", "psi_request", "psi_step"]

#: Array names and config entries of the two stages (the coordinator's side:
#: app/vertical/psi_flow.py).
REQUEST = "request"
SETUP = "setup"
RESPONSE = "response"
SERVE = "psi-serve"
LAST = "psi-last"
PSI_SIZE = "psi-size"
CLIENT_FILE = "psi-client.json"


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
        patients than its policy's minimum.
    """
    state_dir = request.site.state_dir
    if (state_dir / ALIGNMENT_FILE).is_file():
        load_alignment(state_dir)  # raises the refusal the site keeps
        (state_dir / ALIGNMENT_FILE).unlink()
    items = salted_items(request.federation, request.site.task().report.loaded)
    _check_minimum(request, len(items))
    state, payload = new_request(sorted(items))
    _save_client(state_dir, state)
    return VerticalReply(arrays={REQUEST: np.frombuffer(payload, np.uint8)})


def psi_step(request: VerticalRequest) -> VerticalReply:
    """Stage ``psi-step``: finish the site's request if answered, then serve the requests given.

    Raises
    ------
    PolicyRefusal
        Rule ``vertical.min-intersection`` if a finish leaves fewer shared patients than
        the site's policy allows.
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
            ids = salted_items(request.federation, request.site.task().report.loaded)
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
        setup, responses = serve(state.current, [_bytes(request.arrays, request_key(number))
                                                 for number in range(served)])
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
