"""A site's side of adaptive pruning: the mask it holds, its pruned training, its squared gradients.

A pruned train instruction (``pruning-version`` > 0, :mod:`strategies.rounds.pruning_round`)
carries the model's covered arrays compacted (kept values only) and, when the site does not
hold that mask version yet, the mask itself. The site

* keeps the mask in its state store (:func:`received_mask`), so later rounds need only the
  version; a site that lost it refuses the round (:class:`MaskVersionError`) and the
  coordinator, seeing no acknowledgement, sends the mask with the next instruction;
* trains with the pruned weights held at zero (:class:`PrunedTraining`): unstructured, the dense
  network with masked gradients and weights
  (:class:`~clients.training.pruning.MaskedTraining`; under DP-SGD the per-sample gradients are
  masked before clipping, so clipping and noise act on the kept weights); structured, the
  smaller network torch-pruning cuts out of it (:func:`~clients.training.pruning.shrink`), so
  the steps really cost less, mapped back to full shapes afterwards;
* sums the squared gradients of every step since its last report (PruneFL's first-order
  estimate of each weight's risk reduction) in its state store and, in a re-pruning round,
  sends them encoded with the round's report codec (:func:`squared_gradient_report`).

In the site's round this is the :class:`SitePruning` feature
(:class:`~clients.site.site_feature.SiteFeature`) of a pruned instruction
(:class:`PruningInstruction`): it expands the received model with the mask, trains the pruned
network, sends the compacted update with its own error-feedback residual per mask version
(``ef-residual-mask-<version>``) and acknowledges the version (``pruning-version``); an
evaluate or query message runs :func:`evaluated_network`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from clients.site.site_feature import LocalTraining, SiteFeature, config_value
from clients.site.site_reply import Metrics
from clients.site.state_store import SiteStateStore
from clients.training.personalisation.site_personalisation import SITE_PERSONALISATION
from clients.training.pruning import MaskedTraining, Shrunk, model_structure, shrink
from clients.training.site_task import SiteTask
from strategies.wire import message_keys as keys
from strategies.wire.codecs import encode
from strategies.wire.errors import SiteError
from strategies.wire.pruning_mask import (MASK_BITS_KEY, MASK_LAYOUT_KEY, compact, expand,
                                          masks_from_record)

if TYPE_CHECKING:
    from clients.site.instruction import Instruction, SiteRunSettings
    from clients.site.site import Site

__all__ = ["MASK_ENTRIES", "MaskVersionError", "PrunedTraining", "PruningInstruction",
           "SitePruning", "StructuralChangeRefused", "evaluated_network", "received_mask",
           "refuse_structural_change", "squared_gradient_report"]

#: The instruction's array entries that carry the mask (not the model).
MASK_ENTRIES = (MASK_BITS_KEY, MASK_LAYOUT_KEY)
_VERSION = "pruning-mask-version"
_SQGRAD = "pruning-sqgrad"


class MaskVersionError(SiteError):
    """The instruction names a pruning mask version the site does not hold."""


class StructuralChangeRefused(SiteError):
    """A structured pruning would remove channels of layers the site keeps as its own."""


def refuse_structural_change(mode: str, keeps_layers: bool) -> None:
    """Refuse a structured round at a site that keeps its own normalisation layers (FedBN):
    removing their channels would break the personalised model it holds.

    Raises
    ------
    StructuralChangeRefused
        Naming the rule (``pruning.mode = structured`` with ``personalisation.method = fedbn``).
    """
    if mode == "structured" and keeps_layers:
        raise StructuralChangeRefused(
            "pruning.mode = 'structured' removes channels of the site's own normalisation "
            "layers (personalisation.method = 'fedbn'); the site refuses the structural change")


def received_mask(entries: Mapping[str, np.ndarray], version: int, federation: str,
                  state_dir: Path) -> dict[str, np.ndarray]:
    """The round's mask: from the instruction's ``entries`` (then saved, version last), or the
    one the site saved for ``version``.

    Raises
    ------
    MaskVersionError
        When the instruction carries no mask and the site holds another version (or none).
    strategies.wire.pruning_mask.PruningError
        When the mask sent is malformed.
    """
    store = SiteStateStore(state_dir)
    if entries:
        masks = masks_from_record(entries)
        for name in MASK_ENTRIES:
            store.save(federation, name, entries[name])
        store.save(federation, _VERSION, np.array([version], np.int64))
        return masks
    held = store.load(federation, _VERSION)
    if held is None or int(held[0]) != version:
        raise MaskVersionError(
            f"pruning mask version {version} is not held at this site (it holds "
            f"{'none' if held is None else int(held[0])}); the next instruction brings it")
    return masks_from_record({name: store.load(federation, name) for name in MASK_ENTRIES})


#: Structures by network (class and state-dict shapes), and the last shrunk networks by network
#: and mask: tracing torch-pruning's dependency graph costs seconds on a large network, and a
#: warm site worker trains the same network under the same mask for ``pruning.interval`` rounds.
_STRUCTURES: dict[tuple, dict] = {}
_SHRUNK: dict[tuple, Shrunk] = {}
_SHRUNK_KEPT = 2


def _layout(model: nn.Module) -> tuple:
    return (type(model).__qualname__,
            tuple((name, tuple(value.shape)) for name, value in model.state_dict().items()))


def _structure(model: nn.Module, mode: str, example_input: torch.Tensor) -> dict:
    """:func:`model_structure`, computed once per network layout and mode in this process."""
    key = (_layout(model), mode)
    if key not in _STRUCTURES:
        _STRUCTURES[key] = model_structure(model, mode, example_input)
    return _STRUCTURES[key]


def _shrunk(model: nn.Module, masks: Mapping[str, np.ndarray],
            example_input: torch.Tensor) -> Shrunk:
    """``model`` without its pruned channels: the network cut once per mask (a few kept in this
    process), this round's weights loaded into it."""
    key = (_layout(model), tuple((name, mask.tobytes()) for name, mask in masks.items()))
    shrunk = _SHRUNK.get(key)
    if shrunk is None:
        shrunk = shrink(model, _structure(model, "structured", example_input), masks,
                        example_input)
        while len(_SHRUNK) >= _SHRUNK_KEPT:
            _SHRUNK.pop(next(iter(_SHRUNK)))
        _SHRUNK[key] = shrunk
    else:
        shrunk.model.load_state_dict(shrunk.small_state(model.state_dict()))
    return shrunk


def evaluated_network(model: nn.Module, masks: Mapping[str, np.ndarray], mode: str,
                      example_input: torch.Tensor) -> nn.Module:
    """The network an evaluate or query message runs: structured, ``model`` without its pruned
    channels (the same function with fewer FLOPs); otherwise ``model`` itself."""
    return _shrunk(model, masks, example_input).model if mode == "structured" else model


class PrunedTraining:
    """The network a pruned round trains, its step hooks and what it hands back.

    Parameters
    ----------
    model : nn.Module
        The dense network holding the received global model (pruned weights 0).
    masks : mapping of str to numpy.ndarray
        The round's mask (array name -> kept coordinates).
    mode : str
        ``unstructured`` (train ``model`` itself, gradients and weights masked) or
        ``structured`` (train the network without the pruned channels).
    example_input : torch.Tensor
        One input batch (torch-pruning traces the network with it).
    """

    def __init__(self, model: nn.Module, masks: Mapping[str, np.ndarray], mode: str,
                 example_input: torch.Tensor) -> None:
        self.dense, self.mode = model, mode
        self.shrunk = None
        if mode == "structured":
            self.shrunk = _shrunk(model, masks, example_input)
            self.model = self.shrunk.model
            self.hooks = MaskedTraining({}, collect=True)
        else:
            self.model = model
            self.hooks = MaskedTraining(masks, collect=True)
            self.hooks.zero_pruned(model)

    def finish(self) -> None:
        """Put the trained weights on the dense network (structured: mapped back, zeros at the
        removed channels; unstructured: already there)."""
        if self.shrunk is not None:
            dense = self.shrunk.dense_state(self.model.state_dict())
            self.dense.load_state_dict({k: torch.as_tensor(v) for k, v in dense.items()})

    def squared_gradients(self) -> dict[str, np.ndarray]:
        """The steps' summed squared gradients by parameter name, in full shapes."""
        squared = self.hooks.squared_gradients()
        if self.shrunk is None:
            return squared
        state = {**self.model.state_dict(),
                 **{name: torch.as_tensor(value) for name, value in squared.items()}}
        full = self.shrunk.dense_state(state)
        return {name: full[name] for name in squared}


def squared_gradient_report(squared: Mapping[str, np.ndarray], order: Mapping[str, np.ndarray],
                            report: str, federation: str, state_dir: Path) -> np.ndarray | None:
    """Add this round's ``squared`` gradients to the site's running sum; in a re-pruning
    round (``report`` = the codec) return the sum encoded and start a new one.

    The sum is one vector over the floating-point arrays of ``order`` (the global model, in
    model order; buffers stay 0), kept in the site's state store between rounds.
    """
    floats = [(name, a) for name, a in order.items() if np.issubdtype(a.dtype, np.floating)]
    vector = np.concatenate([
        np.asarray(squared[name], np.float32).reshape(-1) if name in squared
        else np.zeros(array.size, np.float32) for name, array in floats])
    store = SiteStateStore(state_dir)
    held = store.load(federation, _SQGRAD)
    if held is not None and held.size == vector.size:
        vector = vector + held
    if not report:
        store.save(federation, _SQGRAD, vector)
        return None
    store.save(federation, _SQGRAD, np.zeros(0, np.float32))
    return encode(vector, report)


@dataclass(frozen=True)
class PruningInstruction:
    """The pruning entries of an instruction (:mod:`strategies.rounds.pruning_round`).

    Attributes
    ----------
    pruning_version : int
        The mask version of the instruction's model (``pruning-version``); 0: not pruned.
    pruning_mode : str
        ``unstructured`` or ``structured`` (``pruning-mode``); "" when not pruned.
    pruning_report : str
        The codec of the squared gradients to send back this round (``pruning-report``);
        "" when none are asked.
    """

    KEYS: ClassVar[frozenset[str]] = frozenset({keys.PRUNING_VERSION, keys.PRUNING_MODE,
                                                keys.PRUNING_REPORT})

    pruning_version: int = 0
    pruning_mode: str = ""
    pruning_report: str = ""

    @classmethod
    def from_config(cls, kind: str, config: Mapping[str, Any]) -> PruningInstruction | None:
        """The pruning entries of any kind of message; ``None`` without any.

        Raises
        ------
        ConfigError
            For a value of the wrong type.
        """
        if not any(key in config for key in (keys.PRUNING_VERSION, keys.PRUNING_MODE,
                                             keys.PRUNING_REPORT)):
            return None
        return cls(pruning_version=config_value(config, keys.PRUNING_VERSION, int, 0),
                   pruning_mode=config_value(config, keys.PRUNING_MODE, str, ""),
                   pruning_report=config_value(config, keys.PRUNING_REPORT, str, ""))


class SitePruning(SiteFeature):
    """A pruned message at the site: the mask in, the pruned training, the compacted update out.

    Parameters
    ----------
    part : PruningInstruction
        The instruction's pruning entries (a version > 0).
    federation : str
        The federation the site's mask and squared gradients are kept for.
    state_dir : Path
        The site's state dir.
    keeps_layers : bool
        Whether the run's personalisation keeps the site's own layers (FedBN), which a
        structured round would cut (:func:`refuse_structural_change`).
    """

    def __init__(self, part: PruningInstruction, federation: str, state_dir: Path,
                 keeps_layers: bool) -> None:
        self.part, self.federation, self.state_dir = part, federation, state_dir
        self.keeps_layers = keeps_layers
        self.masks: dict[str, np.ndarray] = {}
        self.pruned: PrunedTraining | None = None
        self.sqgrad: np.ndarray | None = None

    @classmethod
    def of(cls, instruction: Instruction, site: Site, run: SiteRunSettings) -> SitePruning | None:
        """The feature of a message whose model is pruned (``pruning-version`` > 0)."""
        part = instruction.part(PruningInstruction)
        if part is None or not part.pruning_version:
            return None
        method = SITE_PERSONALISATION.get(run.personalisation.method)
        return cls(part, instruction.federation, site.state_dir, method.keeps_layers)

    def receive(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The arrays without the mask's entries; the round's mask (:func:`received_mask`).

        Raises
        ------
        MaskVersionError
            When the site does not hold the mask version the instruction names.
        """
        entries = {k: np.asarray(v) for k, v in arrays.items() if k in MASK_ENTRIES}
        self.masks = received_mask(entries, self.part.pruning_version, self.federation,
                                   self.state_dir)
        return {k: v for k, v in arrays.items() if k not in MASK_ENTRIES}

    def received(self, model: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The compacted model in full shapes, pruned coordinates 0."""
        return expand(model, self.masks)

    def evaluated(self, network: nn.Module, task: SiteTask) -> nn.Module:
        """:func:`evaluated_network`: structured, the network without its pruned channels."""
        return evaluated_network(network, self.masks, self.part.pruning_mode,
                                 torch.as_tensor(task.example_input(task.settings)))

    @contextmanager
    def training(self, local: LocalTraining) -> Iterator[None]:
        """Train the pruned network (:class:`PrunedTraining`), its weights put back after.

        Raises
        ------
        StructuralChangeRefused
            A structured round at a site that keeps its own layers.
        """
        refuse_structural_change(self.part.pruning_mode, self.keeps_layers)
        pruned = PrunedTraining(local.model, self.masks, self.part.pruning_mode,
                                torch.as_tensor(local.task.example_input(local.task.settings)))
        local.network = pruned.model
        local.step_hooks.append(pruned.hooks)
        yield
        pruned.finish()
        self.pruned = pruned

    def outgoing(self, delta: dict[str, np.ndarray], local: LocalTraining
                 ) -> dict[str, np.ndarray]:
        """The kept coordinates only; the squared gradients added to the site's sum (and
        reported when the round asks, :func:`squared_gradient_report`)."""
        assert self.pruned is not None  # the training context closed normally
        self.sqgrad = squared_gradient_report(self.pruned.squared_gradients(),
                                              local.global_arrays, self.part.pruning_report,
                                              self.federation, self.state_dir)
        return compact(delta, self.masks)

    def residual_name(self, name: str) -> str:
        """The residual of the kept weights of one mask: a new mask starts a new one."""
        return f"{name}-mask-{self.part.pruning_version}"

    def reply(self) -> dict[str, np.ndarray]:
        """A re-pruning round's encoded squared gradients (``pruning-sqgrad``)."""
        return {} if self.sqgrad is None else {keys.PRUNING_SQGRAD: self.sqgrad}

    def metrics(self) -> Metrics:
        """The mask version the site trained under (``pruning-version``)."""
        return {keys.PRUNING_VERSION: self.part.pruning_version}
