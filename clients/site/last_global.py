"""The global model a site last received, kept in its state dir for the compressed downlink.

With a downlink codec the server sends a compressed step onto the model the
site already holds (:mod:`strategies.downlink_receive`), so that model must
outlive a SuperNode restart. It is kept as three arrays of the site's
:class:`~clients.site.state_store.SiteStateStore` under
``<state-dir>/<federation>/``: ``last-global-model`` (the packed model bytes),
``last-global-layout`` (their JSON layout) and ``last-global-version``. Each
file is written atomically; the version is invalidated first and written last,
so a crash between the writes leaves "no model" (the server then sends a dense
snapshot), never a model under another version's number.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from clients.site.state_store import SiteStateStore

__all__ = ["LastGlobal"]

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
