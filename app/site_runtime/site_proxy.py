"""The hospital's way out: its SuperNode reaches the SuperLink through an HTTP(S) proxy.

Flower 1.42's SuperNode talks to the SuperLink's Fleet API over HTTPS with
``httpx`` (``flwr.supercore.protobuf.client.ProtobufClient``, ``trust_env`` on),
so it honours ``HTTPS_PROXY`` and tunnels TLS through the proxy with HTTP
``CONNECT``: the proxy sees the SuperLink's host and port, never the content;
TLS and the node's key authentication stay end to end. Its other connections
are plain ``http://`` to its own runtime API on loopback.

The site's ``proxy`` key (``site.toml``, ``fedmed site init --proxy``, the
``supernode --proxy`` option) becomes the SuperNode's environment here:
``HTTPS_PROXY`` (both spellings) and a ``NO_PROXY`` that exempts only the
node's loopback ``http://`` APIs, replacing an inherited ``NO_PROXY`` so that no
host pattern sends the SuperLink's connection around the proxy. Without the key
the SuperNode keeps the environment it was started with (an ``HTTPS_PROXY``
there is honoured as well).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from app.tooling.errors import FlowerProcessError

__all__ = ["LOOPBACK_NO_PROXY", "check_proxy", "proxy_env"]

#: httpx's NO_PROXY entries with a scheme match that scheme only: loopback
#: ``http://`` (the node's runtime API) is direct, ``https://`` (the SuperLink,
#: wherever it is) always goes through the proxy.
LOOPBACK_NO_PROXY = "http://127.0.0.1,http://localhost,http://[::1]"


def check_proxy(proxy: str) -> str:
    """``proxy`` if it is ``http://host:port`` or ``https://host:port`` (credentials allowed).

    Raises
    ------
    FlowerProcessError
        Naming the ``proxy`` key and the rule it breaks.
    """
    try:
        parts = urlsplit(proxy)
        port = parts.port
    except ValueError as exc:
        raise FlowerProcessError(f"proxy {proxy!r}: not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise FlowerProcessError(f"proxy {proxy!r}: the scheme must be http:// or https:// "
                                 "(an HTTP proxy that allows CONNECT)")
    if not parts.hostname or port is None:
        raise FlowerProcessError(f"proxy {proxy!r}: give the host and the port, e.g. "
                                 "http://proxy.hospital.example:3128")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise FlowerProcessError(f"proxy {proxy!r}: no path, query or fragment "
                                 "(only scheme://[user:password@]host:port)")
    return proxy


def proxy_env(proxy: str) -> dict[str, str]:
    """The environment entries that send the SuperNode's HTTPS through ``proxy``."""
    check_proxy(proxy)
    return {"HTTPS_PROXY": proxy, "https_proxy": proxy,
            "NO_PROXY": LOOPBACK_NO_PROXY, "no_proxy": LOOPBACK_NO_PROXY}
