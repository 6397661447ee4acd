"""The global model as one buffer on the way down: two Flower objects instead of two per tensor.

Flower stores a message's ``ArrayRecord`` as one object per ``Array`` plus one
per ``ArrayChunk`` (at most 5 MB each), and a SuperNode pulls every object from
the SuperLink with its own request. The 2.5D U-Net's 36 tensors are 72 pulls
(0.1-0.2 s each on a loaded 2-core machine, 7-12 s a message; see
``bench/site_overhead.py``). :func:`pack_arrays` lays the tensors end to end in
one ``uint8`` array with a small JSON layout beside it
(:func:`strategies.wire.model_buffer.pack_model`), so the model costs one pull per 5 MB
chunk; :func:`unpack_arrays` gives the same ``ArrayRecord`` back, bit for bit.

The Flower side of the packed form: the strategy packs; the site unpacks the
numpy arrays itself (:mod:`strategies.wire.model_buffer`, no Flower).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord

from strategies.wire.model_buffer import (LAYOUT_KEY, MODEL_KEY, PackedModelError, pack_model,
                                          unpack_model)

__all__ = ["LAYOUT_KEY", "MODEL_KEY", "PackedModelError", "named_arrays", "pack_arrays",
           "record_of", "unpack_arrays"]


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
    PackedModelError
        When ``packed`` lacks ``model`` or ``layout``, or their sizes disagree.
    """
    return record_of(unpack_model(named_arrays(packed)))
