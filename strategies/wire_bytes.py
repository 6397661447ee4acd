"""Bytes a Flower record really puts on the wire.

Flower 1.4x sends a message as a tree of content-addressed objects (RecordDict
-> ArrayRecord -> Array, ...), each serialised by its ``deflate()``. The size of
a message's content is the sum over that tree; this is what the byte accounting
of the update codecs reports, not an estimate from array shapes.
"""

from __future__ import annotations

from flwr.supercore.inflatable.inflatable_object import InflatableObject

__all__ = ["wire_size"]


def wire_size(obj: InflatableObject) -> int:
    """Serialised size in bytes of ``obj`` and all the objects it references."""
    children = obj.children or {}
    return len(obj.deflate()) + sum(wire_size(child) for child in children.values())
