"""The arrays of a reply, held to what its instruction allows: names, dtypes, shapes, payloads.

Every array of a reply is read as Flower will serialise it: an ``Array`` whose bytes
must be exactly one plain ``.npy`` of the dtype and shape it declares
(:func:`array_view`: numpy's own header reader, no copy, no pickle, no padding, no
structured dtype whose field names could hold text). Then, per kind of reply:

* a **packed update** (a train reply's ``delta``, :mod:`strategies.wire.update_codec`):
  one ``payload`` and ``raw-<i>`` arrays only at the model's integer arrays (required)
  and normalisation statistics (``running_mean`` / ``running_var``,
  :class:`~strategies.rounds.normalisation_statistics.StatisticPositions`), each of the
  model's dtype and shape at ``i``; the payload must decode with the server's own
  :func:`~strategies.wire.update_codec.unpack_update` as the instruction's codec and codec
  seed over the model's entries. The codec's decoder checks the exact length (a header
  ``d`` that is the model's, ``k`` that the spec gives, the index section, values, no
  trailing byte), so the payload is exactly as long as the codec declares for its
  content. PruneFL's squared gradients (``pruning-sqgrad``, only in a round that asks
  for them) must decode with the round's report codec over the full model's float
  entries, SCAFFOLD's ``Delta c_i`` (``scaffold-dc``, only under SCAFFOLD) with the
  round's codec and seed over the model's float arrays, as the server decodes them;
* a **masked vector** (a SecAgg+ collect reply): the single ``secagg-masked``, ``uint8``,
  exactly the bytes of the round's masked length at the plan's modulus bits
  (:func:`strategies.wire.secure_aggregation.encoding.pack`), the length being the model's
  float entries or rand-k's shared coordinates
  (:func:`~strategies.wire.secure_aggregation.vector.kept_indices`).

:func:`update_bound` is the byte size an update may have at most, from the instruction
alone: the egress filter's byte budget.
"""

from __future__ import annotations

import io
import math
from collections.abc import Collection
from functools import lru_cache

import numpy as np
from flwr.app import Array, ArrayRecord

from app.site_runtime.egress_instruction import Asked, ModelLayout
from app.site_runtime.egress_refusal import EgressRefusal
from strategies.compression import decode
from strategies.wire import message_keys as keys
from strategies.wire.errors import FedMedError
from strategies.wire.secure_aggregation.encoding import pack
from strategies.wire.secure_aggregation.vector import kept_indices
from strategies.wire.update_codec import unpack_update
from strategies.wire.model_layout import PAYLOAD_KEY, RAW_PREFIX

__all__ = ["MAX_NPY_HEADER", "MAX_PAYLOAD_BYTES_PER_ENTRY", "PAYLOAD_HEAD_BYTES", "array_view",
           "check_masked", "check_names", "check_update", "masked_bytes", "update_bound"]

#: The longest ``.npy`` header accepted: numpy writes 128 bytes for every array the product
#: sends (a dict of dtype, order and shape, padded to 64-byte alignment).
MAX_NPY_HEADER = 1024
#: No registered codec sends more than 6 bytes per entry (``qsgd:<s>:b1``: a float32 norm and
#: a 16-bit level each; ``none`` sends 4, a raw float64 array 8): 8 bounds every update.
MAX_PAYLOAD_BYTES_PER_ENTRY = 8
#: A payload's fixed part: the 7-byte common header and a codec's section header (<= 16).
PAYLOAD_HEAD_BYTES = 64


@lru_cache(maxsize=256)
def _npy_header(head: bytes) -> tuple[tuple[int, ...], bool, np.dtype]:
    """numpy's own reading of one ``.npy`` header (shape, Fortran order, dtype); a reply's
    arrays share a few headers, read once each."""
    stream = io.BytesIO(head)
    major, _ = np.lib.format.read_magic(stream)
    read = (np.lib.format.read_array_header_1_0 if major == 1
            else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read(stream, max_header_size=MAX_NPY_HEADER)
    if stream.tell() != len(head):
        raise ValueError("the header's length field and its text disagree")
    return tuple(shape), bool(fortran), dtype


def _header_end(data: bytes) -> int:
    """Where a ``.npy``'s header ends: after the magic, the version and the header length
    (2 bytes in format 1, 4 in formats 2 and 3; numpy's format specification)."""
    major = data[6] if len(data) > 6 else 0
    width = 2 if major == 1 else 4
    return 8 + width + int.from_bytes(data[8:8 + width], "little")


def array_view(array: Array, name: str, dtype: np.dtype | None = None,
               shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``array`` as a read-only numpy view of its bytes, checked to be exactly one plain
    ``.npy`` of the dtype and shape it declares (and of ``dtype`` / ``shape`` when given).

    Raises
    ------
    EgressRefusal
        ``egress.array-shape``, naming ``name`` (which the caller has checked is allowed).
    """
    def refuse(what: str) -> EgressRefusal:
        return EgressRefusal("egress.array-shape", f"array '{name}' {what}")

    if array.stype != "numpy.ndarray" or not isinstance(array.data, bytes):
        raise refuse("is not a numpy array")
    offset = _header_end(array.data)
    if offset > MAX_NPY_HEADER:
        raise refuse("has a longer header than numpy writes")
    try:
        found_shape, fortran, found = _npy_header(array.data[:offset])
    except (ValueError, TypeError, SyntaxError):
        raise refuse("holds no plain .npy bytes") from None
    if found.hasobject or found.fields is not None or found.subdtype is not None:
        raise refuse("has a structured or object dtype")
    try:
        declared = (np.dtype(array.dtype), tuple(array.shape))
    except TypeError:
        raise refuse("declares no numpy dtype") from None
    if declared != (found, found_shape):
        raise refuse("declares another dtype or shape than its bytes hold")
    count = math.prod(found_shape)
    if len(array.data) != offset + count * found.itemsize:
        raise refuse("has more or fewer bytes than its dtype and shape")
    if dtype is not None and found != np.dtype(dtype):
        raise refuse(f"must be {np.dtype(dtype).name}")
    if shape is not None and found_shape != tuple(shape):
        raise refuse(f"must have shape {tuple(shape)}")
    view = np.frombuffer(array.data, dtype=found, count=count, offset=offset)
    return view.reshape(found_shape, order="F" if fortran else "C")


def check_names(record: ArrayRecord, allowed: Collection[str], required: Collection[str],
                where: str) -> None:
    """Refuse (``egress.array-name``) an array of ``record`` not in ``allowed`` or a missing
    one of ``required``; an unexpected name is counted, never repeated."""
    extra = [name for name in record.keys() if name not in allowed]
    if extra:
        raise EgressRefusal("egress.array-name", f"{len(extra)} array(s) in '{where}' that "
                            "the instruction does not allow")
    missing = sorted(set(required) - set(record.keys()))
    if missing:
        raise EgressRefusal("egress.array-name", f"'{where}' lacks array '{missing[0]}'")


def _raw_positions(layout: ModelLayout) -> tuple[set[int], set[int]]:
    """The positions a packed update must (integer arrays) and may (statistics) send raw."""
    required = {i for i, spec in enumerate(layout.arrays) if not spec.floating}
    statistics = layout.statistics
    return required, required | set(statistics)


def _decoded(what: str, payload: np.ndarray, codec: str, size: int, seed: int = 0,
             segments: list[int] | None = None) -> None:
    try:
        decode(payload, codec, size, seed=seed, segments=segments)
    except (FedMedError, ValueError) as exc:
        raise EgressRefusal("egress.payload", f"'{what}' does not decode as {codec} of {size} "
                            f"entries ({type(exc).__name__})") from None


def check_update(record: ArrayRecord, asked: Asked) -> None:
    """Check a train reply's packed update (and its side payloads) against ``asked``.

    Raises
    ------
    EgressRefusal
        ``egress.array-name``, ``egress.array-shape`` or ``egress.payload``.
    """
    layout, instruction = asked.model, asked.instruction
    assert layout is not None  # a train instruction always has its model (asked_of)
    required, allowed = _raw_positions(layout)
    side = ({keys.PRUNING_SQGRAD} if instruction.pruning_version and instruction.pruning_report
            else set()) | ({keys.CONTROL_DELTA} if instruction.control_variates else set())
    check_names(record, {PAYLOAD_KEY, *side, *(f"{RAW_PREFIX}{i}" for i in allowed)},
                {PAYLOAD_KEY, *(f"{RAW_PREFIX}{i}" for i in required)}, keys.DELTA)
    arrays = {PAYLOAD_KEY: array_view(record[PAYLOAD_KEY], PAYLOAD_KEY, np.uint8)}
    for i in sorted(allowed):
        name = f"{RAW_PREFIX}{i}"
        if name in record:
            spec = layout.arrays[i]
            arrays[name] = array_view(record[name], name, spec.dtype, spec.shape)
    if arrays[PAYLOAD_KEY].ndim != 1:
        raise EgressRefusal("egress.array-shape", f"array '{PAYLOAD_KEY}' must be 1-D")
    try:
        unpack_update(arrays, layout.placeholders, instruction.codec, instruction.codec_seed)
    except (FedMedError, ValueError) as exc:
        raise EgressRefusal("egress.payload", f"'{PAYLOAD_KEY}' does not decode as "
                            f"{instruction.codec} over the model ({type(exc).__name__})") from None
    floats = layout.float_sizes()
    if keys.PRUNING_SQGRAD in record:
        full = sum(layout.float_sizes(asked.full_shapes))
        _decoded(keys.PRUNING_SQGRAD, array_view(record[keys.PRUNING_SQGRAD],
                                                 keys.PRUNING_SQGRAD, np.uint8),
                 instruction.pruning_report, full)
    if keys.CONTROL_DELTA in record:
        _decoded(keys.CONTROL_DELTA, array_view(record[keys.CONTROL_DELTA], keys.CONTROL_DELTA,
                                                np.uint8),
                 instruction.codec, sum(floats), instruction.codec_seed, floats)


@lru_cache(maxsize=32)
def _packed_size(length: int, bits: int) -> int:
    return int(pack(np.zeros(length, np.uint64), bits).size)


def masked_bytes(asked: Asked) -> int:
    """The bytes of a SecAgg+ collect reply's masked vector (the plan's modulus bits over the
    round's masked coordinates)."""
    layout, instruction = asked.model, asked.instruction
    assert layout is not None and instruction.plan is not None
    try:
        kept = kept_indices(layout.placeholders, instruction.codec, 0, whole=layout.statistics)
    except FedMedError:
        raise EgressRefusal("egress.payload", f"codec {instruction.codec} does not sum under "
                            "secure aggregation") from None
    length = sum(layout.float_sizes()) if kept is None else int(kept.size)
    return _packed_size(length, instruction.plan.modulus_bits)


def check_masked(record: ArrayRecord, asked: Asked) -> None:
    """Check a SecAgg+ collect reply's ``delta``: the one masked vector of the round's size.

    Raises
    ------
    EgressRefusal
        ``egress.array-name`` or ``egress.array-shape``.
    """
    check_names(record, {keys.SECAGG_MASKED}, {keys.SECAGG_MASKED}, keys.DELTA)
    array_view(record[keys.SECAGG_MASKED], keys.SECAGG_MASKED, np.uint8, (masked_bytes(asked),))


def update_bound(asked: Asked) -> int:
    """The most bytes a train reply's arrays may hold under ``asked``'s instruction: the
    masked vector's exact size in a SecAgg+ collect, else
    :data:`MAX_PAYLOAD_BYTES_PER_ENTRY` per model entry for the update and per float entry
    for each side payload the round asks for."""
    layout, instruction = asked.model, asked.instruction
    if layout is None:
        return 0
    if instruction.secagg_stage == keys.SECAGG_COLLECT:
        return masked_bytes(asked)
    if instruction.secagg_stage:
        return 0
    floats = sum(layout.float_sizes())
    side = (sum(layout.float_sizes(asked.full_shapes))
            if instruction.pruning_version and instruction.pruning_report else 0)
    side += floats if instruction.control_variates else 0
    return MAX_PAYLOAD_BYTES_PER_ENTRY * (layout.entries + side) + 3 * PAYLOAD_HEAD_BYTES

