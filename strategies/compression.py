"""The update codecs' functional core, kept importable under its historical name.

The codecs live in :mod:`strategies.wire.codecs` (one module per codec, a
registry, bit packing, error feedback; see its docstring for the specs and the
payload format). This facade re-exports what callers use:

- :func:`encode` ``(vec, spec, seed) -> uint8 payload``,
- :func:`decode` ``(payload, spec, size, seed) -> float32 vector``,
- :class:`ErrorFeedback` ``(spec, seed)`` with ``.residual`` and ``.step(delta)``,
- :func:`parse_spec`, :func:`derive_seed`, :func:`flatten`, :func:`unflatten`,
- :class:`CodecError` (a bad spec, a :class:`~strategies.wire.errors.ConfigError`) and
  :class:`PayloadError` (a malformed payload, a :class:`~strategies.wire.errors.ReplyError`).
"""

from __future__ import annotations

# The facade re-exports the package's public names, exactly its ``__all__``.
from strategies.wire.codecs import *  # noqa: F403
from strategies.wire.codecs import __all__  # noqa: F401
