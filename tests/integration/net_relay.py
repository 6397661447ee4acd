"""A byte relay between a TCP port and a unix socket: the only way out of a test's netns.

A SuperNode in a fresh network namespace (``unshare --net``) has only its own
loopback. The test bridges it to the host's proxy with two relays over a unix
socket in the shared file system:

* inside the namespace, ``python net_relay.py tcp-to-unix PORT SOCKET`` listens on
  ``127.0.0.1:PORT`` (the node's ``HTTPS_PROXY``) and forwards each connection to
  ``SOCKET``;
* on the host, :class:`UnixToTcpRelay` (threads in the test process) accepts on
  ``SOCKET`` and forwards to the proxy's TCP port. :meth:`UnixToTcpRelay.cut` is the
  network loss (every connection dropped, new ones refused) and
  :meth:`UnixToTcpRelay.restore` its end.

Standard library only: the inner relay runs as a script inside the namespace.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path

__all__ = ["UnixToTcpRelay"]


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until either side closes; then close both."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


def _bridge(client: socket.socket, upstream: socket.socket) -> None:
    for source, sink in ((client, upstream), (upstream, client)):
        threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


class UnixToTcpRelay:
    """Accept on the unix socket ``path`` and forward each connection to ``127.0.0.1:port``."""

    def __init__(self, path: Path, port: int) -> None:
        self.path, self.port = Path(path), port
        self.connections = 0  # connections forwarded so far
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._listener: socket.socket | None = None

    def restore(self) -> None:
        """Listen (again): new connections are forwarded."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """The network is gone: stop listening (connects are refused), drop every connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            self.path.unlink(missing_ok=True)
        with self._lock:
            dropped, self._open = self._open, []
        for sock in dropped:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    upstream.close()
                    return
                self._open += [client, upstream]
                self.connections += 1
            _bridge(client, upstream)


def _tcp_to_unix(port: int, path: str) -> None:
    """Inside the namespace: ``127.0.0.1:port`` -> the unix socket ``path`` (forever)."""
    listener = socket.create_server(("127.0.0.1", port))
    print(f"relay listening on 127.0.0.1:{port} -> {path}", flush=True)
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:  # the host side is cut: refuse as a dead network would
            upstream.close()
            client.close()
            continue
        _bridge(client, upstream)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "tcp-to-unix":
        sys.exit(f"usage: {os.path.basename(sys.argv[0])} tcp-to-unix PORT SOCKET")
    _tcp_to_unix(int(sys.argv[2]), sys.argv[3])
