"""A site's two roles in the private set intersection of its patient ids (DH-PSI).

The product aligns the patients of a vertical federation with the Diffie-Hellman PSI
of ``openmined-psi`` (Angelou et al. 2020, the protocol NVIDIA FLARE's ``dh_psi``
runs; after Meadows 1986 and Huberman, Franklin & Hogg 1999). Over the elliptic curve
P-256 with hash-to-curve H:

- the **client** with items Y and secret key c sends the request {H(y)^c};
- the **server** with items X and secret key s sends the setup {H(x)^s} and the
  response {(H(y)^c)^s}, in the request's order;
- the client raises the response to c^-1, gets {H(y)^s} and finds which of them are
  in the setup: the indices of Y ∩ X in its own request. The server learns only |Y|;
  whoever relays the messages sees only curve points and the set sizes.

Every item is the site's salted id, ``HMAC-SHA256(secret, federation || 0x00 || id)``
in hex (Bellare, Canetti & Krawczyk 1996; RFC 2104), keyed by the secret the
federation's sites share and the coordinator never learns (clients/vertical/psi_secret.py):
the coordinator cannot hash a guessed id into an item, so a request it forges matches
nothing (issue #46, found item 4: with the federation name as the only salt it could).
The federation in the message keeps the encodings of one patient unlinkable across
federations. Each set that enters a message is padded with random dummy items to a
multiple of :data:`PAD` (at least one multiple), so a message's size tells the sizes
only to that grain; a dummy is 256 random bits and matches nothing.

These functions hold no state between calls: the client's key, its request items and
its current set travel in :class:`PsiClientState`, which the stage handlers keep in
the site's state folder (clients/vertical/psi_stages.py).
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import private_set_intersection.python as psi
from cryptography.hazmat.primitives import hashes, hmac
from google.protobuf.message import DecodeError, Message

from strategies.wire.errors import SiteError

__all__ = ["PAD", "PsiClientState", "salted_items", "padded", "new_request", "finish",
           "request_size", "serve"]

#: A set entering a message is padded to a multiple of this many items.
PAD = 64
#: The false-positive rate of the server's setup (ignored by the RAW structure, which
#: holds every encrypted item and so has none).
_FPR = 1e-9

M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class PsiClientState:
    """A site's side of its one PSI request, kept between messages.

    Attributes
    ----------
    key : bytes
        The client's secret key c (32 bytes).
    items : list of str
        The items of the request, in its order (the salted ids and the dummies).
    current : list of str
        The site's salted ids still in the intersection, sorted.
    """

    key: bytes
    items: list[str]
    current: list[str]

    def to_json(self) -> bytes:
        """The state as JSON bytes (the key in hex)."""
        return json.dumps({"key": self.key.hex(), "items": self.items,
                           "current": self.current}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> PsiClientState:
        """The state :meth:`to_json` wrote."""
        loaded = json.loads(data)
        return cls(bytes.fromhex(loaded["key"]), list(loaded["items"]), list(loaded["current"]))


def salted_items(secret: bytes, federation: str, ids: Iterable[str]) -> dict[str, str]:
    """Map each salted id ``HMAC-SHA256(secret, federation || 0x00 || id)`` (hex) to its id
    (an id listed twice is one item).

    ``secret`` is the sites' shared key (:func:`clients.vertical.psi_secret.site_secret`).
    """
    prefix = federation.encode() + b"\x00"
    salted = {}
    for item in ids:
        mac = hmac.HMAC(secret, hashes.SHA256())
        mac.update(prefix + str(item).encode())
        salted[mac.finalize().hex()] = str(item)
    return salted


def padded(items: Sequence[str]) -> list[str]:
    """``items`` and random dummies, ``PAD * max(1, ceil(len / PAD))`` in all, shuffled."""
    size = PAD * max(1, math.ceil(len(items) / PAD))
    every = list(items) + [secrets.token_hex(32) for _ in range(size - len(items))]
    secrets.SystemRandom().shuffle(every)
    return every


def new_request(current: Sequence[str]) -> tuple[PsiClientState, bytes]:
    """A fresh client key and its request over ``current`` (padded).

    Returns
    -------
    state : PsiClientState
        What :func:`finish` needs later.
    request : bytes
        The serialised ``psi.Request``: {H(y)^c} for every padded item y.
    """
    client = psi.client.CreateWithNewKey(True)
    items = padded(current)
    request = client.CreateRequest(items).SerializeToString()
    return PsiClientState(client.GetPrivateKeyBytes(), items, sorted(current)), request


def finish(state: PsiClientState, setup: bytes, response: bytes) -> PsiClientState:
    """The client's current set intersected with a server's set, from its setup and response.

    Raises
    ------
    SiteError
        If the setup or response is not a PSI message, or names an item not in the request.
    """
    client = psi.client.CreateFromKey(state.key, True)
    try:
        found = client.GetIntersection(_parsed(psi.ServerSetup(), setup, "setup"),
                                       _parsed(psi.Response(), response, "response"))
    except RuntimeError as error:
        raise SiteError(f"PSI finish: the server's setup and response do not fit: {error}"
                        ) from error
    if any(not 0 <= index < len(state.items) for index in found):
        raise SiteError(f"PSI finish: the response names item indices outside the request "
                        f"({len(state.items)} items)")
    shared = {state.items[index] for index in found}
    return PsiClientState(state.key, state.items,
                          [item for item in state.current if item in shared])


def request_size(request: bytes, what: str = "request") -> int:
    """The number of items {H(y)^c} a serialised ``psi.Request`` holds.

    Raises
    ------
    SiteError
        If ``request`` is not a PSI message (naming it ``what``).
    """
    return len(_parsed(psi.Request(), request, what).encrypted_elements)


def serve(current: Sequence[str], requests: Sequence[bytes]) -> tuple[bytes, list[bytes]]:
    """The server's setup over ``current`` (padded) and its response to each request.

    One fresh server key s serves every request, so one setup {H(x)^s} fits them all.

    Raises
    ------
    SiteError
        If a request is not a PSI request.
    """
    server = psi.server.CreateWithNewKey(True)
    setup = server.CreateSetupMessage(_FPR, 1, padded(current), psi.DataStructure.RAW)
    responses = []
    for number, request in enumerate(requests):
        parsed = _parsed(psi.Request(), request, f"request {number}")
        try:
            responses.append(server.ProcessRequest(parsed).SerializeToString())
        except RuntimeError as error:
            raise SiteError(f"PSI serve: request {number} is not a PSI request: {error}") from error
    return setup.SerializeToString(), responses


def _parsed(message: M, data: bytes, what: str) -> M:
    """``message`` parsed from ``data``; a :class:`SiteError` naming ``what`` if it is not one."""
    try:
        message.ParseFromString(data)
    except DecodeError as error:
        raise SiteError(f"PSI: the {what} is not a PSI message: {error}") from error
    return message
