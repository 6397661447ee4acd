r"""A site's side of the compressed downlink: the reference it holds, advanced and verified.

Given a train instruction's :class:`~strategies.wire.downlink_header.DownlinkHeader`,
its ``arrays`` and the reference the site held
(:class:`~strategies.wire.downlink_reference.Reference`, from its state dir),
:func:`receive` returns the new reference:

* a dense snapshot replaces whatever the site held;
* a compressed step :math:`\hat d_t` is decoded and added,
  :math:`\hat x_t = \hat x_{t-1} + \hat d_t` (the book's chapter 3, eq. 3.9),
  only onto the version it was computed against;
* either way the result's SHA-256 must equal the header's checksum.

A site that holds no reference (new, or restarted without its state), another
version, or whose result fails the checksum raises :class:`DownlinkSyncError`:
it answers this round with an error reply, does not acknowledge the version,
and the server sends it a dense snapshot the next time it is selected
(:mod:`strategies.downlink`).

Pure numpy: the site's round (:mod:`clients.site`) calls it and keeps the
reference on disk.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from strategies.wire.codecs import decode
from strategies.wire.downlink_header import DownlinkHeader, PAYLOAD_KEY, RAW_KEY
from strategies.wire.downlink_reference import Reference
from strategies.wire.errors import SiteError
from strategies.wire.model_layout import unpack_model

__all__ = ["DownlinkSyncError", "receive"]


class DownlinkSyncError(SiteError):
    """A site cannot reconstruct the server's reference model: it needs a dense snapshot."""


def _advance(arrays: Mapping[str, np.ndarray], header: DownlinkHeader, held: Reference | None) -> Reference:
    if held is None or held.version != header.base:
        have = "no reference" if held is None else f"reference version {held.version}"
        raise DownlinkSyncError(f"downlink step applies to version {header.base}, the site "
                                f"holds {have}: it needs a dense snapshot")
    if set(arrays.keys()) != {PAYLOAD_KEY, RAW_KEY}:
        raise DownlinkSyncError(f"compressed downlink must hold exactly '{PAYLOAD_KEY}' and "
                                f"'{RAW_KEY}', got {sorted(arrays.keys())}")
    try:
        step = decode(np.asarray(arrays[PAYLOAD_KEY]), header.codec, sum(held.segments()),
                      seed=header.seed, segments=held.segments())
        return held.advanced(step, np.asarray(arrays[RAW_KEY]), header.version)
    except ValueError as exc:
        raise DownlinkSyncError(f"downlink step rejected: {exc}") from exc


def receive(arrays: Mapping[str, np.ndarray], header: DownlinkHeader,
            held: Reference | None) -> Reference:
    """The reference after this instruction, verified against ``header.checksum``.

    Parameters
    ----------
    arrays : mapping of str to numpy.ndarray
        The instruction's ``arrays``: a packed dense snapshot, or ``payload`` and ``raw``.
    header : DownlinkHeader
        The instruction's downlink entries.
    held : Reference or None
        What the site held before (``None``: nothing).

    Raises
    ------
    DownlinkSyncError
        When a step does not apply to ``held``, is malformed, or the result's
        checksum differs from the header's.
    strategies.wire.model_layout.PackedModelError
        When a dense snapshot is not a valid packed model.
    """
    reference = (Reference.of(unpack_model(arrays), header.version) if header.dense
                 else _advance(arrays, header, held))
    if reference.checksum() != header.checksum:
        raise DownlinkSyncError(f"downlink version {header.version}: the reconstructed model's "
                                f"checksum differs from the server's ({header.checksum[:12]}): "
                                "it needs a dense snapshot")
    return reference

