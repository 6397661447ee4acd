"""Update codecs: lossy compression of model updates, one module per codec.

A site compresses its update ``delta = x_global - x_local`` before sending it
and the server decodes it before aggregation; pure numpy, so the same code runs
in the ClientApp (encode) and in the strategy (decode). Compression applies to
the whole flattened update vector, one ``uint8`` payload per message
(:func:`flatten` / :func:`unflatten` go between the model's arrays and it).

Modules
-------
- :mod:`.registry` -- :data:`CODECS`, codec name -> codec; :mod:`.spec` -- the one spec parser.
- :mod:`.payload` -- :func:`encode` / :func:`decode`; :mod:`.wire` -- the common header.
- :mod:`.identity` (``none``), :mod:`.fp16`, :mod:`.topk`, :mod:`.randk`,
  :mod:`.qsgd`, :mod:`.sign` -- one codec each, with its section layout and paper.
- :mod:`.bitpack`, :mod:`.varint` -- bit packing and LEB128 varints.
- :mod:`.qsgd_buckets` (``qsgd:<s>:b<bucket>``), :mod:`.topk_layers` (``topk:<f>:layer``)
  -- the bucketed and per-tensor variants.
- :mod:`.error_feedback` -- :class:`ErrorFeedback` (EF-SGD).
- :mod:`.warmup` -- the kept fraction's warm-up over the first rounds (DGC).
- :mod:`.vectors` -- seeds and flatten / unflatten.

Adding a codec is one new module ending in ``CODEC = CODECS.add("<name>", Codec(...))``
(see :mod:`.registry`): the registry finds it on its first lookup.
"""

from __future__ import annotations

from strategies.wire.codecs.error_feedback import ErrorFeedback
from strategies.wire.codecs.errors import CodecError, PayloadError
from strategies.wire.codecs.payload import decode, encode
from strategies.wire.codecs.registry import names
from strategies.wire.codecs.spec import CodecSpec, parse_spec
from strategies.wire.codecs.vectors import flatten, unflatten
from strategies.wire.codecs.warmup import check_warmup, warmup_spec
from strategies.wire.seeds import derive_seed  # the codec seed of a message (one seed module)

__all__ = [
    "CodecError",
    "CodecSpec",
    "ErrorFeedback",
    "PayloadError",
    "check_warmup",
    "decode",
    "derive_seed",
    "encode",
    "flatten",
    "names",
    "parse_spec",
    "unflatten",
    "warmup_spec",
]
