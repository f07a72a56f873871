"""Scheduler calls the host manager makes most, pipelined on connections of their own.

Every task start brings two status updates (TASK_STARTING, TASK_RUNNING), each acknowledged with
an ACKNOWLEDGE call once it is persisted, and every gang launch an ACCEPT per host. Through the
driver each call is one HTTP request and answer, each waiting for the last under the driver's
one lock (the launch workers' ACCEPTs queued behind each other and behind acknowledgements), and
parsed by ``http.client``. Here a batch of calls is written at once on a keep-alive connection
(HTTP/1.1 pipelining: the master answers in order) and the answers are read after, so a burst of
thousands costs a few round trips and little CPU: :class:`Acknowledger` on one connection, and
:class:`Pipes` for the launch workers, a connection per thread. A failed acknowledgement needs no
retry: Mesos re-sends an update until it is acknowledged, and a re-sent update is acknowledged
again.

:class:`Credential` is how every request (SUBSCRIBE and the calls) authenticates the framework to a
master with HTTP framework authentication (``--authenticate_http_frameworks``, the ``basic``
authenticator): HTTP Basic with the principal and the secret of ``mesos_secret_file``.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import socket
import stat
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from peloton.errors import InvalidArgument

log = logging.getLogger(__name__)

PATH = "/api/v1/scheduler"
# Requests written before their answers are read: the answers (~100 bytes each) must fit in the
# socket buffers, or the master would block writing them while we block writing requests.
WINDOW = 256
TIMEOUT_SECONDS = 30.0
# Bytes of answers held unparsed at most (a window of answers is a few tens of KiB).
MAX_HEAD = 16 * 1024 * 1024


# Why a ':' in a principal or secret is refused (libprocess's basic authenticator; on Mesos 1.11
# a principal whose secret in --credentials is "a:b" is answered 401 for "principal:a:b").
_SPLIT = "the master splits the decoded credential at every ':' and wants exactly two parts"


@dataclass(frozen=True)
class Credential:
    """The framework's principal and secret, as Mesos's ``basic`` HTTP authenticator takes them.
    The secret is left out of ``repr`` (and so out of logs and dumps)."""

    principal: str
    secret: str = field(repr=False)

    @property
    def authorization(self) -> str:
        """The ``Authorization`` header's value: ``Basic base64(principal:secret)``."""
        token = base64.b64encode(f"{self.principal}:{self.secret}".encode()).decode("ascii")
        return f"Basic {token}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": self.authorization}


def read_credential(principal: str, secret_file: str) -> Credential | None:
    """The credential of ``principal`` with the secret in ``secret_file`` (None without a file).

    The file holds the secret alone; trailing line breaks are dropped. As ssh does with a private
    key, a file that others may read or write is refused; so are a principal or secret with a
    ':' (see ``_SPLIT``) and a file of several lines. InvalidArgument naming the option and the
    reason, never the secret."""
    if not secret_file:
        return None
    if not principal:
        raise InvalidArgument(
            "mesos_secret_file", "needs mesos_principal: the secret authenticates that principal"
        )
    if ":" in principal:
        raise InvalidArgument(
            "mesos_principal",
            f"contains ':', which can never authenticate: {_SPLIT}",
        )
    try:
        fd = os.open(secret_file, os.O_RDONLY)
    except OSError as exc:
        raise InvalidArgument(
            "mesos_secret_file", f"cannot read {secret_file}: {exc.strerror}"
        ) from None
    try:
        info = os.fstat(fd)  # of the file opened: a swap after a check by name changes nothing
        if not stat.S_ISREG(info.st_mode):
            raise InvalidArgument("mesos_secret_file", f"{secret_file} is not a regular file")
        if info.st_mode & 0o007:
            mode = stat.S_IMODE(info.st_mode)
            raise InvalidArgument(
                "mesos_secret_file",
                f"permissions {mode:04o} for {secret_file} are too open: others may access it; "
                f"run chmod 600 {secret_file} (or 640, group-readable by a group of the daemon's "
                "user)",
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
    finally:
        os.close(fd)
    try:
        secret = data.decode().rstrip("\r\n")
    except UnicodeDecodeError:
        raise InvalidArgument("mesos_secret_file", f"{secret_file} is not UTF-8 text") from None
    for problem, bad in (
        ("is empty", not secret),
        (
            "holds more than one line: it must hold the secret alone",
            "\n" in secret or "\r" in secret,
        ),
        (f"holds a secret with ':', which can never authenticate: {_SPLIT}", ":" in secret),
    ):
        if bad:
            raise InvalidArgument("mesos_secret_file", f"{secret_file} {problem}")
    return Credential(principal, secret)


@dataclass(frozen=True)
class Stream:
    """Where calls of one framework subscription go: the master (host:port), the stream id it
    gave, and extra headers (credentials)."""

    master: str
    stream_id: str
    headers: Mapping[str, str] | None = None


class Pipe:
    """One keep-alive connection to the master, calls pipelined on it (from one thread)."""

    def __init__(self, timeout: float = TIMEOUT_SECONDS) -> None:
        self._timeout = timeout
        self._address = ""
        self._sock: socket.socket | None = None
        self._buffer = bytearray()  # received, not yet parsed

    def exchange(self, stream: Stream, bodies: Sequence[bytes]) -> list[tuple[int, bytes]]:
        """Send ``bodies`` (JSON calls) and return each answer's (status, body), in order.
        Raises OSError or ValueError (the connection is then closed) if the connection fails;
        answers not read then are unknown."""
        answers: list[tuple[int, bytes]] = []
        try:
            for i in range(0, len(bodies), WINDOW):
                answers += self._window(stream, bodies[i : i + WINDOW])
        except (OSError, ValueError):
            self.close()
            raise
        return answers

    def _window(self, stream: Stream, bodies: Sequence[bytes]) -> list[tuple[int, bytes]]:
        sock = self._sock
        if sock is None or self._address != stream.master:
            self.close()
            host, port = stream.master.rsplit(":", 1)
            sock = self._sock = socket.create_connection((host, int(port)), timeout=self._timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._address = stream.master
        head = (
            f"POST {PATH} HTTP/1.1\r\nHost: {stream.master}\r\n"
            f"Content-Type: application/json\r\nAccept: application/json\r\n"
            f"Mesos-Stream-Id: {stream.stream_id}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in (stream.headers or {}).items())
        ).encode()
        sock.sendall(b"".join(head + b"Content-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies))
        answers = []
        for _ in bodies:
            status, body, keep = self._response()
            answers.append((status, body))
            if not keep:
                self.close()
                if len(answers) < len(bodies):
                    raise ValueError("the master closed the connection mid-pipeline")
                break
        return answers

    def _response(self) -> tuple[int, bytes, bool]:
        """(status, body, whether the connection stays open) of the next answer. Parsed from
        the received bytes directly: answers come by the thousand, and a buffered reader's
        line-by-line reading cost more than the rest of an acknowledgement."""
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
        sock = self._sock
        if sock is None:
            raise ValueError("the connection was closed")
        data = sock.recv(65536)
        if not data:
            raise ValueError("the master closed the connection")
        if len(self._buffer) + len(data) > MAX_HEAD:
            raise ValueError("answer too large")
        self._buffer += data

    def close(self) -> None:
        """Close the connection; a thread waiting on it (another's) wakes with an error."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._buffer.clear()


class Pipes:
    """A :class:`Pipe` per calling thread (the launch workers call at once)."""

    def __init__(self, timeout: float = TIMEOUT_SECONDS) -> None:
        self._timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[Pipe] = []

    def exchange(self, stream: Stream, bodies: Sequence[bytes]) -> list[tuple[int, bytes]]:
        """:meth:`Pipe.exchange` on this thread's connection."""
        pipe: Pipe | None = getattr(self._local, "pipe", None)
        if pipe is None:
            pipe = self._local.pipe = Pipe(self._timeout)
            with self._lock:
                self._all.append(pipe)
        return pipe.exchange(stream, bodies)

    def close(self) -> None:
        with self._lock:
            for pipe in self._all:
                pipe.close()


class Acknowledger:
    """Sends ACKNOWLEDGE calls for one framework subscription (``send`` from one thread)."""

    def __init__(self, timeout: float = TIMEOUT_SECONDS) -> None:
        self._pipe = Pipe(timeout)

    def send(self, stream: Stream, framework_id: str, statuses: Sequence[Mapping[str, Any]]) -> int:
        """Acknowledge ``statuses`` (those with a uuid); returns how many the master accepted.
        Errors are logged, never raised."""
        calls = [_body(framework_id, s) for s in statuses if "uuid" in s]
        try:
            answers = self._pipe.exchange(stream, calls)
        except (OSError, ValueError) as exc:
            log.warning(
                "acknowledgements failed; Mesos re-sends the updates",
                extra={"error": str(exc), "unacknowledged": len(calls)},
            )
            return 0
        for status, body in answers:
            if not 200 <= status < 300:
                log.warning(
                    "acknowledgement refused",
                    extra={"status": status, "body": body[:200].decode(errors="replace")},
                )
        return sum(1 for status, _ in answers if 200 <= status < 300)

    def close(self) -> None:
        self._pipe.close()


def accept_body(
    framework_id: str, offer_ids: Sequence[str], operations: Sequence[Any], filters: Any
) -> bytes:
    """An ACCEPT call, as the driver's ``acceptOffers`` sends it (orjson: a gang's ACCEPTs
    carry every rank's address in every task's environment, and the json module took a tenth
    of the daemon's interpreter encoding them)."""
    return orjson.dumps(
        {
            "type": "ACCEPT",
            "framework_id": {"value": framework_id},
            "accept": {
                "offer_ids": [{"value": i} for i in offer_ids],
                "operations": list(operations),
                "filters": filters,
            },
        }
    )


def _body(framework_id: str, status: Mapping[str, Any]) -> bytes:
    return orjson.dumps(
        {
            "type": "ACKNOWLEDGE",
            "framework_id": {"value": framework_id},
            "acknowledge": {
                "agent_id": status["agent_id"],
                "task_id": status["task_id"],
                "uuid": status["uuid"],
            },
        }
    )


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
            raise ValueError("chunked answer to a call")
    return int(parts[1]), length, keep
