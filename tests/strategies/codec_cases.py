"""The codec cases the compression tests share: every codec spec, the header size, test vectors."""

from __future__ import annotations

import numpy as np

#: One spec of every codec, and several settings of the parametrised ones.
ALL_SPECS = ["none", "fp16", "topk:0.01", "topk:0.3", "topk:0.9", "randk:0.05", "qsgd:1", "qsgd:4",
             "qsgd:16", "qsgd:127", "qsgd:300", "sign"]
#: Bytes of the common payload header.
HEADER = 7


def vector(d: int, seed: int = 0) -> np.ndarray:
    """A standard-normal float32 vector of size ``d``."""
    return np.random.default_rng(seed).standard_normal(d).astype(np.float32)
