"""Status update acknowledgements, pipelined on a connection of their own.

Every task start brings two status updates (TASK_STARTING, TASK_RUNNING), each acknowledged with
an ACKNOWLEDGE call once it is persisted. Through the driver that is one HTTP request and answer
per update, each waiting for the last, on the connection the launcher's ACCEPTs also need. Here a
batch of acknowledgements is written at once on a keep-alive connection (HTTP/1.1 pipelining: the
master answers in order) and the answers are read after, so a burst of thousands costs a few
round trips and little CPU. A failed acknowledgement needs no retry here: Mesos re-sends an
update until it is acknowledged, and a re-sent update is acknowledged again.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

PATH = "/api/v1/scheduler"
# Requests written before their answers are read: the answers (~100 bytes each) must fit in the
# socket buffers, or the master would block writing them while we block writing requests.
WINDOW = 256
TIMEOUT_SECONDS = 30.0
# Bytes of answers held unparsed at most (a window of answers is a few tens of KiB).
MAX_HEAD = 16 * 1024 * 1024


class Acknowledger:
    """Sends ACKNOWLEDGE calls for one framework subscription (``send`` from one thread)."""

    def __init__(self, timeout: float = TIMEOUT_SECONDS) -> None:
        self._timeout = timeout
        self._address = ""
        self._sock: socket.socket | None = None
        self._buffer = bytearray()  # received, not yet parsed

    def send(
        self,
        master: str,
        stream_id: str,
        framework_id: str,
        statuses: Sequence[Mapping[str, Any]],
        headers: Mapping[str, str] | None = None,
    ) -> int:
        """Acknowledge ``statuses`` (those with a uuid) to ``master`` (host:port); returns how
        many the master accepted. Errors are logged, never raised."""
        calls = [_body(framework_id, s) for s in statuses if "uuid" in s]
        accepted = 0
        try:
            for i in range(0, len(calls), WINDOW):
                accepted += self._exchange(master, stream_id, calls[i : i + WINDOW], headers)
        except (OSError, ValueError) as exc:
            log.warning(
                "acknowledgements failed; Mesos re-sends the updates",
                extra={"error": str(exc), "unacknowledged": len(calls) - accepted},
            )
            self.close()
        return accepted

    def _exchange(
        self,
        master: str,
        stream_id: str,
        bodies: Sequence[bytes],
        headers: Mapping[str, str] | None,
    ) -> int:
        if self._sock is None or self._address != master:
            self.close()
            host, port = master.rsplit(":", 1)
            self._sock = socket.create_connection((host, int(port)), timeout=self._timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._address = master
        head = (
            f"POST {PATH} HTTP/1.1\r\nHost: {master}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nMesos-Stream-Id: {stream_id}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        ).encode()
        self._sock.sendall(
            b"".join(head + b"Content-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies)
        )
        accepted = 0
        for _ in bodies:
            status, body, keep = self._response()
            if 200 <= status < 300:
                accepted += 1
            else:
                log.warning(
                    "acknowledgement refused",
                    extra={"status": status, "body": body[:200].decode(errors="replace")},
                )
            if not keep:
                self.close()
                break
        return accepted

    def _response(self) -> tuple[int, bytes, bool]:
        """(status, body, whether the connection stays open) of the next answer. Parsed from
        the received bytes directly: answers come by the thousand, and a buffered reader's
        line-by-line reading cost more than the rest of an acknowledgement."""
        assert self._sock is not None
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            self._receive()
        status, length, keep = _parse_head(bytes(self._buffer[:end]))
        start = end + 4
        while len(self._buffer) < start + length:
            self._receive()
        body = bytes(self._buffer[start : start + length])
        del self._buffer[: start + length]
        return status, body, keep

    def _receive(self) -> None:
        assert self._sock is not None
        data = self._sock.recv(65536)
        if not data:
            raise ValueError("the master closed the connection")
        if len(self._buffer) + len(data) > MAX_HEAD:
            raise ValueError("answer too large for an acknowledgement")
        self._buffer += data

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._buffer.clear()


def _body(framework_id: str, status: Mapping[str, Any]) -> bytes:
    return json.dumps(
        {
            "type": "ACKNOWLEDGE",
            "framework_id": {"value": framework_id},
            "acknowledge": {
                "agent_id": status["agent_id"],
                "task_id": status["task_id"],
                "uuid": status["uuid"],
            },
        }
    ).encode()


def _parse_head(head: bytes) -> tuple[int, int, bool]:
    """(status, content length, whether the connection stays open) of a response's head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
    length = 0
    keep = parts[0] == b"HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection":
            keep = value.strip().lower() != b"close"
        elif name == b"transfer-encoding":
            raise ValueError("chunked answer to an acknowledgement")
    return int(parts[1]), length, keep
