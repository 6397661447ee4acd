"""Register a site's SuperNode public key with the SuperLink (``make register``).

Flower keeps no site names, so the name -> node id map is kept in
``superlink/sites.json`` next to the SuperLink's database; ``make supernodes``
reads it to print site names.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from app.tooling.certs import check_site_name
from app.tooling.errors import FlowerProcessError
from app.tooling.flwr_cli import CONNECTION, cli_error, flwr, json_out
from app.tooling.layout import DeployLayout

__all__ = ["register_site", "read_registry"]

_KEY_IN_USE = "Public key already in use"


def read_registry(path: Path) -> dict[str, dict]:
    """``sites.json``: site name -> {node-id, public-key, registered-at} ({} if absent)."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise FlowerProcessError(f"cannot read the site registry {path}: {exc}") from exc


def _write_registry(path: Path, registry: dict[str, dict]) -> None:
    """Replace ``sites.json`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(registry, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def register_site(layout: DeployLayout, flwr_home: Path, site: str,
                  public_key: Path | None = None, connection: str = CONNECTION) -> int:
    """Register ``site``'s public key with the SuperLink; returns its node id.

    Idempotent: a key registered before (recorded in ``sites.json``) returns its
    node id. A key registered for another site, or a site registered with
    another key, is refused with the command that would undo it.
    """
    check_site_name(site)
    # absolute: `flwr supernode register` runs in another folder than the caller
    public_key = Path(public_key).resolve() if public_key else layout.public_key(site)
    if not public_key.is_file():
        raise FlowerProcessError(f"public key {public_key} not found; the hospital sends "
                                 "its supernode.pub (never its private key)")
    key_text = public_key.read_text(encoding="utf-8").split()
    key_id = " ".join(key_text[:2])
    registry = read_registry(layout.registry)
    owner = next((name for name, entry in registry.items()
                  if entry.get("public-key") == key_id), None)
    if owner not in (None, site):
        raise FlowerProcessError(f"this key is already registered for site {owner}; "
                                 "every site needs its own key pair")
    known = registry.get(site)
    if known and known.get("public-key") != key_id:
        raise FlowerProcessError(
            f"site {site} is already registered as node {known['node-id']} with another "
            f"key; unregister it first: flwr supernode unregister {known['node-id']} "
            f"{connection}, then remove it from {layout.registry}")
    result = flwr(flwr_home, ["supernode", "register", str(public_key), connection,
                              "--name", site, "--format", "json"])
    payload = json_out(result)
    in_use = _KEY_IN_USE in result.stdout + result.stderr
    if payload.get("success"):
        node_id = int(payload["node-id"])
    elif in_use and known:
        return int(known["node-id"])
    elif in_use:
        raise FlowerProcessError(
            f"the key of {site} is registered already but not in {layout.registry}; "
            f"find its node id with `flwr supernode list {connection}`")
    else:
        raise FlowerProcessError(f"flwr supernode register failed: "
                                 f"{cli_error(result, payload)}")
    registry[site] = {"node-id": str(node_id), "public-key": key_id,
                      "registered-at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write_registry(layout.registry, registry)
    return node_id
