"""What an instruction allows its reply to carry, read by the hospital's runtime from the message.

The egress filter (:mod:`app.site_runtime.egress_filter`) judges a reply against the
instruction it answers, never against what the app says of itself. This module reads
that instruction with the product's own parsers: its settings with
:meth:`clients.site.instruction.Instruction.parse` (tau, codec and codec seed, the
downlink, pruning, SCAFFOLD and SecAgg+ entries), its global model's names, dtypes
and shapes from the packed model's layout (:mod:`strategies.wire.model_layout`: only the
small JSON layout is read, never the weights), and a pruning mask's full shapes with
:func:`strategies.wire.pruning_mask.masks_from_record`.

Two things an instruction may leave out, which the runtime then remembers from an
earlier message of the same federation at the same site (:class:`FederationMemory`):

* a compressed downlink step (``downlink-base`` > 0) carries only the step, not the
  model's shapes: the layout of the last dense model (a snapshot or a plain packed
  model) of a train instruction of that federation is used;
* a pruned instruction carries its mask only to a node that has not acknowledged the
  mask's version: the full shapes of the mask last sent with that version are used.

When neither the message nor the memory says (the runtime restarted in between), the
reply is refused under ``egress.model-unknown``: the site's reply then acknowledges
nothing, and the coordinator sends the dense model and the mask again.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message

from app.site_runtime.egress_refusal import EgressRefusal
from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.site_pruning import MASK_ENTRIES
from strategies.rounds.normalisation_statistics import StatisticPositions
from strategies.wire import message_keys as keys
from strategies.wire.errors import FedMedError
from strategies.wire.model_layout import LAYOUT_KEY, MODEL_KEY
from strategies.wire.pruning_mask import masks_from_record

__all__ = ["ArraySpec", "Asked", "FederationMemory", "ModelLayout", "asked_of", "config_of",
           "federation_of", "packed_layout"]

#: Federations (per site) whose layouts the memory keeps; the least recently used goes.
REMEMBERED_FEDERATIONS = 64


@dataclass(frozen=True)
class ArraySpec:
    """One array an instruction names: its name, dtype and shape."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        """Its number of entries."""
        return math.prod(self.shape)

    @property
    def floating(self) -> bool:
        """Whether it is a floating-point array (the compressed part of an update)."""
        return self.dtype.kind == "f"


#: One read-only zero of each dtype, under every placeholder of that dtype.
_ZEROS: dict[np.dtype, np.ndarray] = {}


def _placeholder(spec: ArraySpec) -> np.ndarray:
    zero = _ZEROS.setdefault(spec.dtype, np.zeros(1, spec.dtype))
    view = np.ndarray(spec.shape, spec.dtype, buffer=zero, strides=(0,) * len(spec.shape))
    view.flags.writeable = False
    return view


@dataclass(frozen=True)
class ModelLayout:
    """A model's arrays in order, as the instruction's packed layout names them (its derived
    views computed once: a federation's layout serves every reply of its rounds)."""

    arrays: tuple[ArraySpec, ...]

    @cached_property
    def names(self) -> list[str]:
        """The arrays' names, in order."""
        return [spec.name for spec in self.arrays]

    @cached_property
    def placeholders(self) -> list[np.ndarray]:
        """Read-only arrays of the layout's dtypes and shapes that hold no memory (what the
        product's decoders read of a reference: its dtypes and shapes)."""
        return [_placeholder(spec) for spec in self.arrays]

    def float_sizes(self, full: Mapping[str, tuple[int, ...]] | None = None) -> list[int]:
        """The sizes of the floating-point arrays, in order (``full``: shapes that replace
        a compacted array's, by name)."""
        full = full or {}
        return [math.prod(full.get(spec.name, spec.shape)) for spec in self.arrays
                if spec.floating]

    @cached_property
    def statistics(self) -> tuple[int, ...]:
        """Positions of its normalisation statistics (``running_mean`` / ``running_var``,
        :class:`~strategies.rounds.normalisation_statistics.StatisticPositions`)."""
        return StatisticPositions.of(self.names, self.placeholders).estimates

    @cached_property
    def entries(self) -> int:
        """Every entry of every array."""
        return sum(spec.size for spec in self.arrays)


def config_of(message: Message) -> dict[str, Any]:
    """The instruction's ``config`` record as a plain mapping (empty without one)."""
    if not message.has_content() or keys.CONFIG not in message.content.config_records:
        return {}
    return dict(message.content.config_records[keys.CONFIG])


def federation_of(config: Mapping[str, Any], context: Context) -> str:
    """The federation the instruction names, else the Flower run's ``run-<id>`` (as the site)."""
    return str(config.get(keys.FEDERATION, "") or f"run-{context.run_id}")


def _spec(entry: Any) -> ArraySpec:
    name, dtype, shape = entry
    if not (isinstance(name, str) and isinstance(shape, list)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise ValueError("a layout entry must be [name, dtype, shape]")
    return ArraySpec(name, np.dtype(dtype), tuple(shape))


def _declared_bytes(array: Array) -> int:
    return math.prod(array.shape) * np.dtype(array.dtype).itemsize


@lru_cache(maxsize=16)
def _parsed_layout(text: str) -> ModelLayout:
    return ModelLayout(tuple(_spec(entry) for entry in json.loads(text)))


def packed_layout(record: ArrayRecord) -> ModelLayout | None:
    """The layout of the packed model in ``record`` (``model`` + ``layout``), checked against
    the model buffer's size; ``None`` when ``record`` holds no well-formed packed model."""
    if set(record.keys()) != {MODEL_KEY, LAYOUT_KEY}:
        return None
    try:
        layout = _parsed_layout(record[LAYOUT_KEY].numpy().tobytes().decode("utf-8"))
        buffer = _declared_bytes(record[MODEL_KEY])
    except (ValueError, TypeError, UnicodeDecodeError):
        return None
    held = sum(spec.size * spec.dtype.itemsize for spec in layout.arrays)
    return layout if held == buffer else None


class FederationMemory:
    """What the runtime remembers of earlier instructions, per (site, federation): the last
    dense train model's layout, each pruning mask version's full shapes, a vertical
    federation's aligned patients and its site part (thread-safe, the most recent
    :data:`REMEMBERED_FEDERATIONS` federations of each site)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()

    def get(self, site: str, federation: str, what: str) -> Any:
        """The value remembered under ``what`` (``None``: nothing)."""
        with self._lock:
            entry = self._entries.get((site, federation))
            if entry is None:
                return None
            self._entries.move_to_end((site, federation))
            return entry.get(what)

    def put(self, site: str, federation: str, what: str, value: Any) -> None:
        """Remember ``value`` under ``what``."""
        with self._lock:
            entry = self._entries.setdefault((site, federation), {})
            entry[what] = value
            self._entries.move_to_end((site, federation))
            kept = [key for key in self._entries if key[0] == site]
            for key in kept[:-REMEMBERED_FEDERATIONS]:
                del self._entries[key]


@dataclass(frozen=True)
class Asked:
    """What a train, evaluate or query instruction allows its reply to carry.

    Attributes
    ----------
    kind : str
        ``train``, ``evaluate`` or ``query``.
    instruction : Instruction
        Its settings, read by the site's own parser (the run's defaults filled in).
    model : ModelLayout or None
        The update's reference: the instruction's model (compacted where pruned), in
        order; ``None`` for evaluate, query and the SecAgg+ stages but collect, which
        send no update.
    full_shapes : dict of str to tuple
        A pruned model's covered arrays in their full shapes (the squared gradients run
        over them); empty when not pruned.
    """

    kind: str
    instruction: Instruction
    model: ModelLayout | None = None
    full_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def _arrays(message: Message) -> ArrayRecord:
    records = message.content.array_records if message.has_content() else {}
    return records.get(keys.ARRAYS, ArrayRecord())


def _train_model(message: Message, instruction: Instruction, site: str,
                 memory: FederationMemory) -> ModelLayout:
    """The layout of a train instruction's model (remembered for a compressed downlink)."""
    record = _arrays(message)
    model = ArrayRecord({name: array for name, array in record.items()
                         if name not in (*MASK_ENTRIES, keys.CONTROL_C)})
    header = instruction.downlink
    if header is not None and not header.dense:
        layout = memory.get(site, instruction.federation, "model")
        if layout is None:
            raise EgressRefusal("egress.model-unknown", "a compressed downlink step of a "
                                "federation whose dense model this runtime has not seen")
        return layout
    layout = packed_layout(model)
    if layout is None:
        raise EgressRefusal("egress.model-unknown", "the instruction carries no packed model")
    memory.put(site, instruction.federation, "model", layout)
    return layout


def _full_shapes(message: Message, instruction: Instruction, site: str,
                 memory: FederationMemory) -> dict[str, tuple[int, ...]]:
    """A pruned instruction's full shapes of the covered arrays (remembered per version);
    unknown ones refuse only a round that asks for the squared gradients over them."""
    record = _arrays(message)
    what = f"mask-{instruction.pruning_version}"
    if all(name in record for name in MASK_ENTRIES):
        try:
            masks = masks_from_record({name: record[name].numpy() for name in MASK_ENTRIES})
        except (FedMedError, ValueError, TypeError):
            raise EgressRefusal("egress.model-unknown", "the instruction's pruning mask does "
                                "not parse") from None
        shapes = {name: tuple(mask.shape) for name, mask in masks.items()}
        memory.put(site, instruction.federation, what, shapes)
        return shapes
    shapes = memory.get(site, instruction.federation, what)
    if shapes is None and instruction.pruning_report:
        raise EgressRefusal("egress.model-unknown", f"pruning mask version "
                            f"{instruction.pruning_version}, which this runtime has not seen")
    return shapes or {}


def asked_of(kind: str, message: Message, context: Context, site: str,
             memory: FederationMemory) -> Asked:
    """What the ``kind`` instruction ``message`` allows its reply to carry.

    Raises
    ------
    EgressRefusal
        ``egress.instruction``: the instruction does not parse; ``egress.model-unknown``:
        the model (or a pruning mask) the reply must match is unknown to the runtime.
    """
    config = config_of(message)
    try:
        run = SiteRunSettings.from_run_config(context.run_config)
        instruction = Instruction.parse(kind, config, run, f"run-{context.run_id}")
    except FedMedError:
        raise EgressRefusal("egress.instruction", f"the {kind} instruction this reply answers "
                            "does not parse") from None
    if kind != "train" or instruction.secagg_stage not in ("", keys.SECAGG_COLLECT):
        return Asked(kind, instruction)  # no update: evaluate, query, SecAgg+ key stages
    model = _train_model(message, instruction, site, memory)
    full = (_full_shapes(message, instruction, site, memory)
            if instruction.pruning_version else {})
    return Asked(kind, instruction, model, full)
