"""The error of the local-process tooling."""

from __future__ import annotations

from strategies.wire.errors import FederationError

__all__ = ["FlowerProcessError"]


class FlowerProcessError(FederationError):
    """A Flower process failed to start, or a run did not complete."""
