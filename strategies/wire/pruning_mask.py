"""The pruning mask: which coordinates of the model are kept, on the wire and in the arrays.

A *mask* is ``{array name: bool array of the array's full shape}`` (True = kept)
over the *covered* arrays, those that have prunable units; an array not in the
mask is kept whole. The global model always has its full shapes, with zeros at
pruned coordinates (:func:`apply_mask`). On the wire a covered array travels
*compacted*, its kept values only (:func:`compact`, :func:`expand`), and the mask
itself as two uint8 arrays (:func:`mask_record`, :func:`masks_from_record`): the
bits of every mask concatenated in order (``np.packbits``) and the layout, UTF-8
JSON ``[[name, shape], ...]``.

Pure numpy: the site side (``clients``) imports this module too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from strategies.wire.errors import ConfigError

__all__ = ["MASK_BITS_KEY", "MASK_LAYOUT_KEY", "PruningError", "apply_mask", "compact",
           "density", "expand", "kept_count", "mask_record", "masks_from_record"]

#: Record entry holding ``np.packbits`` of the masks concatenated in layout order.
MASK_BITS_KEY = "pruning-bits"
#: Record entry holding the masks' layout, UTF-8 JSON ``[[name, shape], ...]``.
MASK_LAYOUT_KEY = "pruning-layout"

Masks = Mapping[str, np.ndarray]


class PruningError(ConfigError):
    """A pruning option, structure or mask that does not fit the model (names the key or array)."""


def _mask_of(masks: Masks, name: str, shape: tuple[int, ...]) -> np.ndarray:
    mask = masks[name]
    if mask.shape != tuple(shape):
        raise PruningError(f"pruning mask of array '{name}' has shape {mask.shape}, "
                           f"the array {tuple(shape)}")
    return mask


def compact(named: Mapping[str, np.ndarray], masks: Masks) -> dict[str, np.ndarray]:
    """The arrays as sent: a covered array becomes its kept values, 1-D in C order (``a[m]``).

    Raises
    ------
    PruningError
        If a mask's shape differs from its array's.
    """
    return {name: a[_mask_of(masks, name, a.shape)] if name in masks else a
            for name, a in named.items()}


def expand(compacted: Mapping[str, np.ndarray], masks: Masks) -> dict[str, np.ndarray]:
    """The inverse of :func:`compact`: full shapes, zeros at pruned coordinates.

    A covered array keeps the dtype of its compacted values and takes its mask's shape.

    Raises
    ------
    PruningError
        If a compacted array's size is not its mask's number of kept coordinates.
    """
    out = {}
    for name, values in compacted.items():
        if name not in masks:
            out[name] = values
            continue
        mask = masks[name]
        kept = int(np.count_nonzero(mask))
        if values.size != kept:
            raise PruningError(f"compacted array '{name}' has {values.size} values, its "
                               f"pruning mask keeps {kept}")
        full = np.zeros(mask.shape, dtype=values.dtype)
        full[mask] = values.ravel()
        out[name] = full
    return out


def apply_mask(named: Mapping[str, np.ndarray], masks: Masks) -> dict[str, np.ndarray]:
    """The arrays in full shapes with their pruned coordinates set to 0 (copies where masked)."""
    return {name: np.where(_mask_of(masks, name, a.shape), a, np.zeros((), a.dtype))
            if name in masks else a for name, a in named.items()}


def mask_record(masks: Masks) -> dict[str, np.ndarray]:
    """The mask on the wire: ``{MASK_BITS_KEY: packed bits, MASK_LAYOUT_KEY: JSON layout}``."""
    layout = [[name, [int(n) for n in mask.shape]] for name, mask in masks.items()]
    bits = (np.concatenate([np.asarray(m, bool).ravel() for m in masks.values()])
            if masks else np.zeros(0, bool))
    text = json.dumps(layout, separators=(",", ":")).encode("utf-8")
    return {MASK_BITS_KEY: np.packbits(bits), MASK_LAYOUT_KEY: np.frombuffer(text, np.uint8)}


def _layout(record: Mapping[str, np.ndarray]) -> list[tuple[str, tuple[int, ...]]]:
    raw = record[MASK_LAYOUT_KEY]
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise PruningError(f"pruning record entry '{MASK_LAYOUT_KEY}' must be 1-D uint8")
    try:
        layout = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise PruningError(f"pruning record entry '{MASK_LAYOUT_KEY}' is no JSON ({exc})") from exc
    entries = []
    for entry in layout if isinstance(layout, list) else [None]:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], list)
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                        for n in entry[1])):
            raise PruningError(f"pruning record entry '{MASK_LAYOUT_KEY}' must be a list of "
                               f"[name, shape] pairs, got {entry!r}")
        entries.append((entry[0], tuple(entry[1])))
    if len({name for name, _ in entries}) != len(entries):
        raise PruningError(f"pruning record entry '{MASK_LAYOUT_KEY}' names an array twice")
    return entries


def masks_from_record(record: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of :func:`mask_record`.

    Raises
    ------
    PruningError
        If an entry is missing, of the wrong dtype, not valid JSON [[name, shape], ...],
        or the bits do not match the layout's number of coordinates.
    """
    missing = [k for k in (MASK_BITS_KEY, MASK_LAYOUT_KEY) if k not in record]
    if missing:
        raise PruningError(f"pruning record lacks entry '{missing[0]}'")
    layout = _layout(record)
    packed = record[MASK_BITS_KEY]
    if packed.dtype != np.uint8 or packed.ndim != 1:
        raise PruningError(f"pruning record entry '{MASK_BITS_KEY}' must be 1-D uint8")
    sizes = [int(np.prod(shape)) for _, shape in layout]
    total = sum(sizes)
    if packed.size != (total + 7) // 8:
        raise PruningError(f"pruning record entry '{MASK_BITS_KEY}' has {packed.size} bytes, "
                           f"the layout's {total} coordinates need {(total + 7) // 8}")
    bits = np.unpackbits(packed, count=total).astype(bool)
    ends = np.cumsum(sizes)
    return {name: bits[end - size:end].reshape(shape)
            for (name, shape), size, end in zip(layout, sizes, ends)}


def kept_count(named: Mapping[str, np.ndarray | tuple[int, ...]], masks: Masks) -> int:
    """Coordinates sent: the kept ones of the covered arrays and all of the others.

    ``named`` maps each array name to the array or to its shape.
    """
    total = 0
    for name, item in named.items():
        shape = item.shape if isinstance(item, np.ndarray) else tuple(item)
        total += (int(np.count_nonzero(_mask_of(masks, name, shape))) if name in masks
                  else int(np.prod(shape)))
    return total


def density(masks: Masks) -> float:
    """Kept fraction of the covered coordinates (1.0 when nothing is covered)."""
    size = sum(m.size for m in masks.values())
    return float(sum(int(np.count_nonzero(m)) for m in masks.values()) / size) if size else 1.0
