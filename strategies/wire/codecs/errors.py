"""The codec's two errors, each on one branch of :mod:`strategies.wire.errors`.

A bad spec, seed, size or input vector is the caller's configuration
(:class:`CodecError`, a :class:`~strategies.wire.errors.ConfigError`); a malformed
payload is a site's reply the server drops (:class:`PayloadError`, a
:class:`~strategies.wire.errors.ReplyError`). Both are ``ValueError``.
"""

from __future__ import annotations

from strategies.wire.errors import ConfigError, ReplyError

__all__ = ["CodecError", "PayloadError"]


class CodecError(ConfigError):
    """Raised for an invalid codec spec, seed, size or input vector."""


class PayloadError(ReplyError):
    """Raised when a payload is malformed or does not match the spec/size."""
