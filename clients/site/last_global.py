"""The global model a site last received, kept in its state dir for the compressed downlink.

With a downlink codec the server sends a compressed step onto the model the
site already holds (:mod:`strategies.wire.downlink_receive`), so that model must
outlive a SuperNode restart. It is kept as three arrays of the site's
:class:`~clients.site.state_store.SiteStateStore` under
``<state-dir>/<federation>/``: ``last-global-model`` (the packed model bytes),
``last-global-layout`` (their JSON layout) and ``last-global-version``. Each
file is written atomically; the version is invalidated first and written last,
so a crash between the writes leaves "no model" (the server then sends a dense
snapshot), never a model under another version's number.

In the site's round the compressed downlink is the :class:`DownlinkReceive` feature
(:class:`~clients.site.site_feature.SiteFeature`) of a message with downlink entries
(:class:`DownlinkInstruction`): the model the site holds is advanced by the compressed
step, or replaced by the dense snapshot, verified by its checksum and saved for the next
round, and the reply acknowledges its version (``downlink-version``). Without the entries
the instruction's arrays are the packed model as sent (:mod:`strategies.wire.model_layout`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from clients.site.site_feature import SiteFeature
from clients.site.site_reply import Metrics
from clients.site.state_store import SiteStateStore
from strategies.wire import message_keys as keys
from strategies.wire.downlink_header import DownlinkHeader
from strategies.wire.downlink_receive import receive
from strategies.wire.downlink_reference import Reference
from strategies.wire.errors import ConfigError
from strategies.wire.model_layout import LAYOUT_KEY, MODEL_KEY, PackedModelError

if TYPE_CHECKING:
    from clients.site.instruction import Instruction, SiteRunSettings
    from clients.site.site import Site

__all__ = ["DownlinkInstruction", "DownlinkReceive", "LastGlobal"]

_PREFIX = "last-global-"
_MODEL, _LAYOUT, _VERSION = "model", "layout", "version"


class LastGlobal:
    """Load and save a site's last global model: ``{"model", "layout", "version"}`` arrays.

    Parameters
    ----------
    state_dir : Path
        The site's ``state-dir`` (node config).
    federation : str
        The federation the model belongs to.
    """

    def __init__(self, state_dir: Path, federation: str) -> None:
        self.store = SiteStateStore(state_dir)
        self.federation = federation

    def load(self) -> dict[str, np.ndarray] | None:
        """The saved arrays, or ``None`` when there is no complete model."""
        version = self.store.load(self.federation, _PREFIX + _VERSION)
        if version is None or version.size != 1 or int(version.reshape(-1)[0]) < 1:
            return None
        parts = {key: self.store.load(self.federation, _PREFIX + key) for key in (_MODEL, _LAYOUT)}
        if any(part is None for part in parts.values()):
            return None
        return {**parts, _VERSION: version}

    def save(self, packed: Mapping[str, np.ndarray]) -> None:
        """Save ``packed`` (``model``, ``layout`` and a positive ``version``).

        Raises
        ------
        ValueError
            When ``packed`` lacks one of the three arrays or its version is < 1.
        """
        if set(packed) != {_MODEL, _LAYOUT, _VERSION}:
            raise ValueError(f"last global model needs exactly '{_MODEL}', '{_LAYOUT}' and "
                             f"'{_VERSION}', got {sorted(packed)}")
        version = np.asarray(packed[_VERSION], dtype=np.int64).reshape(-1)
        if version.size != 1 or version[0] < 1:
            raise ValueError(f"last global model version must be one integer >= 1, got {version}")
        self.store.save(self.federation, _PREFIX + _VERSION, np.zeros(1, np.int64))
        for key in (_MODEL, _LAYOUT):
            self.store.save(self.federation, _PREFIX + key, np.asarray(packed[key]))
        self.store.save(self.federation, _PREFIX + _VERSION, version)


@dataclass(frozen=True)
class DownlinkInstruction:
    """The downlink entries of an instruction.

    Attributes
    ----------
    downlink : DownlinkHeader or None
        A compressed downlink's entries (``downlink-*``); ``None``: the packed model as sent.
    """

    KEYS: ClassVar[frozenset[str]] = frozenset({keys.DOWNLINK_VERSION})

    downlink: DownlinkHeader | None = None

    @classmethod
    def from_config(cls, kind: str, config: Mapping[str, Any]) -> DownlinkInstruction | None:
        """The downlink entries of any kind of message; ``None`` without ``downlink-version``
        (a dense downlink needs no parse).

        Raises
        ------
        ConfigError
            When the entries are incomplete or malformed.
        """
        if keys.DOWNLINK_VERSION not in config:
            return None
        try:
            return cls(DownlinkHeader.from_config(config))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"instruction downlink entries are incomplete or "
                              f"malformed ({exc!r}); request refused") from None


class DownlinkReceive(SiteFeature):
    """A compressed downlink at the site: the step onto the model it holds, that model saved.

    Parameters
    ----------
    header : DownlinkHeader
        The instruction's downlink entries.
    store : LastGlobal
        The site's last global model of the instruction's federation.
    """

    def __init__(self, header: DownlinkHeader, store: LastGlobal) -> None:
        self.header, self.store = header, store
        self.version: int | None = None

    @classmethod
    def of(cls, instruction: Instruction, site: Site,
           run: SiteRunSettings) -> DownlinkReceive | None:
        """The feature of a message with downlink entries."""
        part = instruction.part(DownlinkInstruction)
        if part is None or part.downlink is None:
            return None
        return cls(part.downlink, LastGlobal(site.state_dir, instruction.federation))

    def receive(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The packed global model the entries stand for
        (:func:`strategies.wire.downlink_receive.receive`),
        saved as the site's last global model.

        Raises
        ------
        strategies.wire.downlink_receive.DownlinkSyncError
            When a compressed step does not apply to what the site holds.
        """
        saved = self.store.load()
        try:
            held = None if saved is None else Reference.from_packed(saved)
        except PackedModelError:  # an unreadable model: the step is refused, a snapshot follows
            held = None
        reference = receive(arrays, self.header, held)
        packed = reference.packed()
        self.store.save(packed)
        self.version = reference.version
        return {MODEL_KEY: packed[MODEL_KEY], LAYOUT_KEY: packed[LAYOUT_KEY]}

    def metrics(self) -> Metrics:
        """The version of the model the site now holds (``downlink-version``)."""
        return {} if self.version is None else {keys.DOWNLINK_VERSION: self.version}
