"""A site's side of split learning between two messages: its part, its optimisers, its open batches.

In deployment every message may be served by a fresh process, so nothing of a split
federation lives in memory between two stages: :func:`open_state` rebuilds the site's
part of the network (:func:`~clients.vertical.split_model.cut_task_network`) and
loads, from ``<state_dir>/split-site.safetensors`` (weights only, never a pickle), its
weights and normalisation buffers, the state of one optimiser per part (``bottom``,
and the U-shaped ``head``) and the batches whose activations were sent and whose
gradients have not come back yet (their training-set indices and their forward seeds,
so that the forward pass can be recomputed exactly). :func:`save_state` writes it
back atomically. A site part received from the coordinator (the start of a site's
turn, or the averaged part after a round) replaces the file's and starts fresh
optimiser state, as a FedAvg site starts each round's local optimiser afresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import nn

from clients.site.atomic_file import write_atomic
from clients.training.site_task import make_optimizer
from clients.vertical.split_model import PART, cut_task_network, load_part
from clients.vertical.stages import VerticalRequest
from models.split_network import SplitNetwork
from strategies.wire.errors import SiteError

__all__ = ["OPTIMISER", "STATE_FILE", "SplitSiteState", "load_optimisers", "open_state",
           "optimiser_tensors", "save_state"]

#: The site's split-learning state, in its vertical state folder.
STATE_FILE = "split-site.safetensors"
OPTIMISER = "optimiser/"
_PENDING = "pending-indices"
_SEEDS = "pending-seeds"


@dataclass
class SplitSiteState:
    """The site's part of the network, its optimisers and the batches awaiting gradients.

    Attributes
    ----------
    split : SplitNetwork
        The task's network cut; only :meth:`SplitNetwork.site_part` is the site's.
    optimisers : dict
        Part name (``bottom``, ``head``) -> its optimiser (the run config's ``optimizer``,
        ``lr``, ``momentum``).
    pending : numpy.ndarray
        ``(batches, batch size)`` training-set indices of the batches sent, not yet
        back-propagated (``(0, 0)``: none).
    seeds : numpy.ndarray
        The torch seed of each pending batch's forward pass.
    """

    split: SplitNetwork
    optimisers: dict[str, torch.optim.Optimizer]
    pending: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    seeds: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def part(self) -> nn.ModuleDict:
        """The site's blocks by part name."""
        return self.split.site_part()


def _optimisers(part: nn.ModuleDict, request: VerticalRequest) -> dict[str, torch.optim.Optimizer]:
    site = request.site
    return {name: make_optimizer(site.optimizer, module.parameters(), site.lr, site.momentum)
            for name, module in part.items()}


def optimiser_tensors(optimisers: Mapping[str, torch.optim.Optimizer]) -> dict[str, torch.Tensor]:
    """Every tensor of the optimisers' per-parameter state, as ``optimiser/<part>/<i>/<name>``."""
    tensors = {}
    for part, optimiser in optimisers.items():
        for index, values in optimiser.state_dict()["state"].items():
            tensors.update({f"{OPTIMISER}{part}/{index}/{name}": value.detach().cpu()
                            for name, value in values.items() if isinstance(value, torch.Tensor)})
    return tensors


def load_optimisers(optimisers: Mapping[str, torch.optim.Optimizer],
                    tensors: Mapping[str, torch.Tensor]) -> None:
    """Put :func:`optimiser_tensors`' tensors back into ``optimisers`` (by part name)."""
    for part, optimiser in optimisers.items():
        state: dict[int, dict[str, torch.Tensor]] = {}
        prefix = f"{OPTIMISER}{part}/"
        for key, value in tensors.items():
            if key.startswith(prefix):
                index, name = key[len(prefix):].split("/", 1)
                state.setdefault(int(index), {})[name] = value
        optimiser.load_state_dict({"state": state,
                                   "param_groups": optimiser.state_dict()["param_groups"]})


def open_state(request: VerticalRequest) -> SplitSiteState:
    """The site's split state for ``request``: the received part if the message has one
    (fresh optimisers, no pending batch), else the state folder's.

    Raises
    ------
    ConfigError
        The run config's cut does not fit the task's network.
    SiteError
        The message has no part and the site keeps none (a site restarted without its
        state folder, or a stage out of order), or the received part does not fit.
    """
    site = request.site
    split = cut_task_network(site.task().build_model(), request.options)
    part = split.site_part().to(site.compute.device)
    optimisers = _optimisers(part, request)
    state = SplitSiteState(split, optimisers)
    if not load_part(part, request.arrays):
        path = site.state_dir / STATE_FILE
        if not path.is_file():
            raise SiteError(f"split learning: {site.name} holds no site part for this federation "
                            f"(stage {request.stage!r} before the coordinator sent one)")
        tensors = load_tensors(path.read_bytes())
        part.load_state_dict({name[len(PART):]: value for name, value in tensors.items()
                              if name.startswith(PART)})
        load_optimisers(optimisers, tensors)
        state.pending, state.seeds = tensors[_PENDING].numpy(), tensors[_SEEDS].numpy()
    return state


def save_state(request: VerticalRequest, state: SplitSiteState) -> None:
    """Write ``state`` to the site's state folder (atomically)."""
    tensors = {PART + name: value.detach().cpu().contiguous()
               for name, value in state.part.state_dict().items()}
    tensors.update(optimiser_tensors(state.optimisers))
    tensors[_PENDING] = torch.from_numpy(np.ascontiguousarray(state.pending, np.int64))
    tensors[_SEEDS] = torch.from_numpy(np.ascontiguousarray(state.seeds, np.int64))
    payload = save_tensors(tensors)
    write_atomic(request.site.state_dir / STATE_FILE, lambda handle: handle.write(payload))
