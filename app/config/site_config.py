"""Where a site's data and state live, from the SuperNode's node_config.

A hospital's SuperNode is started with ``--node-config`` giving
``data-path`` (its site folder, with ``manifest.csv``), ``state-dir`` (where
site state persists across restarts), ``site-name`` and optionally
``cache-decoded`` (``false``: no decoded copy of the data in ``state-dir``).
In simulation Flower gives only ``partition-id``; it is mapped to the synthetic
hospital ``<data-root>/hospital-<id>`` of the run config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from strategies.errors import ConfigError

__all__ = ["SiteConfig", "SiteConfigError"]


class SiteConfigError(ConfigError):
    """The node_config does not say where the site's data is."""


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise SiteConfigError(f"node_config cache-decoded must be true or false, got {value!r}")


@dataclass(frozen=True)
class SiteConfig:
    """Site-specific paths and name."""

    name: str
    data_path: Path
    state_dir: Path
    cache_decoded: bool = True

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any], data_root: str) -> SiteConfig:
        """Resolve the site from ``node_config`` (deployment) or ``partition-id`` (simulation)."""
        if "data-path" in node_config:
            data_path = Path(str(node_config["data-path"]))
            if not data_path.is_absolute():
                raise SiteConfigError(
                    f"node_config data-path must be absolute, got {str(data_path)!r}")
            name = str(node_config.get("site-name", data_path.name))
            if not name.strip(".") or any(c in name for c in "/\\\0"):
                raise SiteConfigError(f"node_config site-name {name!r} must not be dot-only "
                                      "or hold a path separator")
            state = Path(str(node_config.get("state-dir", data_path / ".fedmed-state")))
            return cls(name=name, data_path=data_path, state_dir=state,
                       cache_decoded=_flag(node_config.get("cache-decoded", True)))
        if "partition-id" in node_config:
            if not data_root:
                raise SiteConfigError(
                    "simulation needs run-config 'data-root' (absolute path of the "
                    "synthetic hospitals); `make simulate` sets it")
            name = f"hospital-{int(node_config['partition-id']):02d}"
            data_path = Path(data_root) / name
            return cls(name=name, data_path=data_path, state_dir=data_path / ".fedmed-state")
        raise SiteConfigError(
            "node_config has neither 'data-path' (deployment) nor 'partition-id' "
            f"(simulation): {dict(node_config)}")
