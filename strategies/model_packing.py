"""The global model as one buffer on the way down: two Flower objects instead of two per tensor.

Flower stores a message's ``ArrayRecord`` as one object per ``Array`` plus one
per ``ArrayChunk`` (at most 5 MB each), and a SuperNode pulls every object from
the SuperLink with its own request. The 2.5D U-Net's 36 tensors are 72 pulls
(0.1-0.2 s each on a loaded 2-core machine, 7-12 s a message; see
``bench/site_overhead.py``). :func:`pack_arrays` lays the tensors end to end in
one ``uint8`` array with a small JSON layout beside it (name, dtype, shape of
each tensor, in order), so the model costs one pull per 5 MB chunk;
:func:`unpack_arrays` gives the same ``ArrayRecord`` back, bit for bit.

Pure numpy and Flower records: the strategy packs, the ClientApp unpacks.
"""

from __future__ import annotations

import json

import numpy as np
from flwr.app import Array, ArrayRecord

from strategies.errors import SiteError

__all__ = ["LAYOUT_KEY", "MODEL_KEY", "PackedModelError", "pack_arrays", "unpack_arrays"]

MODEL_KEY = "model"
LAYOUT_KEY = "layout"


class PackedModelError(SiteError):
    """The model a site received is not a valid packed model: the site cannot train on it."""


def pack_arrays(arrays: ArrayRecord) -> ArrayRecord:
    """``arrays`` as one ``uint8`` buffer (``model``) and its JSON layout (``layout``)."""
    layout, parts = [], []
    for name, array in arrays.items():
        value = array.numpy()
        layout.append([name, value.dtype.str, list(value.shape)])
        parts.append(np.ravel(value).view(np.uint8))  # ravel: contiguous, 0-d as (1,)
    buffer = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    text = np.frombuffer(json.dumps(layout).encode(), dtype=np.uint8)
    return ArrayRecord({MODEL_KEY: Array(buffer), LAYOUT_KEY: Array(text.copy())})


def unpack_arrays(packed: ArrayRecord) -> ArrayRecord:
    """The ``ArrayRecord`` that :func:`pack_arrays` packed, names and order kept.

    Raises
    ------
    PackedModelError
        When ``packed`` lacks ``model`` or ``layout``, or their sizes disagree.
    """
    if set(packed.keys()) != {MODEL_KEY, LAYOUT_KEY}:
        raise PackedModelError(f"packed model must hold exactly '{MODEL_KEY}' and "
                               f"'{LAYOUT_KEY}', got {sorted(packed.keys())}")
    buffer = packed[MODEL_KEY].numpy()
    try:
        layout = json.loads(packed[LAYOUT_KEY].numpy().tobytes().decode())
        tensors, offset = {}, 0
        for name, dtype_str, shape in layout:
            dtype = np.dtype(dtype_str)
            count = int(np.prod(shape, dtype=np.int64))
            tensors[name] = np.frombuffer(buffer, dtype=dtype, count=count,
                                          offset=offset).reshape(shape).copy()
            offset += count * dtype.itemsize
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise PackedModelError(f"packed model layout does not match its buffer: {exc}") from None
    if offset != buffer.size:
        raise PackedModelError(f"packed model buffer holds {buffer.size} bytes, its layout "
                               f"{offset}")
    return ArrayRecord({name: Array(value) for name, value in tensors.items()})
