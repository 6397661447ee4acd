r"""Downlink compression with the server's own error feedback (double compression).

The book's chapter 3, eq. 3.9: the aggregator compresses the aggregated update
again before sending it down and accumulates its own compression error
("compress and accumulate error at both the parties and the aggregator"). With
the server's global model :math:`x_t`, its true step :math:`u_t = x_t - x_{t-1}`
and the server residual :math:`e` (EF-SGD, Karimireddy et al. 2019,
:class:`~strategies.compression.ErrorFeedback`):

.. math:: z_t = e_{t-1} + u_t, \quad p_t = C(z_t), \quad
          e_t = z_t - \hat d_t, \quad \hat x_t = \hat x_{t-1} + \hat d_t ,

with :math:`\hat d_t = \mathrm{decode}(p_t)`. Every in-sync site holds the one
reference :math:`\hat x` (:class:`~strategies.wire.downlink_reference.Reference`) and
trains from it; the invariant :math:`\sum_t \hat d_t + e_T = \sum_t u_t`, i.e.
:math:`\hat x_T + e_T = x_T`, keeps the reference within the residual of the
global model.

Which sites get what: the server remembers, per node, the reference version the
node acknowledged in its last accepted train reply (``downlink-version``). A
node that holds the current version gets the compressed step (``payload`` +
``raw``); any other (new, restarted, not selected last time, out of sync, its
reply lost) gets a dense snapshot of the *new reference* and is counted in
``downlink-dense``. When no selected node holds the current version, the
reference restarts from the global model itself and the residual from zero (so
the first round, and the first after a server restart, send :math:`x_t` exactly).

The downlink takes ``none`` (today's dense downlink, no protocol), ``fp16`` and
``topk``: with these every coordinate of the reference is (up to fp16
rounding of the step) one of the global model's past values, so a normalisation
layer's running variance stays positive; the unbiased or quantising codecs
(``randk``, ``qsgd``, ``sign``) could make it negative at the sites, and are refused.

The sites' statistics updates are relative to :math:`\hat x`, not :math:`x`: the server
rebases them onto :math:`x` (:meth:`~strategies.downlink_feature.DownlinkFeature.trained_from`,
:mod:`strategies.rounds.normalisation_statistics`, rule A). Without that, a variance the
step left stale at the sites was moved again every round, below 0 (issue 50's NaN).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord

from strategies.compression import ErrorFeedback, decode, parse_spec
from strategies.rounds.instructions import named_arrays, record_of
from strategies.wire import message_keys as keys
from strategies.wire.codecs.registry import UpdateCodec
from strategies.wire.downlink_header import DownlinkHeader, PAYLOAD_KEY, RAW_KEY
from strategies.wire.downlink_reference import Reference, raw_bytes
from strategies.wire.errors import ConfigError
from strategies.wire.model_layout import pack_model
from strategies.wire.registry import Registry
from strategies.wire.seeds import derive_seed
from strategies.wire.model_layout import dense_bytes

__all__ = ["DOWNLINK_CODECS", "DownlinkCodecError", "DownlinkRound", "ServerDownlink",
           "check_downlink_codec"]


class DownlinkCodecError(ConfigError):
    """Run config ``strategy.downlink-codec`` names a codec the downlink does not take."""


#: The codecs the downlink takes (see the module docstring for why not the others), by
#: dotted path to their :data:`~strategies.wire.codecs.registry.CODECS` entry.
DOWNLINK_CODECS: Registry[UpdateCodec] = Registry("downlink codec", "strategy.downlink-codec",
                                                  error=DownlinkCodecError)
DOWNLINK_CODECS.add_path("none", "strategies.wire.codecs.identity:CODEC")
DOWNLINK_CODECS.add_path("fp16", "strategies.wire.codecs.fp16:CODEC")
DOWNLINK_CODECS.add_path("topk", "strategies.wire.codecs.topk:CODEC")


def check_downlink_codec(spec: str) -> str:
    """The canonical spec of a downlink codec.

    Raises
    ------
    DownlinkCodecError
        For a codec not in :data:`DOWNLINK_CODECS`.
    strategies.compression.CodecError
        For a spec that does not parse.
    """
    parsed = parse_spec(spec)
    if parsed.name not in DOWNLINK_CODECS:
        raise DownlinkCodecError(
            f"run config 'strategy.downlink-codec' = {spec!r}: the downlink takes "
            f"{', '.join(DOWNLINK_CODECS)} (a {parsed.name} step can make a site's "
            "normalisation statistics invalid)")
    return str(parsed)


@dataclass(frozen=True)
class DownlinkRound:
    """One round's downlink: the ``arrays`` and the header each selected node gets."""

    arrays: dict[int, ArrayRecord]
    headers: dict[int, DownlinkHeader]

    @property
    def dense(self) -> int:
        """How many nodes get a dense snapshot this round."""
        return sum(header.dense for header in self.headers.values())


def _same_layout(a: Reference, b: Reference) -> bool:
    return a.names == b.names and all(
        x.dtype == y.dtype and x.shape == y.shape for x, y in zip(a.arrays, b.arrays))


class ServerDownlink:
    """The server's reference, residual and what each node acknowledged.

    Parameters
    ----------
    spec : str
        Downlink codec spec (run config ``strategy.downlink-codec``); ``none``
        leaves the downlink dense (:attr:`active` is false).
    seed : int
        Base of the per-round codec seed (:func:`~strategies.wire.seeds.derive_seed`).

    Attributes
    ----------
    reference : Reference or None
        :math:`\\hat x`, the model in-sync sites hold (``None`` before the first round).
    feedback : ErrorFeedback
        The server residual :math:`e`.
    held : dict[int, int]
        Per node, the reference version its last accepted train reply acknowledged.
    active : bool
        Whether the downlink is compressed (a codec other than ``none``); a dense
        downlink's round never enters this class.
    """

    def __init__(self, spec: str = "none", seed: int = 0) -> None:
        self.spec = check_downlink_codec(spec)
        self.active = parse_spec(self.spec).name != "none"
        self.seed = int(seed)
        self.feedback = ErrorFeedback(self.spec)
        self.reference: Reference | None = None
        self.held: dict[int, int] = {}
        self.last = DownlinkRound({}, {})
        self._global = np.zeros(0, np.float32)

    def prepare(self, server_round: int, arrays: ArrayRecord,
                node_ids: Sequence[int]) -> DownlinkRound:
        """Advance the reference to ``arrays`` (the global model) and address each node.

        Raises
        ------
        ValueError
            When ``server_round`` < 1 (version 0 marks a dense snapshot).
        """
        if server_round < 1:
            raise ValueError(f"downlink versions are server rounds >= 1, got {server_round}")
        current = Reference.of(named_arrays(arrays), server_round)
        old = self.reference
        synced = [] if old is None or not _same_layout(old, current) else [
            n for n in node_ids if self.held.get(n) == old.version]
        compressed, seed = None, 0
        if not synced:  # nobody can use a step: restart from the global model itself
            self.reference, self._global = current, current.vector()
            self.feedback.reset()
        else:
            vector, seed = current.vector(), derive_seed(self.seed, server_round)
            segments = current.segments()
            payload = self.feedback.step(vector - self._global, seed=seed, segments=segments)
            step = decode(payload, self.spec, vector.size, seed=seed, segments=segments)
            raw = raw_bytes(current.arrays)
            self.reference = old.advanced(step, raw, server_round)
            self._global = vector
            compressed = ArrayRecord({PAYLOAD_KEY: Array(payload), RAW_KEY: Array(raw)})
        dense = (record_of(pack_model(self.reference.named())) if len(synced) < len(node_ids)
                 else None)
        checksum = self.reference.checksum()
        records, headers = {}, {}
        for node in node_ids:
            base = old.version if node in synced else 0
            records[node] = compressed if base else dense
            headers[node] = DownlinkHeader(self.spec, server_round, base, checksum,
                                           seed if base else 0)
        self.last = DownlinkRound(records, headers)
        return self.last

    def acknowledge(self, node_id: int, version: float | None) -> None:
        """Record the version a node's accepted train reply says it holds (``None``: none)."""
        if self.reference is not None and version == self.reference.version:
            self.held[node_id] = self.reference.version
        else:
            self.held.pop(node_id, None)

    def observe(self, accepted: Sequence, down: Mapping[int, int]) -> dict[str, float]:
        """Acknowledge the accepted train replies; the round's downlink metrics.

        Each reply's ``downlink-version`` goes to :meth:`acknowledge`. Returns
        ``downlink-dense`` (dense snapshots sent this round, their bytes are in
        ``down``) and ``downlink-ratio`` (the model as dense float32 times the
        nodes addressed, over the bytes of their instructions ``down``); nothing
        when the downlink is not active, so a dense run's metrics stay as they were.
        """
        if not self.active or self.reference is None:
            return {}
        for reply in accepted:
            self.acknowledge(reply.node_id, reply.metrics.get(keys.DOWNLINK_VERSION))
        sent = sum(down.get(node, 0) for node in self.last.headers)
        dense = dense_bytes(self.reference.arrays) * len(self.last.headers)
        return {"downlink-dense": float(self.last.dense),
                "downlink-ratio": dense / max(sent, 1)}
