"""Admission: whole gangs, entitlement and reservation, reserve-ahead for big gangs, reasons."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.core.pools import QueuePolicy
from peloton.core.resources import KINDS, ZERO, Resources
from peloton.resmgr import admission
from peloton.resmgr.admission import Room, Waiting, admit, order

POOL = "/research/vision"


def gang(key: str, gpu: float, *, cpu: float = 0, priority: int = 0, at: float = 0,
         preemptible: bool = True, seq: int = 0) -> Waiting:  # fmt: skip
    return Waiting(key, priority, preemptible, at, seq, 1, Resources(cpu=cpu, gpu=gpu))


def room(entitlement: float, allocation: float = 0, *, reservation: float = 0,
         np_allocation: float = 0, limit: float = math.inf, cpu: float = 1000) -> Room:  # fmt: skip
    return Room(
        pool=POOL,
        entitlement=Resources(cpu=cpu, gpu=entitlement),
        allocation=Resources(gpu=allocation),
        reservation=Resources(gpu=reservation),
        np_allocation=Resources(gpu=np_allocation),
        limit=Resources(cpu=math.inf, mem_mb=math.inf, disk_mb=math.inf, gpu=limit),
    )


def keys(gangs: Sequence[Waiting]) -> list[str]:
    return [g.key for g in gangs]


def test_whole_gangs_in_order_while_they_fit() -> None:
    queue = [gang("a", 4), gang("b", 3), gang("c", 1)]
    cluster = Resources(cpu=1000, gpu=100)
    d = admit(queue, room(8), cluster, cluster)
    assert keys(d.admitted) == ["a", "b", "c"]
    d = admit(queue, room(8, allocation=2), cluster, cluster)
    assert keys(d.admitted) == ["a"]
    assert d.pending["b"] == (
        admission.PENDING_ENTITLEMENT,
        f"pool {POOL}: gpu entitlement 8, allocated 6, gang needs 3",
    )
    # c would fit, but only in what b is waiting for.
    assert d.pending["c"][0] == admission.PENDING_BEHIND


def test_a_short_cluster_is_named_when_the_pool_is_entitled() -> None:
    cluster = Resources(cpu=1000, gpu=16)
    d = admit([gang("a", 4)], room(8), Resources(cpu=1000, gpu=2), cluster)
    assert d.pending["a"][0] == admission.PENDING_CLUSTER
    assert d.pending["a"][1].startswith("cluster: gpu free 2, gang needs 4")
    assert keys(d.starved) == ["a"]


def test_without_hosts_everything_waits_with_that_reason() -> None:
    d = admit([gang("a", 1)], room(8), ZERO, None)
    assert d.admitted == []
    assert d.pending == {"a": (admission.PENDING_NO_HOSTS, "no hosts known yet")}


def test_infeasible_gangs_fail_with_their_reason() -> None:
    cluster = Resources(cpu=64, gpu=16)
    queue = [
        gang("over-limit", 40),
        gang("over-cluster", 20),
        gang("np-over-reservation", 8, preemptible=False),
        gang("fine", 2),
    ]
    d = admit(queue, room(32, reservation=4, limit=32), cluster, cluster)
    assert keys(d.admitted) == ["fine"]
    assert d.infeasible["over-limit"][1] == (
        f"pool {POOL}: gang needs 40 gpu, limit is 32; the gang can never fit"
    )
    assert d.infeasible["over-cluster"][1] == (
        "cluster: gang needs 20 gpu, capacity is 16; the gang can never fit"
    )
    assert (
        "non-preemptible gangs run only within the reservation"
        in (d.infeasible["np-over-reservation"][1])
    )


def test_non_preemptible_gangs_never_use_borrowed_capacity() -> None:
    cluster = Resources(cpu=1000, gpu=64)
    queue = [gang("np1", 3, preemptible=False), gang("np2", 3, preemptible=False), gang("p", 3)]
    # Entitled to 16 (borrowing 12 beyond the reservation of 4): only one np gang fits in 4.
    d = admit(queue, room(16, reservation=4), cluster, cluster)
    assert keys(d.admitted) == ["np1", "p"]
    reason, message = d.pending["np2"]
    assert reason == admission.PENDING_RESERVATION
    assert message == f"pool {POOL}: gpu reservation 4, non-preemptible allocated 3, gang needs 3"


def test_a_blocked_big_gang_holds_what_it_needs_against_small_ones() -> None:
    cluster = Resources(cpu=1000, gpu=64)
    free = Resources(cpu=1000, gpu=10)
    queue = [gang("big", 16, seq=0), gang("small-gpu", 1, seq=1), gang("cpu-only", 0, cpu=4, seq=2)]
    d = admit(queue, room(64, allocation=54), free, cluster)
    # The small GPU gang would delay the big one; the CPU-only gang takes nothing it needs.
    assert keys(d.admitted) == ["cpu-only"]
    assert d.pending["small-gpu"][0] == admission.PENDING_BEHIND
    assert "waiting behind job big" in d.pending["small-gpu"][1]


def test_a_gang_beyond_its_pools_entitlement_does_not_idle_the_pool() -> None:
    cluster = Resources(cpu=1000, gpu=64)
    queue = [gang("huge", 24), gang("small", 2)]
    # Entitled to 16 now (other pools' demand): huge waits for the entitlement to grow.
    d = admit(queue, room(16), cluster, cluster)
    assert keys(d.admitted) == ["small"]
    assert d.pending["huge"][0] == admission.PENDING_ENTITLEMENT


def test_order_is_priority_then_age_or_age_only() -> None:
    q = [gang("old-low", 1, priority=0, at=1), gang("new-high", 1, priority=5, at=2)]
    assert keys(order(q, QueuePolicy.PRIORITY_FIFO)) == ["new-high", "old-low"]
    assert keys(order(q, QueuePolicy.FIFO)) == ["old-low", "new-high"]


def naive_admit(queue: Sequence[Waiting], free: float) -> list[Waiting]:
    """What a greedy scheduler does: admit whatever fits, skipping what does not."""
    out = []
    for g in queue:
        if g.total.gpu <= free:
            out.append(g)
            free -= g.total.gpu
    return out


def test_a_64_gpu_gang_is_admitted_in_bounded_time_despite_a_stream_of_1_gpu_gangs() -> None:
    """64 GPUs, a new 1-GPU gang every tick, each running 4 ticks (so the cluster stays busy);
    a 64-GPU gang arrives at tick 20. It must start once the running small gangs end."""

    def simulate(naive: bool) -> int | None:
        running: list[tuple[int, float]] = []  # (end tick, gpus)
        queue: list[Waiting] = []
        seq = 0
        for tick in range(300):
            running = [(end, g) for end, g in running if end > tick]
            for _ in range(16):  # the stream: 16 new 1-GPU gangs per tick
                seq += 1
                queue.append(gang(f"s{seq}", 1, at=tick, seq=seq))
            if tick == 20:
                queue.append(gang("big", 64, at=tick - 0.5, seq=0))
            used = sum(g for _, g in running)
            ordered = order(queue, QueuePolicy.PRIORITY_FIFO)
            if naive:
                admitted = naive_admit(ordered, 64 - used)
            else:
                cluster = Resources(cpu=1000, gpu=64)
                d = admit(ordered, room(64, used), Resources(cpu=1000, gpu=64 - used), cluster)
                admitted = d.admitted
            for g in admitted:
                if g.key == "big":
                    return tick - 20
                running.append((tick + 4, g.total.gpu))
            queue = [g for g in queue if g not in admitted]
        return None

    wait = simulate(naive=False)
    assert wait is not None and wait <= 4 + 1  # the longest running small gang, plus a tick
    assert simulate(naive=True) is None  # a greedy scheduler starves it


# ---------------------------------------------------------------------------- properties


waiting_gangs = st.lists(
    st.builds(
        lambda i, g, c, p, pre: gang(f"j{i}", g, cpu=c, priority=p, seq=i, preemptible=pre),
        st.integers(0, 10_000),
        st.integers(0, 16),
        st.integers(0, 32),
        st.integers(0, 3),
        st.booleans(),
    ),
    max_size=30,
    unique_by=lambda g: g.key,
)


@settings(max_examples=300, deadline=None)
@given(
    waiting_gangs,
    st.integers(0, 64),
    st.integers(0, 64),
    st.integers(0, 16),
    st.integers(0, 128),
)
def test_admission_invariants(
    queue: list[Waiting], entitlement: int, allocation: int, reservation: int, free_gpu: int
) -> None:
    r = room(entitlement, allocation, reservation=reservation, cpu=256)
    cluster = Resources(cpu=512, gpu=256)
    free = Resources(cpu=512, gpu=free_gpu)
    ordered = order(queue, QueuePolicy.PRIORITY_FIFO)
    d = admit(ordered, r, free, cluster)
    total = sum((g.total for g in d.admitted), ZERO)
    # Never beyond the entitlement, the cluster, or (non-preemptible) the reservation, in any
    # kind the admitted gangs use (a pool over its entitlement in one kind may still run work
    # that needs none of it).
    assert total.fits_in(r.entitlement - r.allocation)
    assert total.fits_in(free)
    np_total = sum((g.total for g in d.admitted if not g.preemptible), ZERO)
    assert np_total.fits_in(r.reservation)
    assert d.cluster_free == free - total
    # Every gang has exactly one outcome.
    outcomes = [set(keys(d.admitted)), set(d.pending), set(d.infeasible)]
    assert sum(len(o) for o in outcomes) == len(queue)
    assert set().union(*outcomes) == set(keys(queue))
    # Reserve-ahead: a gang admitted behind the first held gang never uses a kind that gang is
    # still short of.
    held = next((g for g in ordered if g.key in d.pending and g.total.fits_in(r.entitlement)), None)
    if held is not None:
        after = ordered[ordered.index(held) + 1 :]
        available = r.entitlement - (r.allocation + total)
        left = Resources(*(min(available.get(k), (free - total).get(k)) for k in KINDS))
        short = {k for k, _, _ in held.total.shortfall(left)}
        for g in after:
            if g.key in keys(d.admitted):
                assert not any(g.total.get(k) > 0 for k in short), (g, held, short)
