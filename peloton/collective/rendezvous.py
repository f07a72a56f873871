"""The rendezvous endpoint of an elastic gang: who is in it now, under which generation.

One protocol for everyone who forms elastic gangs: ``peloton-run --elastic`` serves it for local
runs (the scheduler's daemon is to serve the same protocol for its gangs). Each worker holds one
TCP connection (its session) and speaks JSON lines over it:

- ``{"token", "worker"}`` first: the per-job token (``PELOTON_RENDEZVOUS_TOKEN``) is checked and
  the answer is ``{"ok": true, "min", "max"}`` or ``{"error"}``.
- ``{"op": "join", "addr": "host:port"}``: the worker is ready for the next generation, where its
  runtime will listen at ``addr``. Answered with ``{"op": "membership", "generation", "rank",
  "members"}`` once a generation of at least ``min`` workers forms with it.
- ``{"op": "report", "generation", "reason"}``: a member saw generation fail (a peer died).
- ``{"op": "leave"}``: the worker is done; it leaves the gang for good.
- The endpoint pushes ``{"op": "closed", "generation"}`` to every session when a generation ends
  (a member failed or left, a worker joined): members re-join for the next one.

A generation forms when every live worker has asked to join (at first, when the expected number
has) and they are at least ``min``; the first ``max`` of them, survivors first in their old rank
order, become ranks ``0..n-1``. A session that drops (its process died) removes its worker. The
generation is an increasing integer; the runtime refuses peers of another one.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class RendezvousError(RuntimeError):
    """The endpoint refused us, went away, or no generation formed in time (the message says)."""


@dataclass(frozen=True)
class Membership:
    """One generation of the gang, as one worker sees it."""

    generation: int
    rank: int
    # ``host:port`` where each rank's runtime listens, in rank order.
    members: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.members)


def _send(sock: socket.socket, lock: threading.Lock, msg: dict[str, Any]) -> None:
    with lock:
        sock.sendall(json.dumps(msg).encode() + b"\n")


@dataclass
class _Worker:
    """A connected worker, as the server tracks it."""

    ident: str
    sock: socket.socket
    lock: threading.Lock
    seq: int
    addr: str | None = None  # set while it waits to join


class RendezvousServer:
    """Holds the gang's membership; one thread per worker session."""

    def __init__(
        self,
        token: str,
        min_size: int,
        max_size: int,
        expect: int,
        host: str = "127.0.0.1",
        log: Callable[[str], None] | None = None,
    ) -> None:
        if not 1 <= min_size <= max_size:
            raise ValueError(f"need 1 <= min ({min_size}) <= max ({max_size})")
        self.token = token
        self.min_size, self.max_size = min_size, max_size
        # The first generation waits for this many (later ones for every live worker).
        self._expect = max(min_size, min(expect, max_size))
        self._log = log or (lambda _: None)
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._members: list[str] = []  # worker ids of the current generation, in rank order
        self.generation = 0
        self._closed = True  # the current generation ended (or none formed yet)
        self._seq = 0
        self._listener = socket.create_server((host, 0))
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name="rendezvous").start()

    def close(self) -> None:
        """Stops serving and drops every session."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for w in self._workers.values():
                with contextlib.suppress(OSError):
                    w.sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> RendezvousServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(sock,), daemon=True).start()

    def _session(self, sock: socket.socket) -> None:
        lock = threading.Lock()
        ident: str | None = None
        try:
            lines = sock.makefile("rb")
            hello = json.loads(lines.readline() or b"null")
            if not isinstance(hello, dict) or not hmac.compare_digest(
                str(hello.get("token", "")).encode(), self.token.encode()
            ):
                _send(sock, lock, {"error": "rendezvous: wrong token for this gang"})
                return
            ident = str(hello.get("worker", ""))
            with self._lock:
                if not ident or ident in self._workers:
                    _send(sock, lock, {"error": f"rendezvous: worker id {ident!r} is taken"})
                    ident = None
                    return
                self._seq += 1
                self._workers[ident] = _Worker(ident, sock, lock, self._seq)
            _send(sock, lock, {"ok": True, "min": self.min_size, "max": self.max_size})
            for line in lines:
                self._handle(ident, json.loads(line))
        except (OSError, ValueError):
            pass
        finally:
            if ident is not None:
                self._drop(ident, "its session closed")
            with contextlib.suppress(OSError):
                sock.close()

    def _handle(self, ident: str, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        with self._lock:
            if op == "join":
                self._workers[ident].addr = str(msg["addr"])
                if not self._closed and ident not in self._members:
                    self._close(f"worker {ident} joined")
                self._try_form()
            elif op == "report":
                if int(msg.get("generation", -1)) == self.generation and not self._closed:
                    self._close(f"worker {ident} reported: {msg.get('reason', '')}")
                    self._try_form()
            elif op == "leave":
                self._remove(ident, "it left")

    def _drop(self, ident: str, why: str) -> None:
        with self._lock:
            self._remove(ident, why)

    def _remove(self, ident: str, why: str) -> None:
        if self._workers.pop(ident, None) is None:
            return
        self._log(f"worker {ident} removed: {why}")
        if self.generation == 0:
            self._expect = max(self.min_size, self._expect - 1)
        if ident in self._members and not self._closed:
            self._close(f"member {ident} is gone ({why})")
        self._try_form()

    def _close(self, why: str) -> None:
        """Ends the current generation and tells every session (the lock is held)."""
        self._closed = True
        self._log(f"generation {self.generation} closed: {why}")
        for w in self._workers.values():
            with contextlib.suppress(OSError):
                _send(w.sock, w.lock, {"op": "closed", "generation": self.generation})

    def _try_form(self) -> None:
        """Forms the next generation if every live worker is waiting for it (the lock is held)."""
        if not self._closed:
            return
        waiting = [w for w in self._workers.values() if w.addr is not None]
        enough = self._expect if self.generation == 0 else self.min_size
        if len(waiting) < enough or len(waiting) < len(self._workers):
            return
        old = {ident: r for r, ident in enumerate(self._members)}
        # Survivors first in their old order, so rank 0 (whose state sync() sends) has state.
        waiting.sort(key=lambda w: (old.get(w.ident, math.inf), w.seq))
        chosen = waiting[: self.max_size]
        self.generation += 1
        self._closed = False
        self._members = [w.ident for w in chosen]
        addrs = [str(w.addr) for w in chosen]
        self._log(f"generation {self.generation}: {len(chosen)} workers")
        for rank, w in enumerate(chosen):
            w.addr = None
            with contextlib.suppress(OSError):
                msg = {"op": "membership", "generation": self.generation, "rank": rank}
                _send(w.sock, w.lock, msg | {"members": addrs})


class RendezvousClient:
    """One worker's session with the endpoint; a reader thread takes the endpoint's pushes."""

    def __init__(self, address: str, token: str, worker: str, timeout: float) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self.timeout = timeout
        try:
            self._sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        except (OSError, ValueError) as exc:
            raise RendezvousError(
                f"cannot reach the rendezvous endpoint {address}: {exc}"
            ) from None
        self._sock.settimeout(None)
        # The address this host reaches the endpoint from: peers can reach our runtime there.
        self.local_host = str(self._sock.getsockname()[0])
        self._wlock = threading.Lock()
        self._lines = self._sock.makefile("rb")
        _send(self._sock, self._wlock, {"token": token, "worker": worker})
        hello = self._read()
        if hello is None or "error" in hello:
            raise RendezvousError(
                hello["error"] if hello else f"rendezvous endpoint {address} closed the session"
            )
        self.min_size, self.max_size = int(hello["min"]), int(hello["max"])
        self._answers: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._closed_gen = 0
        self._gone = False
        threading.Thread(target=self._reader, daemon=True, name="rendezvous-client").start()

    def _read(self) -> dict[str, Any] | None:
        line = self._lines.readline()
        return json.loads(line) if line else None

    def _reader(self) -> None:
        try:
            while (msg := self._read()) is not None:
                if msg.get("op") == "closed":
                    with self._cond:
                        self._closed_gen = max(self._closed_gen, int(msg["generation"]))
                        self._cond.notify_all()
                else:
                    self._answers.put(msg)
        except (OSError, ValueError):
            pass
        with self._cond:
            self._gone = True
            self._cond.notify_all()
        self._answers.put(None)

    def join(self, addr: str) -> Membership:
        """Waits (up to the timeout) for a generation of at least ``min`` workers with us in it;
        our runtime will listen at ``addr``."""
        _send(self._sock, self._wlock, {"op": "join", "addr": addr})
        try:
            msg = self._answers.get(timeout=self.timeout)
        except queue.Empty:
            raise RendezvousError(
                f"no generation of at least min={self.min_size} workers formed within "
                f"{self.timeout:g} s (waited on the rendezvous endpoint {self.address}): the gang "
                "is below its minimum size"
            ) from None
        if msg is None:
            raise RendezvousError(f"the rendezvous endpoint {self.address} went away")
        if "error" in msg:
            raise RendezvousError(str(msg["error"]))
        return Membership(int(msg["generation"]), int(msg["rank"]), tuple(msg["members"]))

    def closed(self, generation: int) -> bool:
        """Whether ``generation`` has ended (the endpoint said so, or went away)."""
        with self._cond:
            return self._gone or self._closed_gen >= generation

    def watch(self, generation: int, timeout: float | None = None) -> bool:
        """Waits until ``generation`` ends; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._gone or self._closed_gen >= generation, timeout
            )

    def report_failure(self, generation: int, reason: str) -> None:
        """Tells the endpoint that ``generation`` failed here (e.g. a peer died)."""
        with contextlib.suppress(OSError):
            _send(
                self._sock,
                self._wlock,
                {"op": "report", "generation": generation, "reason": reason},
            )

    def leave(self) -> None:
        """Leaves the gang for good and closes the session."""
        with contextlib.suppress(OSError):
            _send(self._sock, self._wlock, {"op": "leave"})
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def free_port(host: str) -> int:
    """A TCP port the kernel says is free on ``host`` now (the runtime listens there next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
