"""What a compressed-downlink train instruction says about the model it carries.

A train instruction of a run with a downlink codec carries, in its config,
``downlink-codec``, ``downlink-version`` (the reference version the site holds
after this message), ``downlink-base`` (0: ``arrays`` is a dense snapshot, the
packed model of :func:`strategies.rounds.instructions.pack_arrays`; otherwise the version the
compressed step applies to), ``downlink-checksum`` (SHA-256 of the reference
after it, :meth:`strategies.wire.downlink_reference.Reference.checksum`) and
``downlink-seed`` (the codec seed of the step). A compressed step's ``arrays``
holds two ``uint8`` arrays: ``payload`` (the codec payload of the floating-point
step) and ``raw`` (the integer arrays' new values,
:func:`strategies.wire.downlink_reference.raw_bytes`).

An instruction without these keys is today's dense downlink, read as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from strategies.wire import message_keys as keys
from strategies.wire.model_layout import PAYLOAD_KEY

__all__ = ["PAYLOAD_KEY", "RAW_KEY", "DownlinkHeader"]

RAW_KEY = "raw"


@dataclass(frozen=True)
class DownlinkHeader:
    """The downlink entries of one train instruction (see the module docstring)."""

    #: Canonical downlink codec spec.
    codec: str
    #: Version of the reference after this message (the server round).
    version: int
    #: 0 for a dense snapshot; else the version the compressed step applies to.
    base: int
    #: SHA-256 (hex) of the reference after this message.
    checksum: str
    #: Codec seed of the step.
    seed: int = 0

    @property
    def dense(self) -> bool:
        """Whether the message carries a dense snapshot."""
        return self.base == 0

    def settings(self) -> dict:
        """The entries of a train instruction's config."""
        return {keys.DOWNLINK_CODEC: self.codec, keys.DOWNLINK_VERSION: self.version,
                keys.DOWNLINK_BASE: self.base, keys.DOWNLINK_CHECKSUM: self.checksum,
                keys.DOWNLINK_SEED: self.seed}

    @classmethod
    def from_config(cls, config: Mapping) -> DownlinkHeader | None:
        """The header in a train instruction's ``config``; ``None`` for a dense downlink run."""
        if keys.DOWNLINK_VERSION not in config:
            return None
        return cls(codec=str(config[keys.DOWNLINK_CODEC]),
                   version=int(config[keys.DOWNLINK_VERSION]),
                   base=int(config[keys.DOWNLINK_BASE]),
                   checksum=str(config[keys.DOWNLINK_CHECKSUM]),
                   seed=int(config[keys.DOWNLINK_SEED]))
