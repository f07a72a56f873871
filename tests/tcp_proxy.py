"""A TCP proxy in front of a server (PostgreSQL) that a test can cut: :meth:`TcpProxy.cut` resets
every connection through it and refuses new ones (each is reset as soon as it is accepted), as a
network partition that the peers notice would; :meth:`TcpProxy.restore` forwards new connections
again. (tests/db_proxy.py's proxy instead goes silent without closing anything.)

Threads: one accepts; each connection has two that copy bytes, one per direction. Every
blocking call ends when :meth:`cut` or :meth:`close` shuts its socket down; nothing sleeps.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType


def _reset(sock: socket.socket) -> None:
    """Close with a RST (SO_LINGER 0), not a FIN: the peer's next read or write fails at once."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it
    sock.close()


class TcpProxy:
    """Forwards 127.0.0.1:``port`` (a port the kernel picked) to ``host``:``upstream_port``."""

    def __init__(self, host: str, upstream_port: int) -> None:
        self._upstream = (host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._cut = False
        self._closed = False
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self.accepted = 0  # connections forwarded so far
        self.refused = 0  # connections reset on arrival while cut
        self._accepter = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._accepter.start()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def cut(self) -> None:
        """Reset every connection through the proxy, and every new one until :meth:`restore`.
        When it returns, no byte is forwarded any more."""
        with self._lock:
            self._cut = True
            pairs, self._pairs = self._pairs, set()
        for client, server in pairs:
            _reset(client)
            _reset(server)

    def restore(self) -> None:
        """Forward new connections again."""
        with self._lock:
            self._cut = False

    def close(self) -> None:
        """Cut everything and stop listening."""
        with self._lock:
            self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._listener.close()
        self._accepter.join(timeout=10)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    _reset(client)
                    return
                if self._cut:
                    self.refused += 1
                    _reset(client)
                    continue
            try:
                server = socket.create_connection(self._upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            pair = (client, server)
            with self._lock:
                # Cut while connecting upstream: this one goes too.
                if self._cut or self._closed:
                    _reset(client)
                    _reset(server)
                    continue
                self._pairs.add(pair)
                self.accepted += 1
            for src, dst in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pump, args=(pair, src, dst), name="tcp-proxy-pump", daemon=True
                ).start()

    def _pump(
        self, pair: tuple[socket.socket, socket.socket], src: socket.socket, dst: socket.socket
    ) -> None:
        """Copy ``src`` to ``dst`` until either ends; then the connection ends both ways."""
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass  # reset by cut(), or by a peer
        with self._lock:
            mine = pair in self._pairs
            self._pairs.discard(pair)
        if mine:  # the first of the two pumps to finish closes both sockets
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
