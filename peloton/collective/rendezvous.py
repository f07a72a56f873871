"""The rendezvous endpoint of an elastic gang: who is in it now, under which generation.

One protocol for everyone who forms elastic gangs: ``peloton-run --elastic`` serves it for local
runs and the scheduler's daemon serves it for its gangs (one :class:`RendezvousServer` per elastic
job). Each worker holds one TCP connection (its session) and speaks JSON lines over it:

- ``{"token", "worker"}`` first: the per-job token (``PELOTON_RENDEZVOUS_TOKEN``) is checked and
  the answer is ``{"ok": true, "min", "max"}`` or ``{"error"}``. ``worker`` is the worker's id:
  its task's ``PELOTON_ATTEMPT_ID`` under the scheduler, a random one otherwise.
- ``{"op": "join", "addr": "host:port"}``: the worker is ready for the next generation, where its
  runtime will listen at ``addr``. Answered with ``{"op": "membership", "generation", "rank",
  "members"}`` once a generation of at least ``min`` workers forms with it; with ``{"op":
  "drained", "reason"}`` if the worker was drained (it is never a member again); with ``{"op":
  "finished"}`` once the gang has finished (a worker sent ``done``).
- ``{"op": "report", "generation", "reason", "steps_lost"}``: a member saw the generation fail (a
  peer died) and rolls back to its last commit, throwing away ``steps_lost`` training steps.
- ``{"op": "drain", "reason"}``: the worker asks to be drained (e.g. it got SIGTERM): the same as
  :meth:`RendezvousServer.drain` of it.
- ``{"op": "done"}``: the training function returned on this worker: the gang has finished.
- ``{"op": "leave"}``: the worker is done; it leaves the gang for good.
- The endpoint pushes ``{"op": "closed", "generation"}`` to every session when a generation ends
  (a member failed, left, was drained or removed; a worker joined): members re-join for the next.

A generation forms when every live worker that is not drained has asked to join (at first, when
the expected number has) and they are at least ``min``; the first ``max`` of them, survivors first
in their old rank order, become ranks ``0..n-1``. A session that drops (its process died) removes
its worker. The generation is an increasing integer; the runtime refuses peers of another one.

The scheduler drives the server with :meth:`RendezvousServer.drain` (shrinking the gang
gracefully: the drained members stop at their next commit with the state kept) and
:meth:`RendezvousServer.remove` (a worker's host was lost), and learns what happens through the
``on_generation`` and ``on_rollback`` callbacks, which run in order on one thread of their own,
outside the server's lock.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


class RendezvousError(RuntimeError):
    """The endpoint refused us, went away, or no generation formed in time (the message says)."""


class Drained(RendezvousError):
    """The scheduler took this worker out of the gang (``reason`` says why): it is never a
    member again and should leave."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"drained by the scheduler ({reason})")
        self.reason = reason


class GangFinished(RendezvousError):
    """The gang finished (a worker's training function returned) before this worker joined."""


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


@dataclass(frozen=True)
class Generation:
    """One generation of the gang, as the server formed it (``on_generation``'s argument)."""

    number: int
    # Worker ids, in rank order.
    members: tuple[str, ...]
    # The members of the previous generation (``()`` for the first).
    previous: tuple[str, ...]
    # Seconds from the end of the previous generation (from the server's creation for the
    # first) to this one forming: how long the gang was not training.
    waited: float


def _encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg).encode() + b"\n"


def _send(sock: socket.socket, lock: threading.Lock, msg: dict[str, Any]) -> None:
    with lock:
        sock.sendall(_encode(msg))


@dataclass
class _Worker:
    """A connected worker, as the server tracks it."""

    ident: str
    sock: socket.socket
    lock: threading.Lock
    seq: int
    addr: str | None = None  # set while it waits to join

    def send(self, msg: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            _send(self.sock, self.lock, msg)


class RendezvousServer:
    """Holds the gang's membership; one thread per worker session.

    ``on_generation(Generation)`` is called once per generation formed. ``on_rollback(steps)``
    is called once per failed generation (one that members reported failed), with the most
    training steps any of its reporting members lost to the rollback (``steps_lost`` of their
    reports; reports of drained workers do not count). It is called when the next generation
    forms, just before that one's ``on_generation`` (every surviving member reports before it
    re-joins, so all their reports are in by then), or at :meth:`close` if none formed after the
    failure. Both run on one dispatcher thread, in the order the events happened, outside the
    server's lock: a slow callback delays later callbacks, never the rendezvous. An exception in
    a callback is logged and dropped. Nothing is called after :meth:`close` but what was due
    before it.
    """

    def __init__(
        self,
        token: str,
        min_size: int,
        max_size: int,
        expect: int,
        host: str = "127.0.0.1",
        log: Callable[[str], None] | None = None,
        *,
        on_generation: Callable[[Generation], None] | None = None,
        on_rollback: Callable[[int], None] | None = None,
    ) -> None:
        if not 1 <= min_size <= max_size:
            raise ValueError(f"need 1 <= min ({min_size}) <= max ({max_size})")
        self.token = token
        self.min_size, self.max_size = min_size, max_size
        # The first generation waits for this many (later ones for every live worker).
        self._expect = max(min_size, min(expect, max_size))
        self._log = log or (lambda _: None)
        self._on_generation = on_generation
        self._on_rollback = on_rollback
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._members: list[str] = []  # worker ids of the current generation, in rank order
        self._drained: dict[str, str] = {}  # worker id -> why
        self._finished = False
        # (generation, most steps lost) of a failed generation not yet given to on_rollback.
        self._rollback: tuple[int, int] | None = None
        self.generation = 0
        self._closed = True  # the current generation ended (or none formed yet)
        self._ended_at = time.monotonic()  # when it ended (the server's creation at first)
        self._seq = 0
        self._events: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._listener = socket.create_server((host, 0))
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        if on_generation is not None or on_rollback is not None:
            threading.Thread(
                target=self._dispatch, daemon=True, name="rendezvous-callbacks"
            ).start()
        threading.Thread(target=self._accept, daemon=True, name="rendezvous").start()

    @property
    def finished(self) -> bool:
        """Whether a worker reported that its training function returned (the gang is done)."""
        with self._lock:
            return self._finished

    def close(self) -> None:
        """Stops serving and drops every session (a pending ``on_rollback`` is still called)."""
        with self._lock:
            if not self._stop.is_set():
                self._flush_rollback()
                self._stop.set()
                self._events.put(None)
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

    def drain(self, worker_ids: Iterable[str], why: str) -> None:
        """Takes these workers out of the gang for good (the scheduler shrinks it).

        A drained member ends the current generation: every rank's next ``commit()`` raises
        HostsUpdatedInterrupt with the state kept, and the others re-form without it. A drained
        worker's join (now, or whenever it or a later session of its id asks) is answered
        ``drained`` with ``why``. Ids that have not connected (yet) are drained all the same.
        """
        with self._lock:
            for ident in worker_ids:
                self._drain(str(ident), why)
            self._try_form()

    def remove(self, worker_id: str, why: str) -> None:
        """The worker is gone (its host was lost): drops it as if its session closed, ending the
        current generation if it is a member. Unknown ids are ignored."""
        with self._lock:
            w = self._workers.get(worker_id)
            if w is None:
                return
            with contextlib.suppress(OSError):
                w.sock.shutdown(socket.SHUT_RDWR)
            self._remove(w, why)

    def _dispatch(self) -> None:
        while (event := self._events.get()) is not None:
            try:
                event()
            except Exception as exc:  # a callback's failure must not end the dispatcher
                self._log(f"rendezvous callback failed: {exc!r}")

    def _emit(self, event: Callable[[], None]) -> None:
        """Queues a callback for the dispatcher, in order (the lock is held)."""
        if not self._stop.is_set():
            self._events.put(event)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(sock,), daemon=True).start()

    def _session(self, sock: socket.socket) -> None:
        lock = threading.Lock()
        worker: _Worker | None = None
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
                    return
                self._seq += 1
                worker = self._workers[ident] = _Worker(ident, sock, lock, self._seq)
            _send(sock, lock, {"ok": True, "min": self.min_size, "max": self.max_size})
            for line in lines:
                msg = json.loads(line)
                if isinstance(msg, dict):
                    self._handle(worker, msg)
        except (OSError, ValueError, KeyError, TypeError):
            pass
        finally:
            if worker is not None:
                with self._lock:
                    self._remove(worker, "its session closed")
            with contextlib.suppress(OSError):
                sock.close()

    def _handle(self, w: _Worker, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        ident = w.ident
        with self._lock:
            if self._workers.get(ident) is not w:
                return  # removed (remove()) while this message was on its way
            if op == "join":
                if ident in self._drained:
                    w.send({"op": "drained", "reason": self._drained[ident]})
                    return
                if self._finished:
                    w.send({"op": "finished"})
                    return
                w.addr = str(msg["addr"])
                if not self._closed and ident not in self._members:
                    self._close(f"worker {ident} joined")
                self._try_form()
            elif op == "report":
                generation = int(msg.get("generation", -1))
                if generation != self.generation or generation == 0:
                    return
                if ident not in self._drained:
                    lost = max(0, int(msg.get("steps_lost", 0)))
                    if self._rollback is not None and self._rollback[0] == generation:
                        lost = max(lost, self._rollback[1])
                    self._rollback = (generation, lost)
                if not self._closed:
                    self._close(f"worker {ident} reported: {msg.get('reason', '')}")
                    self._try_form()
            elif op == "drain":
                self._drain(ident, str(msg.get("reason", "")))
                self._try_form()
            elif op == "done":
                if not self._finished:
                    self._finished = True
                    self._log(f"the gang finished (worker {ident} is done)")
                    for other in self._workers.values():
                        if other.addr is not None:
                            other.addr = None
                            other.send({"op": "finished"})
            elif op == "leave":
                self._remove(w, "it left")

    def _drain(self, ident: str, why: str) -> None:
        """Marks ``ident`` drained (the lock is held; the caller then calls _try_form)."""
        if ident in self._drained:
            return
        self._drained[ident] = why
        self._log(f"worker {ident} drained: {why}")
        w = self._workers.get(ident)
        if self.generation == 0:
            # The first generation no longer waits for it (nor again when its session ends).
            self._expect = max(self.min_size, self._expect - 1)
        if w is not None and w.addr is not None:
            w.addr = None
            w.send({"op": "drained", "reason": why})
        if ident in self._members and not self._closed:
            self._close(f"member {ident} drained ({why})")

    def _remove(self, w: _Worker, why: str) -> None:
        """Forgets the worker (the lock is held); nothing if it is already gone."""
        if self._workers.get(w.ident) is not w:
            return
        del self._workers[w.ident]
        self._log(f"worker {w.ident} removed: {why}")
        if self.generation == 0 and w.ident not in self._drained:
            self._expect = max(self.min_size, self._expect - 1)
        if w.ident in self._members and not self._closed:
            self._close(f"member {w.ident} is gone ({why})")
        self._try_form()

    def _close(self, why: str) -> None:
        """Ends the current generation and tells every session (the lock is held)."""
        self._closed = True
        self._ended_at = time.monotonic()
        self._log(f"generation {self.generation} closed: {why}")
        for w in self._workers.values():
            w.send({"op": "closed", "generation": self.generation})

    def _flush_rollback(self) -> None:
        """Queues on_rollback for a failed generation not yet reported (the lock is held)."""
        if self._rollback is None:
            return
        lost = self._rollback[1]
        self._rollback = None
        if (callback := self._on_rollback) is not None:
            self._emit(lambda: callback(lost))

    def _try_form(self) -> None:
        """Forms the next generation if every live worker is waiting for it (the lock is held)."""
        if not self._closed or self._finished:
            return
        candidates = [w for w in self._workers.values() if w.ident not in self._drained]
        waiting = [w for w in candidates if w.addr is not None]
        enough = self._expect if self.generation == 0 else self.min_size
        if len(waiting) < enough or len(waiting) < len(candidates):
            return
        old = {ident: r for r, ident in enumerate(self._members)}
        # Survivors first in their old order, so rank 0 (whose state sync() sends) has state.
        waiting.sort(key=lambda w: (old.get(w.ident, math.inf), w.seq))
        chosen = waiting[: self.max_size]
        self._flush_rollback()
        formed = Generation(
            number=self.generation + 1,
            members=tuple(w.ident for w in chosen),
            previous=tuple(self._members),
            waited=max(0.0, time.monotonic() - self._ended_at),
        )
        self.generation = formed.number
        self._closed = False
        self._members = list(formed.members)
        addrs = [str(w.addr) for w in chosen]
        self._log(f"generation {self.generation}: {len(chosen)} workers")
        for rank, w in enumerate(chosen):
            w.addr = None
            msg = {"op": "membership", "generation": self.generation, "rank": rank}
            w.send(msg | {"members": addrs})
        if (callback := self._on_generation) is not None:
            self._emit(lambda: callback(formed))


# The longest a wait of the main thread goes without running Python (see RendezvousClient.watch).
SIGNAL_SLICE_SECONDS = 0.1


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

    def _post(self, msg: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            _send(self._sock, self._wlock, msg)

    def join(self, addr: str) -> Membership:
        """Waits (up to the timeout) for a generation of at least ``min`` workers with us in it;
        our runtime will listen at ``addr``. Raises :class:`Drained` if this worker was drained,
        :class:`GangFinished` if the gang has finished."""
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
        if msg.get("op") == "drained":
            raise Drained(str(msg.get("reason", "")))
        if msg.get("op") == "finished":
            raise GangFinished(
                f"the gang finished before this worker joined (endpoint {self.address})"
            )
        return Membership(int(msg["generation"]), int(msg["rank"]), tuple(msg["members"]))

    def closed(self, generation: int) -> bool:
        """Whether ``generation`` has ended (the endpoint said so, or went away)."""
        with self._cond:
            return self._gone or self._closed_gen >= generation

    def watch(self, generation: int, timeout: float | None = None) -> bool:
        """Waits until ``generation`` ends; False if ``timeout`` passed first.

        Waits in slices of :data:`SIGNAL_SLICE_SECONDS`: a signal the kernel hands to another
        thread (the runtime's) does not wake the main thread's wait, and its Python handler (a
        SIGTERM's: drain this worker) runs only once the main thread runs Python again."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not (self._gone or self._closed_gen >= generation):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(
                    SIGNAL_SLICE_SECONDS if left is None else min(left, SIGNAL_SLICE_SECONDS)
                )
            return True

    def report_failure(self, generation: int, reason: str, steps_lost: int = 0) -> None:
        """Tells the endpoint that ``generation`` failed here (e.g. a peer died) and that the
        rollback to the last commit throws away ``steps_lost`` training steps."""
        self._post(
            {
                "op": "report",
                "generation": generation,
                "reason": reason,
                "steps_lost": max(0, int(steps_lost)),
            }
        )

    def request_drain(self, reason: str) -> None:
        """Asks the endpoint to drain this worker (as the scheduler's ``drain`` would): the
        current generation ends and our next join is answered :class:`Drained`.

        Safe to call from a signal handler: if this thread was interrupted in the middle of
        sending, the request goes from a new thread once that send is done."""
        data = _encode({"op": "drain", "reason": reason})
        if self._wlock.acquire(blocking=False):
            try:
                with contextlib.suppress(OSError):
                    self._sock.sendall(data)
            finally:
                self._wlock.release()
        else:
            threading.Thread(
                target=self._post, args=({"op": "drain", "reason": reason},), daemon=True
            ).start()

    def done(self) -> None:
        """Tells the endpoint that the training function returned here: the gang has finished
        (later joins, of any worker, are answered :class:`GangFinished`)."""
        self._post({"op": "done"})

    def leave(self) -> None:
        """Leaves the gang for good and closes the session."""
        self._post({"op": "leave"})
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
