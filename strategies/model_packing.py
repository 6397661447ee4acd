"""The packed model's Flower form: a model's ``ArrayRecord`` <-> its arrays by name.

The layout itself (why the model goes down as one buffer, the buffer and its JSON layout,
the update's arrays) is the wire kernel's, :mod:`strategies.wire.model_layout`, pure numpy
so the site reads it without Flower. This is its Flower side, which the kernel may not
import (tests/test_layering.py): :func:`named_arrays` / :func:`record_of` convert between an
``ArrayRecord`` and numpy arrays by name, and :func:`pack_arrays` / :func:`unpack_arrays`
are :func:`~strategies.wire.model_layout.pack_model` /
:func:`~strategies.wire.model_layout.unpack_model` on records, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord

from strategies.wire.model_layout import pack_model, unpack_model

__all__ = ["named_arrays", "pack_arrays", "record_of", "unpack_arrays"]


def named_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """``record``'s arrays as numpy, by name, in order."""
    return {name: array.numpy() for name, array in record.items()}


def record_of(named: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Numpy arrays by name as an ``ArrayRecord``, in order."""
    return ArrayRecord({name: Array(np.asarray(array)) for name, array in named.items()})


def pack_arrays(arrays: ArrayRecord) -> ArrayRecord:
    """``arrays`` as one ``uint8`` buffer (``model``) and its JSON layout (``layout``)."""
    return record_of(pack_model(named_arrays(arrays)))


def unpack_arrays(packed: ArrayRecord) -> ArrayRecord:
    """The ``ArrayRecord`` that :func:`pack_arrays` packed, names and order kept.

    Raises
    ------
    strategies.wire.model_layout.PackedModelError
        When ``packed`` lacks ``model`` or ``layout``, or their sizes disagree.
    """
    return record_of(unpack_model(named_arrays(packed)))
