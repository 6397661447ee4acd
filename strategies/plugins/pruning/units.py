"""The units a pruning structure prunes as one, and their sums over the model's arrays.

The structure (JSON-able, made on the torch side by ``clients.training.pruning``) lists
groups. An *unstructured* group, ``{"name", "array"}``, makes every element of one
array a unit. A *structured* group, ``{"name", "slices": [{"array", "axis",
"indices"}, ...]}``, is one torch-pruning dependency group: its unit ``k`` is, for
every slice, the index ``indices[k]`` along ``axis`` of ``array`` (an output channel
with its bias, its norm layer's parameters and the next layer's input channel).

The covered arrays are those a group names; a covered coordinate is kept iff every
unit covering it is kept (:meth:`Units.masks`); a unit counts as kept iff some of its
coordinates is (:meth:`Units.kept`: with at least one kept unit per group, a kept
channel keeps the coordinates it shares with the kept channels of other groups).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from strategies.wire.pruning_mask import PruningError

__all__ = ["MODES", "Units", "plain_structure"]

#: The structure modes: one weight or one channel group is a unit.
MODES = ("unstructured", "structured")


@dataclass(frozen=True)
class _Slice:
    """Unit ``k`` covers index ``indices[k]`` along ``axis`` of array ``array``;
    ``axis`` None: unit ``k`` is the array's ``k``-th element (C order)."""

    array: str
    axis: int | None
    indices: np.ndarray

    def per_index(self, values: np.ndarray, reduce: Callable[..., np.ndarray]) -> np.ndarray:
        """``reduce`` of ``values`` (the array's shape) over each unit's coordinates."""
        if self.axis is None:
            return values.ravel()
        moved = np.moveaxis(values, self.axis, 0)
        return reduce(moved.reshape(moved.shape[0], -1), axis=1)[self.indices]

    def mark(self, cover: np.ndarray) -> None:
        """Set, in place, every coordinate this slice's units cover."""
        if self.axis is None:
            cover[...] = True
        else:
            np.moveaxis(cover, self.axis, 0)[self.indices] = True

    def set_pruned(self, mask: np.ndarray, kept: np.ndarray) -> None:
        """Clear, in place, the coordinates of the units not ``kept``."""
        if self.axis is None:
            mask &= kept.reshape(mask.shape)
        else:
            np.moveaxis(mask, self.axis, 0)[self.indices[~kept]] = False


def _fail(group: Any, rule: str) -> PruningError:
    return PruningError(f"pruning structure group {group!r}: {rule}")


def plain_structure(structure: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """A plain copy of ``structure`` (ints, strings, lists), checked against ``mode``.

    Raises
    ------
    PruningError
        If the structure's ``mode`` is not ``mode`` (``pruning.mode``) or a group lacks
        its keys.
    """
    if structure.get("mode") != mode:
        raise PruningError(f"pruning structure of mode {structure.get('mode')!r} does not fit "
                           f"run config key 'pruning.mode' = {mode!r}")
    groups = []
    for group in structure.get("groups", []):
        try:
            if mode == "unstructured":
                groups.append({"name": str(group["name"]), "array": str(group["array"])})
            else:
                groups.append({"name": str(group["name"]), "slices": [
                    {"array": str(s["array"]), "axis": int(s["axis"]),
                     "indices": [int(i) for i in s["indices"]]} for s in group["slices"]]})
        except (KeyError, TypeError, ValueError) as exc:
            raise _fail(group.get("name") if isinstance(group, Mapping) else group,
                        f"malformed ({exc!r})") from exc
    return {"mode": mode, "groups": groups}


def _slices(group: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> list[_Slice]:
    name = group["name"]
    if "array" in group:
        if group["array"] not in shapes:
            raise _fail(name, f"array '{group['array']}' is not in the model")
        return [_Slice(group["array"], None, np.zeros(0, np.int64))]
    slices = []
    for s in group["slices"]:
        shape = shapes.get(s["array"])
        if shape is None:
            raise _fail(name, f"array '{s['array']}' is not in the model")
        indices = np.asarray(s["indices"], np.int64)
        if not 0 <= s["axis"] < len(shape) or np.any((indices < 0) | (indices >= shape[s["axis"]])):
            raise _fail(name, f"axis {s['axis']} / indices out of range of array "
                              f"'{s['array']}' of shape {shape}")
        slices.append(_Slice(s["array"], s["axis"], indices))
    if not slices or len({s.indices.size for s in slices}) != 1 or slices[0].indices.size == 0:
        raise _fail(name, "needs slices with the same, non-zero number of indices")
    return slices


class Units:
    """The units of a structure over a model of the given array shapes.

    Every method answers per group, in the structure's order, one value per unit.

    Parameters
    ----------
    structure : mapping
        A :func:`plain_structure`.
    shapes : mapping
        Array name -> full shape, for every array of the model.

    Raises
    ------
    PruningError
        If a group names an array the model lacks, or an axis or index out of range.
    """

    def __init__(self, structure: Mapping[str, Any],
                 shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self.groups = [_slices(g, self.shapes) for g in structure["groups"]]
        named = {s.array for g in self.groups for s in g}
        #: The covered arrays, in the model's order.
        self.arrays = [name for name in self.shapes if name in named]

    def sizes(self) -> list[int]:
        """Units per group."""
        return [int(np.prod(self.shapes[g[0].array])) if g[0].axis is None
                else g[0].indices.size for g in self.groups]

    def sums(self, arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Per unit, the sum of ``arrays`` (float64) over its coordinates."""
        return [sum(s.per_index(np.asarray(arrays[s.array], np.float64), np.sum) for s in g)
                for g in self.groups]

    def coordinates(self) -> list[np.ndarray]:
        """Per unit, its number of coordinates (its cost in weights)."""
        return self.sums({name: np.ones(self.shapes[name]) for name in self.arrays})

    def magnitudes(self, named: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Per unit, the root-mean-square of its weights (``|w|`` for a single weight)."""
        squares = {name: np.square(np.asarray(named[name], np.float64)) for name in self.arrays}
        return [np.sqrt(total / count)
                for total, count in zip(self.sums(squares), self.coordinates())]

    def covered(self) -> dict[str, np.ndarray]:
        """Per covered array, which of its coordinates some unit covers."""
        cover = {name: np.zeros(self.shapes[name], bool) for name in self.arrays}
        for g in self.groups:
            for s in g:
                s.mark(cover[s.array])
        return cover

    def masks(self, kept: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """The mask of the covered arrays where the units ``kept`` (bool, per group) are kept."""
        masks = {name: np.ones(self.shapes[name], bool) for name in self.arrays}
        for g, keep in zip(self.groups, kept):
            for s in g:
                s.set_pruned(masks[s.array], np.asarray(keep, bool))
        return masks

    def kept(self, masks: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Per unit, whether ``masks`` keeps some of its coordinates (arrays not in it: all)."""
        return [np.logical_or.reduce([s.per_index(masks[s.array], np.any) if s.array in masks
                                      else np.ones(n, bool) for s in g])
                for g, n in zip(self.groups, self.sizes())]
