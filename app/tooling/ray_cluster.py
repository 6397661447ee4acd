"""Ray clusters for ``make simulate RAY_ADDRESS=host:port``: the address check and a local cluster.

Flower's simulation engine (``flwr-simulation``, started by the simulation
SuperLink) builds its :class:`RayBackend`, which calls ``ray.init()`` with no
address and only the federation config's ``init-args`` (``num-cpus``,
``num-gpus``, ``logging-level``, ``log-to-driver``; Flower 1.41
``flwr/server/superlink/fleet/vce/backend/raybackend.py``). Ray then takes the
``RAY_ADDRESS`` environment variable (``ray/_private/worker.py``, ``init``) and
attaches to that cluster instead of starting its own, so the address reaches
the engine through the SuperLink's environment, which its ``flwr-simulation``
process inherits. The init args must not set ``num-cpus``/``num-gpus`` then
(Ray refuses them when it attaches); ``make simulate`` never does.

:func:`require_reachable` is the check ``make simulate`` runs before it starts
anything. The loopback test cluster is ``tests/fixtures/ray_cluster.py``.
"""

from __future__ import annotations

import socket

from app.tooling.errors import FlowerProcessError

__all__ = ["require_reachable"]

def require_reachable(address: str, timeout: float = 5.0) -> str:
    """Check that ``host:port`` (a Ray head's GCS port) accepts TCP connections.

    Returns the address unchanged; raises :class:`FlowerProcessError` naming
    ``RAY_ADDRESS`` when it is malformed or nothing answers there.
    """
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise FlowerProcessError(f"RAY_ADDRESS={address!r}: expected host:port of a Ray head "
                                 "(the --port of `ray start --head`, 6379 by default)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise FlowerProcessError(
            f"RAY_ADDRESS={address}: no Ray cluster can be reached there ({exc}); start one "
            f"with `ray start --head --port {port}` on {host}, or leave RAY_ADDRESS unset "
            "to run on a Ray started for this simulation") from exc
    return address
