"""The held-out ``test`` split of the sites written from a shared set (:mod:`clients.datagen.shared`).

Which items a site holds out for ``test`` depends on what the source offers,
and never changes which items are in ``train`` and ``val`` more than it must:

* **the source has its own test split** (MedMNIST's ``test_images``:
  ``pneumoniamnist``, ``adrenalmnist3d``): those items are not partitioned;
  each site gets ``max(1, round(test_fraction * n))`` of them (``n`` = its
  train + val items), drawn in turn from one seeded shuffle of the source's
  test split while any remain. The site's train and val items are those of a
  conversion without a test split.
* **the source fixes a validation part from other patients** (``msd-lung``:
  its ``test`` file): a seeded ``test_fraction`` of the site's items, taken
  from its validation items (at least one stays in ``val``), moves to
  ``test``; test, like val, is patient-disjoint from training.
* **otherwise** (``ctpa``): a seeded ``test_fraction`` of the site's items,
  taken from its training items (at least one stays in ``train``), moves to
  ``test``.

The draws use their own random stream (``SeedSequence([seed, TEST_SALT])``),
so the partition and the val split of a seed stay what they were.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TEST_SALT", "HeldOutPool", "move_share", "splits_of", "held_out_rng"]

#: Salt of the test split's random stream.
TEST_SALT = 0x7E57


def held_out_rng(seed: int) -> np.random.Generator:
    """The test split's random stream of conversion seed ``seed``."""
    return np.random.default_rng(np.random.SeedSequence([seed, TEST_SALT]))


def splits_of(is_val: np.ndarray) -> np.ndarray:
    """``"val"`` / ``"train"`` per item of a site (an object array, so ``"test"`` fits)."""
    return np.where(np.asarray(is_val, dtype=bool), "val", "train").astype(object)


def move_share(splits: np.ndarray, source: str, fraction: float,
               rng: np.random.Generator) -> np.ndarray:
    """Move ``round(fraction * len(splits))`` items of split ``source`` to ``test``.

    At least one item stays in ``source`` (nothing moves when it holds fewer
    than two). Returns a new array.
    """
    splits = splits.copy()
    members = np.flatnonzero(splits == source)
    count = min(int(round(fraction * splits.size)), members.size - 1)
    if count > 0:
        splits[rng.choice(members, size=count, replace=False)] = "test"
    return splits


class HeldOutPool:
    """The source's own test items, handed out to the sites in a seeded order.

    Parameters
    ----------
    indices : np.ndarray
        Item indices of the source's test split.
    rng : np.random.Generator
        The shuffle's stream (:func:`held_out_rng`).
    """

    def __init__(self, indices: np.ndarray, rng: np.random.Generator) -> None:
        self._order = rng.permutation(np.asarray(indices, dtype=np.int64))
        self._next = 0

    def take(self, site_items: int, fraction: float) -> np.ndarray:
        """The next ``max(1, round(fraction * site_items))`` items (fewer when the pool runs out;
        none for ``fraction`` 0)."""
        if fraction <= 0:
            return np.zeros(0, dtype=np.int64)
        count = max(1, int(round(fraction * site_items)))
        taken = self._order[self._next:self._next + count]
        self._next += taken.size
        return np.sort(taken)
