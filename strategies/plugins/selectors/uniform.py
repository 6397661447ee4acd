"""Uniform client selection: m of the available sites without replacement, seeded.

FedAvg's client sampling (McMahan et al., "Communication-Efficient Learning of
Deep Networks from Decentralized Data", AISTATS 2017): each round draws ``m``
distinct sites uniformly at random (:func:`uniform_sample`). With
``selection.m = 0`` the count is ``ceil(fraction-train x connected)``, as in
Flower's FedAvg; ``min-nodes`` is how many sites the round waits for, not how
many train.

The checks of a selector's inputs (:class:`SelectionError`; a count in range,
distinct sites, a numpy ``Generator``) live here and are shared with
Power-of-Choice's draw (:mod:`strategies.plugins.selectors.power_of_choice`), so
that a default round enters this one file to select. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from numbers import Integral
from typing import TypeVar

import numpy as np

from strategies.plugins.registries import SELECTORS
from strategies.plugins.run_settings import RunSettings
from strategies.plugins.selectors.options import SelectionOptions
from strategies.wire.errors import ConfigError
from strategies.wire.plugin_options import Plugin

__all__ = ["SelectionError", "UniformSelector", "check_count", "check_distinct",
           "check_rng", "uniform_sample"]

T = TypeVar("T")


class SelectionError(ConfigError):
    """Raised for invalid inputs to a client selector."""


def check_count(value: object, name: str, available: int) -> int:
    """``value`` as an int in ``1 .. available`` (else :class:`SelectionError` naming ``name``)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise SelectionError(f"{name} must be an int, got {value!r}")
    count = int(value)
    if count < 1:
        raise SelectionError(f"{name} must be >= 1, got {count}")
    if count > available:
        raise SelectionError(f"{name}={count} exceeds the {available} available sites")
    return count


def check_distinct(items: Sequence[object], name: str) -> None:
    """Refuse duplicate (hashable) items with :class:`SelectionError` naming ``name``."""
    if all(isinstance(item, Hashable) for item in items) and len(set(items)) != len(items):
        raise SelectionError(f"{name} contains duplicates: {list(items)!r}")


def check_rng(rng: object) -> np.random.Generator:
    """``rng`` if it is a ``numpy.random.Generator`` (else :class:`SelectionError`)."""
    if not isinstance(rng, np.random.Generator):
        raise SelectionError(
            f"rng must be a numpy.random.Generator, got {type(rng).__name__}"
        )
    return rng


def uniform_sample(sites: Sequence[T], m: int, rng: np.random.Generator) -> list[T]:
    """Draw ``m`` distinct sites uniformly at random (FedAvg's client sampling).

    Parameters
    ----------
    sites : sequence
        Site ids (distinct).
    m : int
        Number of sites, ``1 <= m <= len(sites)``.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    list
        The ``m`` sampled sites, in draw order.

    Raises
    ------
    SelectionError
        On duplicate sites or ``m`` out of range.
    """
    check_distinct(sites, "sites")
    count = check_count(m, "m", len(sites))
    picks = check_rng(rng).choice(len(sites), size=count, replace=False)
    return [sites[int(i)] for i in picks]


@SELECTORS.register("uniform")
class UniformSelector(Plugin):
    """Samples ``m`` sites per round; ``m = 0`` means ``ceil(fraction * N)``."""

    Options = SelectionOptions

    def __init__(self, m: int = 0, fraction: float = 1.0, seed: int = 0) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        self.m, self.fraction = SelectionOptions(m=m).m, fraction
        self._rng = np.random.default_rng(seed)
        self.times_selected: dict[int, int] = {}
        self.last: dict = {}

    @classmethod
    def from_options(cls, options: SelectionOptions, settings: RunSettings) -> UniformSelector:
        """The selector for a run (``selection.m``; ``d``, ``subset``, ... are not used)."""
        return cls(m=options.m, fraction=settings.fraction_train, seed=settings.seed)

    def select(self, server_round: int, nodes: list[int], ctx=None) -> list[int]:
        """The node ids to train this round (sorted)."""
        count = self.m or math.ceil(self.fraction * len(nodes))
        chosen = sorted(int(n) for n in uniform_sample(nodes, min(count, len(nodes)),
                                                       self._rng))
        for node in chosen:
            self.times_selected[node] = self.times_selected.get(node, 0) + 1
        self.last = {"selected": chosen}
        return chosen
