"""A torch model's weights as a list of numpy arrays and back (``state_dict`` order).

The benchmarks run federated averaging in-process on numpy arrays, as the
strategy does on the wire format; these two functions are the bridge.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["state_arrays", "load_arrays"]


def state_arrays(model: nn.Module) -> list[np.ndarray]:
    """The model's ``state_dict`` as numpy copies, in order."""
    return [v.detach().cpu().numpy().copy() for v in model.state_dict().values()]


def load_arrays(model: nn.Module, arrays: Sequence[np.ndarray]) -> None:
    """Load numpy arrays (``state_dict`` order) into ``model``.

    Raises
    ------
    ValueError
        If the number of arrays differs from the number of ``state_dict`` entries.
    """
    keys = list(model.state_dict().keys())
    if len(keys) != len(arrays):
        raise ValueError(f"{len(arrays)} arrays for a state_dict of {len(keys)} entries")
    model.load_state_dict({k: torch.from_numpy(np.array(a, copy=True))
                           for k, a in zip(keys, arrays)})
