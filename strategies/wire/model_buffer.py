"""A model as one ``uint8`` buffer and its JSON layout: the packed form, in pure numpy.

:func:`pack_model` lays named tensors end to end in one ``uint8`` array
(``model``) with a small JSON layout beside it (``layout``: name, dtype and
shape of each tensor, in order); :func:`unpack_model` gives the same tensors
back, bit for bit, names and order kept. The wire form of the global model
(:mod:`strategies.model_packing` wraps it in Flower records), the downlink's
stored reference (:mod:`strategies.wire.downlink_reference`) and a site's last
global model (:mod:`clients.site.last_global`) all use it.

Pure numpy: the site (:mod:`clients.site`) and the strategy import it alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from strategies.wire.errors import SiteError

__all__ = ["LAYOUT_KEY", "MODEL_KEY", "PackedModelError", "pack_model", "unpack_model"]

MODEL_KEY = "model"
LAYOUT_KEY = "layout"


class PackedModelError(SiteError):
    """The model a site received is not a valid packed model: the site cannot train on it."""


def pack_model(named: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``named`` (in order) as one ``uint8`` buffer (``model``) and its JSON layout (``layout``)."""
    layout, parts = [], []
    for name, array in named.items():
        value = np.asarray(array)
        layout.append([name, value.dtype.str, list(value.shape)])
        parts.append(np.ravel(value).view(np.uint8))  # ravel: contiguous, 0-d as (1,)
    buffer = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    text = np.frombuffer(json.dumps(layout).encode(), dtype=np.uint8)
    return {MODEL_KEY: buffer, LAYOUT_KEY: text.copy()}


def unpack_model(packed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The named tensors that :func:`pack_model` packed, names and order kept.

    Raises
    ------
    PackedModelError
        When ``packed`` lacks ``model`` or ``layout``, or their sizes disagree.
    """
    if set(packed.keys()) != {MODEL_KEY, LAYOUT_KEY}:
        raise PackedModelError(f"packed model must hold exactly '{MODEL_KEY}' and "
                               f"'{LAYOUT_KEY}', got {sorted(packed.keys())}")
    buffer = np.asarray(packed[MODEL_KEY])
    try:
        layout = json.loads(np.asarray(packed[LAYOUT_KEY]).tobytes().decode())
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
    return tensors
