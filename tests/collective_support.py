"""Helpers to run N real rank processes of peloton.collective on loopback and gather results."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from peloton.core.gangenv import GangEnv


def free_ports(n: int) -> list[int]:
    """Ports the kernel just handed out (all held at once, so they are distinct)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def rank_env(
    rank: int, size: int, peers: list[str], local_size: int = 1, timeout: float = 10.0
) -> dict[str, str]:
    """The PELOTON_* variables the scheduler would set for one rank (hosts of local_size ranks)."""
    return GangEnv(
        rank=rank,
        size=size,
        peers=tuple(peers),
        local_rank=rank % local_size,
        local_size=local_size,
        cross_rank=rank // local_size,
        cross_size=max(1, size // local_size),
        timeout=timeout,
    ).to_env()


@dataclass
class Outcome:
    """What one rank process did: its return value, or the error it raised, and its exit code."""

    rank: int
    value: Any = None
    error: str | None = None
    error_type: str | None = None
    exitcode: int | None = None
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and self.exitcode == 0


def _child(
    q: Any,
    fn: Callable[..., Any],
    rank: int,
    env: dict[str, str],
    args: tuple[Any, ...],
    init: bool,
) -> None:
    os.environ.update(env)
    import peloton.collective as pc

    start = time.monotonic()
    try:
        if init:
            pc.init()
        value = fn(*args)
        q.put((rank, "ok", value, None, time.monotonic() - start))
    except BaseException as exc:
        detail = f"{exc}" if isinstance(exc, pc.CollectiveError) else traceback.format_exc()
        q.put((rank, "error", detail, type(exc).__name__, time.monotonic() - start))
    finally:
        pc.shutdown()


def run_ranks(
    fn: Callable[..., Any],
    size: int,
    *args: Any,
    timeout: float = 10.0,
    local_size: int = 1,
    init: bool = True,
    deadline: float = 60.0,
    start_method: str = "fork",
) -> list[Outcome]:
    """Runs ``fn(*args)`` in `size` forked rank processes after ``pc.init()`` from PELOTON_* env.

    Returns one Outcome per rank. A rank that dies without reporting (SIGKILL) has only an
    exit code. Processes still alive after `deadline` seconds are killed and reported as hung.
    ``start_method="spawn"`` starts fresh interpreters instead (``fn`` importable by name): for
    torch, whose thread pools a forked child inherits half-made and may hang on.
    """
    ctx = mp.get_context(start_method)
    q = ctx.Queue()
    peers = [f"127.0.0.1:{p}" for p in free_ports(size)]
    procs = []
    for r in range(size):
        env = rank_env(r, size, peers, local_size=local_size, timeout=timeout)
        p = ctx.Process(target=_child, args=(q, fn, r, env, args, init), daemon=True)
        p.start()
        procs.append(p)
    outcomes = {r: Outcome(rank=r) for r in range(size)}
    end = time.monotonic() + deadline
    pending = set(range(size))
    while pending and time.monotonic() < end:
        try:
            r, status, value, etype, elapsed = q.get(timeout=0.1)
        except queue.Empty:
            # A process that exited without reporting (killed) has nothing more to say.
            for r in list(pending):
                if not procs[r].is_alive() and procs[r].exitcode is not None and q.empty():
                    pending.discard(r)
            continue
        pending.discard(r)
        outcomes[r].elapsed = elapsed
        if status == "ok":
            outcomes[r].value = value
        else:
            outcomes[r].error, outcomes[r].error_type = value, etype
    for r, p in enumerate(procs):
        p.join(timeout=max(0.1, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
            outcomes[r].error = outcomes[r].error or "hung: still running at the deadline"
        outcomes[r].exitcode = p.exitcode
    return [outcomes[r] for r in range(size)]


def assert_all_ok(outcomes: list[Outcome]) -> list[Any]:
    """Fails the test with every rank's error if any rank failed; returns the values."""
    bad = [f"rank {o.rank}: exit {o.exitcode}: {o.error}" for o in outcomes if not o.ok]
    assert not bad, "\n".join(bad)
    return [o.value for o in outcomes]
