"""Failures raise CollectiveError on every rank, naming the tensor and the ranks; nothing hangs."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
from collective_support import assert_all_ok, free_ports, run_ranks

import peloton.collective as pc

TIMEOUT = 2.0  # seconds: every failure below must surface well within a few of these


def mismatched_shapes() -> dict[str, Any]:
    r = pc.rank()
    out: dict[str, Any] = {}
    shape = 5 if r != 1 else 6
    try:
        pc.allreduce(np.ones(shape, np.float32), name="weights")
    except pc.CollectiveError as exc:
        out["shape"] = str(exc)
    dtype = np.float32 if r != 2 else np.float64
    try:
        pc.allreduce(np.ones(4, dtype), name="bias")
    except pc.CollectiveError as exc:
        out["dtype"] = str(exc)
    try:
        pc.allreduce(np.ones(4, np.float32), op="sum" if r else "max", name="opped")
    except pc.CollectiveError as exc:
        out["op"] = str(exc)
    try:
        pc.broadcast(np.ones(2, np.int32), root_rank=r % 2, name="rooted")
    except pc.CollectiveError as exc:
        out["root"] = str(exc)
    # A mismatch fails only that tensor: the runtime keeps working.
    out["after"] = pc.allreduce(np.ones(3, np.float32), op="sum", name="after")
    return out


def test_mismatch_raises_on_every_rank_naming_tensor_and_ranks() -> None:
    results = assert_all_ok(run_ranks(mismatched_shapes, 3, timeout=TIMEOUT))
    for res in results:
        assert "'weights'" in res["shape"] and "shape" in res["shape"]
        assert "ranks [0, 2] sent shape (5,)" in res["shape"]
        assert "ranks [1] sent shape (6,)" in res["shape"]
        assert "'bias'" in res["dtype"] and "ranks [2] sent float64" in res["dtype"]
        assert "'opped'" in res["op"] and "ranks [0] sent op max" in res["op"]
        assert "'rooted'" in res["root"] and "root_rank" in res["root"]
        assert np.array_equal(res["after"], np.full(3, 3.0, np.float32))


def killed_rank(victim: int, nbytes: int, warm: Any) -> str:
    """The victim SIGKILLs itself once every rank has the warmup's result (``warm``, a barrier
    of all ranks); the others keep allreducing until they are told."""
    r = pc.rank()
    pc.allreduce(np.ones(8, np.float32), name="warmup")
    try:
        warm.wait(timeout=30)
    except threading.BrokenBarrierError:
        raise AssertionError(
            f"rank {r}: not every rank got past warmup within 30s ({warm.n_waiting} waiting)"
        ) from None
    if r == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        for i in range(1000):
            pc.allreduce(np.ones(nbytes // 4, np.float32), name=f"grad.{i}")
    except pc.CollectiveError as exc:
        return f"{time.monotonic() - start:.3f} {exc}"
    return "no error"


@pytest.mark.parametrize(
    ("n", "victim", "nbytes", "local_size"),
    [(3, 2, 4096, 1), (4, 1, 8 << 20, 1), (3, 0, 4096, 1), (3, 1, 8 << 20, 3), (4, 3, 4096, 2)],
)
def test_sigkilled_rank_makes_the_others_raise_within_the_timeout(
    n: int, victim: int, nbytes: int, local_size: int
) -> None:
    """TCP ring, shared memory (local_size 3) and hierarchical (2 hosts x 2) alike."""
    warm = multiprocessing.get_context("fork").Barrier(n)
    outcomes = run_ranks(
        killed_rank, n, victim, nbytes, warm, timeout=TIMEOUT, deadline=30, local_size=local_size
    )
    assert outcomes[victim].exitcode == -signal.SIGKILL, outcomes[victim]
    for o in outcomes:
        if o.rank == victim:
            continue
        assert o.ok, o.error
        elapsed, _, message = o.value.partition(" ")
        assert message != "", o.value
        assert float(elapsed) < 2 * TIMEOUT + 1.0, o.value
        # "rank V" or, when others lost their connection through it too, "ranks [.., V, ..]".
        assert re.search(rf"\branks? \[?(\d+, )*{victim}\b", message), message
        assert "grad." in message, message


def stalled_tensor() -> str:
    """Rank 1 submits 'lonely' that rank 0 never does (rank 0 goes straight to shutdown)."""
    message = "no error"
    if pc.rank() == 1:
        start = time.monotonic()
        try:
            pc.allreduce(np.ones(4, np.float32), name="lonely")
        except pc.CollectiveError as exc:
            message = f"{time.monotonic() - start:.3f} {exc}"
    return message


def test_stall_longer_than_the_timeout_raises_naming_the_missing_ranks() -> None:
    results = assert_all_ok(run_ranks(stalled_tensor, 2, timeout=TIMEOUT))
    assert results[0] == "no error"
    elapsed, _, message = results[1].partition(" ")
    assert TIMEOUT * 0.9 <= float(elapsed) < TIMEOUT + 2.0
    assert "'lonely'" in message and "missing ranks [0]" in message


def stopped_peer() -> str:
    """Rank 2 freezes (SIGSTOP) mid-run: the others must time out instead of waiting forever."""
    r = pc.rank()
    pids = pc.allgather(np.array([os.getpid()], np.int64))
    if r == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
    start = time.monotonic()
    try:
        pc.allreduce(np.ones(1 << 16, np.float32), name="frozen")
    except pc.CollectiveError as exc:
        return f"{time.monotonic() - start:.3f} {exc}"
    finally:
        if r == 0:
            os.kill(int(pids[2]), signal.SIGKILL)  # it can never finish: end it for the test
    return "no error"


def test_frozen_rank_times_out_instead_of_hanging() -> None:
    outcomes = run_ranks(stopped_peer, 3, timeout=TIMEOUT, deadline=20)
    for o in outcomes[:2]:
        assert o.ok, o.error
        elapsed, _, message = o.value.partition(" ")
        assert float(elapsed) < 3 * TIMEOUT + 2, o.value
        assert "'frozen'" in message and "2" in message, message
    assert outcomes[2].exitcode == -signal.SIGKILL


def frozen_coordinator() -> str:
    """Rank 0 (the coordinator) freezes: rank 1's request must not wait forever."""
    pids = pc.allgather(np.array([os.getpid()], np.int64))
    if pc.rank() == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
    start = time.monotonic()
    try:
        pc.allreduce(np.ones(4, np.float32), name="unanswered")
    except pc.CollectiveError as exc:
        return f"{time.monotonic() - start:.3f} {exc}"
    finally:
        os.kill(int(pids[0]), signal.SIGKILL)
    return "no error"


def test_frozen_coordinator_times_out_instead_of_hanging() -> None:
    outcomes = run_ranks(frozen_coordinator, 2, timeout=1.0, deadline=20)
    assert outcomes[0].exitcode == -signal.SIGKILL
    assert outcomes[1].ok, outcomes[1].error
    elapsed, _, message = outcomes[1].value.partition(" ")
    assert 1.5 < float(elapsed) < 6, outcomes[1].value
    assert "'unanswered'" in message and "missing ranks [0]" in message, message


def shutdown_with_pending() -> str:
    """A handle still in flight at shutdown fails instead of blocking forever."""
    if pc.rank() == 0:
        handle = pc.allreduce_async(np.ones(4, np.float32), name="orphan")
        threading.Timer(0.2, pc.shutdown).start()
        try:
            pc.synchronize(handle)
        except pc.CollectiveError as exc:
            return str(exc)
        return "no error"
    return "idle"


def test_shutdown_fails_pending_handles_and_exits_cleanly() -> None:
    outcomes = run_ranks(shutdown_with_pending, 2, timeout=TIMEOUT, deadline=20)
    values = assert_all_ok(outcomes)
    assert "'orphan'" in values[0] and "shut down" in values[0]
    assert all(o.exitcode == 0 for o in outcomes)


def after_shutdown() -> str:
    pc.allreduce(np.ones(2, np.float32))
    pc.shutdown()
    try:
        pc.allreduce(np.ones(2, np.float32))
    except pc.CollectiveError as exc:
        return str(exc)
    return "no error"


def test_use_after_shutdown_is_a_clear_error() -> None:
    values = assert_all_ok(run_ranks(after_shutdown, 2, timeout=TIMEOUT))
    assert all("not initialized" in v for v in values)


@pytest.mark.parametrize(
    ("missing", "env"),
    [
        ("PELOTON_GANG_SIZE", {"PELOTON_RANK": "0", "PELOTON_PEERS": "127.0.0.1:1"}),
        ("PELOTON_RANK", {"PELOTON_GANG_SIZE": "1", "PELOTON_PEERS": "127.0.0.1:1"}),
        ("PELOTON_PEERS", {"PELOTON_GANG_SIZE": "1", "PELOTON_RANK": "0"}),
    ],
)
def test_init_names_the_missing_variable(
    monkeypatch: pytest.MonkeyPatch, missing: str, env: dict[str, str]
) -> None:
    for var in ("PELOTON_RANK", "PELOTON_GANG_SIZE", "PELOTON_PEERS"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(pc.CollectiveError, match=missing):
        pc.init()
    assert not pc.is_initialized()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rank": 3, "size": 2, "peers": "a:1,b:2"}, "PELOTON_RANK=3 is outside"),
        ({"rank": 0, "size": 2, "peers": "a:1"}, "1 addresses for a gang of 2"),
        ({"rank": 0, "size": 1, "peers": "nohost"}, "entry 0 'nohost' is not host:port"),
        ({"rank": 0, "size": 1, "peers": "h:1", "timeout": -1}, "must be positive"),
    ],
)
def test_init_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(pc.CollectiveError, match=match):
        pc.init(**kwargs)
    assert not pc.is_initialized()


def test_init_gives_up_on_absent_peers_naming_them() -> None:
    ports = free_ports(3)
    start = time.monotonic()
    with pytest.raises(pc.CollectiveError, match=r"ranks \[1, 2\] did not connect"):
        pc.init(rank=0, size=3, peers=[f"127.0.0.1:{p}" for p in ports], timeout=0.5)
    assert time.monotonic() - start < 3
    assert not pc.is_initialized()


def test_bad_op_and_root_are_rejected_before_anything_is_sent() -> None:
    pc.init(rank=0, size=1, peers="127.0.0.1:1", timeout=1)
    try:
        with pytest.raises(ValueError, match="op: unknown reduction 'mean'"):
            pc.allreduce(np.ones(2, np.float32), op="mean")
        with pytest.raises(ValueError, match="root_rank: 1 is outside"):
            pc.broadcast(np.ones(2, np.float32), root_rank=1)
        with pytest.raises(TypeError, match="unsupported dtype uint8"):
            pc.allreduce(np.ones(2, np.uint8))
        with pytest.raises(pc.CollectiveError, match="already in flight"):
            h = pc.allreduce_async(np.ones(2, np.float32), name="dup")
            try:
                pc.allreduce_async(np.ones(2, np.float32), name="dup")
            finally:
                pc.synchronize(h)
    finally:
        pc.shutdown()
