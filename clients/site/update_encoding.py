"""A site's update as the arrays it sends: the round's codec, with its error-feedback residual.

EF-SGD (Karimireddy et al. 2019, "Error feedback fixes SignSGD and other gradient
compression schemes", Algorithm 2): ``z = e + delta``, send ``C(z)``,
``e <- z - decode(C(z))``. The residual ``e`` is kept in the site's state store
(``state-dir``/<federation>/``ef-residual``), so it survives a restart of the
SuperNode or of the site's worker.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np

from clients.site.instruction import Instruction
from clients.site.state_store import SiteStateStore
from strategies.compression import ErrorFeedback, parse_spec
from strategies.update_codec import pack_update

__all__ = ["RESIDUAL_NAME", "encode_update"]

#: The residual's name in the site's state store.
RESIDUAL_NAME = "ef-residual"


def encode_update(delta: Sequence[np.ndarray], instruction: Instruction, state_dir: Path,
                  raw: Collection[int] = frozenset()) -> tuple[dict[str, np.ndarray], float]:
    """Pack ``delta`` with the instruction's codec; keep the error-feedback residual.

    Parameters
    ----------
    delta : sequence of numpy.ndarray
        ``x_global - x_local``, in the model's order.
    instruction : Instruction
        Its codec, codec seed, error-feedback flag and federation.
    state_dir : Path
        The site's state dir (the residual's home).
    raw : collection of int
        Positions of the model's buffers (normalisation statistics), sent uncompressed.

    Returns
    -------
    arrays, residual_norm
        The arrays to send (:func:`strategies.update_codec.pack_update`) and
        ``||e||_2`` after this round (0 without error feedback).
    """
    spec = instruction.codec
    lossy = parse_spec(spec).name != "none"
    if not (lossy and instruction.error_feedback):
        return pack_update(delta, spec, instruction.codec_seed, raw=raw), 0.0
    store = SiteStateStore(state_dir)
    feedback = ErrorFeedback(spec)
    saved = store.load(instruction.federation, RESIDUAL_NAME)
    if saved is not None:
        feedback.load_state(saved)
    arrays = pack_update(delta, spec, instruction.codec_seed, feedback, raw=raw)
    residual = feedback.state()
    store.save(instruction.federation, RESIDUAL_NAME, residual)
    return arrays, float(np.linalg.norm(residual))
