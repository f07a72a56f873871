"""A TCP proxy in front of a database that a test can silence: it then stops forwarding in both
directions without closing anything, as a stalled server or a partitioned network would (a
reset would be noticed at once; silence is what timeouts are for)."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class StallingProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream`` while flowing; holds every byte while silent."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.connections = 0  # accepted so far
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def __enter__(self) -> StallingProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def silence(self) -> None:
        """Stop forwarding; connections stay open and new ones are accepted, then ignored."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again, what was held first."""
        self._flowing.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = [self._listener, *self._sockets]
        self._flowing.set()  # wakes the pumps, which then find the sockets closed
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
                self.connections += 1
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            self._flowing.wait()  # silent: hold what arrived (an end of stream too)
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return
