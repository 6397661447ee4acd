"""The global model a train instruction carries: as packed, or through the compressed downlink.

Without downlink entries the instruction's arrays are the packed model
(:mod:`strategies.model_buffer`). With them (:mod:`strategies.downlink_receive`)
the site's last global model (:class:`~clients.site.last_global.LastGlobal`) is
advanced by the compressed step, or replaced by the dense snapshot, verified by
its checksum and saved for the next round; the reply acknowledges its version
(``downlink-version``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from clients.site.instruction import Instruction
from clients.site.last_global import LastGlobal
from strategies import message_keys as keys
from strategies.downlink_receive import receive
from strategies.downlink_reference import Reference
from strategies.model_buffer import PackedModelError, unpack_model

__all__ = ["received_model"]


def received_model(arrays: Mapping[str, np.ndarray], instruction: Instruction,
                   state_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The global model (arrays by name, in the model's order) and the reply's downlink metric.

    Raises
    ------
    strategies.model_buffer.PackedModelError
        When a packed model is malformed.
    strategies.downlink_receive.DownlinkSyncError
        When a compressed step does not apply to what the site holds.
    """
    header = instruction.downlink
    if header is None:
        return unpack_model(arrays), {}
    store = LastGlobal(state_dir, instruction.federation)
    saved = store.load()
    try:
        held = None if saved is None else Reference.from_packed(saved)
    except PackedModelError:  # an unreadable model: the step is refused, a snapshot follows
        held = None
    reference = receive(arrays, header, held)
    store.save(reference.packed())
    return reference.named(), {keys.DOWNLINK_VERSION: reference.version}
