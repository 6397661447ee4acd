"""A vertical stage's reply (``train.vertical``), held to what its stage and instruction allow.

Each stage (:mod:`clients.vertical.stages`) has its own arrays, metrics and info
strings. The runtime checks, per stage (config ``vertical-stage``):

* ``describe``: no arrays; info ``department`` and ``task`` (below);
* ``psi-request``: the one array ``request``, a canonical ``psi.Request`` of
  openmined-psi (no unknown field) of curve points of the library's size, padded to a
  multiple of :data:`clients.vertical.psi.PAD`;
* ``psi-step``: with ``psi-serve`` = r > 0, exactly ``setup`` (a RAW ``psi.ServerSetup``,
  padded) and ``response-0 .. response-(r-1)``, each a ``psi.Response`` of as many points
  as the instruction's ``request-<j>``; otherwise none; the metric ``psi-size`` (the
  aligned patients, remembered for pvFed's encoders) only in a ``psi-last`` finish;
* ``pvfed-local`` / ``pvfed-round``: the local encoder's ``embedding.weight``
  (patients x ``vertical.hidden``), ``output.weight`` (f x hidden) and ``output.bias``
  (f), float32, where the patients are the instruction's global encoder's (a round) or
  the aligned ones remembered from the PSI, and f the ``feature-width`` the site
  reported (remembered); a round without ``pvfed-encode`` sends none; info ``department``;
* ``split-train``: ``activation-<j>`` for j < ``batches`` (float32, ``batch-size`` rows,
  one shape), ``label-<j>`` alike for the vanilla SplitNN only, the site part
  ``part/*`` with ``return-part`` only, of the dtypes and sizes of the part the
  federation last sent (remembered);
* ``split-head``: ``gradient-<j>`` of exactly the shape of the instruction's ``output-<j>``;
* ``split-eval-forward``: ``activation-val`` / ``activation-test`` (float32);
* ``split-eval-finish``: no arrays; ``<split>-examples`` the rows of the instruction's
  ``output-<split>``.

``department`` must be the site's declared department (``vertical-site.toml`` of its
folder, else its name) and ``task`` its declared task (else the run config's ``task``):
nothing but these two short names leaves as text. What the runtime cannot know from the
instruction, and so does not bound: the number of the site's own ids in its PSI
request, the width of a cut activation, the rows of an evaluation split.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import private_set_intersection.python as psi
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord

from app.site_runtime.egress_arrays import array_view, check_names
from app.site_runtime.egress_instruction import FederationMemory, config_of, federation_of
from app.site_runtime.egress_refusal import EgressRefusal
from clients.site.instruction import SiteRunSettings
from clients.vertical.psi import PAD, new_request
from clients.vertical.psi_stages import LAST, PSI_SIZE, REQUEST, RESPONSE, SERVE, SETUP
from clients.vertical.pvfed_site import ENCODE
from clients.vertical.split_model import PART, U_SHAPED, batch_key
from clients.vertical.stages import SITE_FILE
from strategies.wire import message_keys as keys
from strategies.wire.vertical_options import VerticalOptions, split_vertical

__all__ = ["check_vertical", "declared_names"]

_ENCODER = ("embedding.weight", "output.weight", "output.bias")
_FLOAT = np.dtype(np.float32)


@lru_cache(maxsize=1)
def _point_bytes() -> int:
    """Bytes of one encrypted element (a compressed curve point), from the library itself."""
    request = psi.Request()
    request.ParseFromString(new_request([])[1])
    return len(request.encrypted_elements[0])


def _psi(record: ArrayRecord, name: str, kind: type) -> list[bytes]:
    """The encrypted elements of array ``name``, a canonical ``kind`` message."""
    message = kind()
    try:
        message.ParseFromString(array_view(record[name], name, np.uint8).tobytes())
    except DecodeError:
        raise EgressRefusal("egress.array-shape", f"array '{name}' is not a PSI message") \
            from None
    parts = [message, message.raw] if kind is psi.ServerSetup else [message]
    if kind is psi.ServerSetup and message.WhichOneof("data_structure") != "raw":
        raise EgressRefusal("egress.array-shape", f"array '{name}' is not a RAW PSI setup")
    if any(len(unknown_fields.UnknownFieldSet(part)) for part in parts):
        raise EgressRefusal("egress.array-shape", f"array '{name}' has fields PSI does not send")
    elements = list(parts[-1].encrypted_elements)
    if any(len(element) != _point_bytes() for element in elements):
        raise EgressRefusal("egress.array-shape", f"array '{name}' holds other than curve points")
    return elements


def _padded(elements: list[bytes], name: str) -> None:
    if not elements or len(elements) % PAD:
        raise EgressRefusal("egress.array-shape", f"array '{name}' is not padded to {PAD} items")


def declared_names(data_path: Path, site: str, task: str) -> dict[str, str]:
    """The site's declared ``department`` and ``task`` (``vertical-site.toml``, else its name
    and the run's task)."""
    path = data_path / SITE_FILE
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, tomllib.TOMLDecodeError):
        table = {}
    return {"department": str(table.get("department", site)), "task": str(table.get("task", task))}


def _info(record: ConfigRecord, stage: str, names: Mapping[str, str]) -> None:
    wanted = {"describe": ("department", "task"), "pvfed-local": ("department",),
              "pvfed-round": ("department",)}.get(stage, ())
    if set(record.keys()) != set(wanted) or any(record[k] != names[k] for k in wanted):
        raise EgressRefusal("egress.text", f"a {stage} reply's info must be exactly the site's "
                            f"declared {' and '.join(wanted) or 'nothing'}")


def _encoder(reply: ArrayRecord, patients: int | None, hidden: int, width: int | None) -> None:
    check_names(reply, _ENCODER, _ENCODER, keys.VERTICAL)
    if patients is None:
        raise EgressRefusal("egress.model-unknown", "the aligned patients of this federation")
    rows = array_view(reply["output.weight"], "output.weight", _FLOAT).shape
    width = rows[0] if width is None else width
    array_view(reply["embedding.weight"], "embedding.weight", _FLOAT, (patients, hidden))
    array_view(reply["output.weight"], "output.weight", _FLOAT, (width, hidden))
    array_view(reply["output.bias"], "output.bias", _FLOAT, (width,))


def _batches(reply: ArrayRecord, kind: str, count: int, rows: int) -> None:
    shapes = {array_view(reply[batch_key(kind, j)], batch_key(kind, j), _FLOAT).shape
              for j in range(count)}
    if len(shapes) > 1 or any(shape[:1] != (rows,) for shape in shapes):
        raise EgressRefusal("egress.array-shape", f"'{kind}-<j>' must share one shape of "
                            f"{rows} rows (batch-size)")


def _part(reply: ArrayRecord, part: Mapping[str, tuple[str, int]]) -> None:
    for name, (dtype, size) in part.items():
        if array_view(reply[name], name, np.dtype(dtype)).size != size:
            raise EgressRefusal("egress.array-shape", f"array '{name}' is not the part's size")


def _arrays(message: Message) -> ArrayRecord:
    return message.content.array_records.get(keys.ARRAYS, ArrayRecord())


@dataclass(frozen=True)
class _Stage:
    """One vertical reply as its stage's check sees it."""

    config: Mapping[str, Any]
    #: The instruction's arrays and the reply's.
    given: ArrayRecord
    reply: ArrayRecord
    #: What earlier messages of the federation told (part, patients, width).
    remembered: Mapping[str, Any]
    options: VerticalOptions
    batch_size: int


def _psi_request(stage: _Stage) -> None:
    check_names(stage.reply, {REQUEST}, {REQUEST}, keys.VERTICAL)
    _padded(_psi(stage.reply, REQUEST, psi.Request), REQUEST)


def _psi_step(stage: _Stage) -> None:
    served = max(int(stage.config.get(SERVE, 0)), 0)
    names = {SETUP, *(f"{RESPONSE}-{j}" for j in range(served))} if served else set()
    check_names(stage.reply, names, names, keys.VERTICAL)
    if served:
        _padded(_psi(stage.reply, SETUP, psi.ServerSetup), SETUP)
    for j in range(served):
        asked = _psi(stage.given, f"{REQUEST}-{j}", psi.Request)
        if len(_psi(stage.reply, f"{RESPONSE}-{j}", psi.Response)) != len(asked):
            raise EgressRefusal("egress.array-shape", f"'{RESPONSE}-{j}' does not answer "
                                f"every item of '{REQUEST}-{j}'")


def _pvfed(stage: _Stage, local: bool) -> None:
    if not (local or bool(stage.config.get(ENCODE, False))):
        check_names(stage.reply, (), (), keys.VERTICAL)
        return
    given = stage.given
    patients = (np.shape(given["embedding.weight"])[0]
                if not local and "embedding.weight" in given else stage.remembered.get("patients"))
    _encoder(stage.reply, patients, stage.options.hidden, stage.remembered.get("width"))


def _split_train(stage: _Stage) -> None:
    count = int(stage.config.get("batches", 0))
    vanilla = stage.options.method != U_SHAPED
    part = stage.remembered.get("part") if stage.config.get("return-part", False) else {}
    if part is None:
        raise EgressRefusal("egress.model-unknown", "the site part of this federation")
    kinds = ("activation", "label") if vanilla else ("activation",)
    names = {*(batch_key(kind, j) for kind in kinds for j in range(count)), *part}
    check_names(stage.reply, names, names, keys.VERTICAL)
    for kind in kinds:
        _batches(stage.reply, kind, count, stage.batch_size)
    _part(stage.reply, part)


def _split_head(stage: _Stage) -> None:
    outputs = [name for name in stage.given.keys() if re.fullmatch(r"output-\d+", name)]
    names = {name.replace("output", "gradient") for name in outputs}
    check_names(stage.reply, names, names, keys.VERTICAL)
    for name in outputs:
        gradient = name.replace("output", "gradient")
        array_view(stage.reply[gradient], gradient, _FLOAT, tuple(stage.given[name].shape))


def _split_eval_forward(stage: _Stage) -> None:
    names = {batch_key("activation", split) for split in keys.EVAL_SPLITS}
    check_names(stage.reply, names, (), keys.VERTICAL)
    for name in stage.reply.keys():
        array_view(stage.reply[name], name, _FLOAT)


def _no_arrays(stage: _Stage) -> None:
    check_names(stage.reply, (), (), keys.VERTICAL)


#: Each stage a site answers (:data:`clients.vertical.stages.VERTICAL_STAGES`) -> its arrays' check.
_STAGES: dict[str, Callable[[_Stage], None]] = {
    "describe": _no_arrays, "psi-request": _psi_request, "psi-step": _psi_step,
    "pvfed-local": lambda stage: _pvfed(stage, local=True),
    "pvfed-round": lambda stage: _pvfed(stage, local=False),
    "split-train": _split_train, "split-head": _split_head,
    "split-eval-forward": _split_eval_forward, "split-eval-finish": _no_arrays,
}


def _remember(message: Message, stage: str, config: Mapping[str, Any], metrics: MetricRecord,
              site: str, memory: FederationMemory, federation: str) -> dict[str, Any]:
    """What this federation's earlier messages told; updated with this message's part and
    this reply's aligned patients and feature width."""
    given = _arrays(message)
    part = {name: (str(given[name].dtype), int(np.prod(given[name].shape, dtype=np.int64)))
            for name in given.keys() if name.startswith(PART)}
    if part:
        memory.put(site, federation, "part", part)
    if stage == "psi-step" and config.get(LAST, False) and PSI_SIZE in metrics:
        memory.put(site, federation, "patients", int(metrics[PSI_SIZE]))
    return {what: memory.get(site, federation, what) for what in ("part", "patients", "width")}


def check_vertical(message: Message, reply: Message, context: Context, site: str,
                   data_path: Path, memory: FederationMemory) -> None:
    """Check a vertical stage's reply (its records already checked to be ``vertical``,
    ``metrics`` and ``site``; its metrics' names and ranges already checked).

    Raises
    ------
    EgressRefusal
        ``egress.array-name``, ``egress.array-shape``, ``egress.metric-range``,
        ``egress.model-unknown`` or ``egress.text``.
    """
    config = config_of(message)
    stage = str(config.get(keys.VERTICAL_STAGE, ""))
    check = _STAGES.get(stage)
    if check is None:
        raise EgressRefusal("egress.instruction", "a vertical stage the site does not answer")
    federation = federation_of(config, context)
    metrics = reply.content.metric_records[keys.METRICS]
    remembered = _remember(message, stage, config, metrics, site, memory, federation)
    if PSI_SIZE in metrics and not (stage == "psi-step" and config.get(LAST, False)):
        raise EgressRefusal("egress.metric-range", f"'{PSI_SIZE}' outside the last PSI finish")
    if stage == "pvfed-local" and "feature-width" in metrics:
        remembered["width"] = int(metrics["feature-width"])
        memory.put(site, federation, "width", remembered["width"])
    given = _arrays(message)
    if stage == "split-eval-finish":
        for split in keys.EVAL_SPLITS:
            name, count = batch_key("output", split), f"{split}-examples"
            if count in metrics and (name not in given or metrics[count] != given[name].shape[0]):
                raise EgressRefusal("egress.metric-range", f"'{count}' is not the rows of the "
                                    f"instruction's '{name}'")
    task = str(context.run_config.get("task", ""))
    _info(reply.content.config_records[keys.SITE], stage,
          declared_names(data_path, site, task))
    check(_Stage(config, given, reply.content.array_records[keys.VERTICAL], remembered,
                 split_vertical(context.run_config)[0],
                 SiteRunSettings.from_run_config(context.run_config).sizes.batch_size))
