"""Split learning's network as both ends build it, and the names its parts and batches travel under.

Site and coordinator build the task's network (:meth:`SiteTask.model_for_run` with the
run config's sizes) and cut it the same way (:func:`cut_task_network`:
``vertical.cut`` blocks at the site; for ``splitnn-u`` the last ``vertical.head-layers``
blocks too). The site's part (``bottom``, and ``head`` when U-shaped) travels as
``part/<state-dict name>`` arrays; one message's batches as ``activation-<j>``,
``gradient-<j>``, ``label-<j>`` and ``output-<j>``; an evaluation split's as
``activation-<split>`` and ``output-<split>``. Every activation and gradient is float32.
No Flower: :mod:`clients.vertical.split_site` and :mod:`app.vertical.split_flow` share it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from models.split_network import SplitNetwork, split_network
from strategies.wire.errors import ConfigError, FedMedError, SiteError
from strategies.wire.vertical_options import VerticalOptions

__all__ = ["PART", "U_SHAPED", "batch_key", "cut_task_network", "load_part", "part_arrays",
           "tensor_of"]

#: Prefix of the site part's arrays.
PART = "part/"
#: The method whose last blocks (and labels) stay at the site.
U_SHAPED = "splitnn-u"


def batch_key(kind: str, index: int | str) -> str:
    """The array name of batch (or evaluation split) ``index`` of kind ``activation`` /
    ``gradient`` / ``label`` / ``output``."""
    return f"{kind}-{index}"


def cut_task_network(model: nn.Module, options: VerticalOptions) -> SplitNetwork:
    """``model`` cut as ``vertical.cut`` / ``vertical.head-layers`` say (heads only for
    ``splitnn-u``; the vanilla SplitNN's coordinator finishes the pass).

    Raises
    ------
    ConfigError
        A cut out of this network's range, naming the key and the range.
    """
    head_layers = options.head_layers if options.method == U_SHAPED else 0
    try:
        return split_network(model, options.cut, head_layers)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def part_arrays(part: nn.Module) -> dict[str, np.ndarray]:
    """The part's state (weights and normalisation buffers) as ``part/<name>`` arrays."""
    return {PART + name: value.detach().cpu().numpy().copy()
            for name, value in part.state_dict().items()}


def load_part(part: nn.Module, arrays: Mapping[str, np.ndarray]) -> bool:
    """Load the ``part/<name>`` arrays into ``part``; ``False`` when there are none.

    Raises
    ------
    SiteError
        The arrays are not exactly the part's tensors (a name missing or unknown, a
        shape that differs).
    """
    received = {name[len(PART):]: a for name, a in arrays.items() if name.startswith(PART)}
    if not received:
        return False
    state = part.state_dict()
    misfits = sorted(set(received) ^ set(state)) or [
        f"{k} {tuple(received[k].shape)} for {tuple(v.shape)}" for k, v in state.items()
        if np.size(received[k]) != v.numel()]  # a 0-d counter may come back as shape (1,)
    if misfits:
        raise SiteError(f"split learning: the received site part does not fit this site's "
                        f"network (cut, head layers or task sizes differ): {misfits[:4]}")
    part.load_state_dict({k: torch.from_numpy(np.array(a, dtype=state[k].cpu().numpy().dtype)
                                              .reshape(tuple(state[k].shape)))
                          for k, a in received.items()})
    return True


def tensor_of(arrays: Mapping[str, np.ndarray], name: str,
              error: type[FedMedError] = SiteError) -> torch.Tensor:
    """Array ``name`` as a float32 tensor.

    Raises
    ------
    FedMedError
        ``error`` (a :class:`SiteError` at the site, a :class:`ReplyError` at the
        coordinator) if the message has no array ``name`` or it is not finite.
    """
    if name not in arrays:
        raise error(f"split learning: the message has no array {name!r}")
    tensor = torch.from_numpy(np.array(arrays[name], dtype=np.float32))
    if not torch.isfinite(tensor).all():
        raise error(f"split learning: array {name!r} is not finite")
    return tensor
