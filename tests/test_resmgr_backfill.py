"""The placement-aware pools: BACKFILL (EASY backfill with a reservation for the first blocked
gang) and LAS (least attained service first, with a starvation guard)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from resmgr_support import Harness
from test_resmgr_admission import POOL, gang, keys, room

from peloton.core.pools import PoolConfig, QueuePolicy
from peloton.core.resources import Resources
from peloton.resmgr import admission
from peloton.resmgr.admission import Outlook, Waiting, admit, las_level, order
from peloton.storage.db import Database

CLUSTER = Resources(cpu=1000, gpu=64)
NOW = 1_000_000.0


def gpus(n: float) -> Resources:
    return Resources(cpu=0, gpu=n)


def outlook(
    ends: Sequence[tuple[float, float]] = (),
    runtimes: dict[str, float] | None = None,
    place: object = None,
) -> Outlook:
    """``ends``: (seconds from now, GPUs freed) of the running gangs."""
    return Outlook(
        NOW,
        [(NOW + t, gpus(n)) for t, n in ends],
        runtimes or {},
        place,  # type: ignore[arg-type]
    )


def test_the_first_blocked_gang_is_reserved_and_short_gangs_backfill_before_it() -> None:
    # 10 GPUs free; running gangs free 6 in 100 s and 8 in 300 s: the 16-GPU gang starts at 100.
    queue = [gang("big", 16, seq=0), gang("short", 4, seq=1), gang("long", 4, seq=2)]
    plan = outlook([(100, 6), (300, 8)], {"short": 50, "long": 500})
    d = admit(queue, room(64, allocation=54), gpus(10), CLUSTER, outlook=plan)
    assert keys(d.admitted) == ["short"]
    reason, message = d.pending["big"]
    assert reason == admission.PENDING_RESERVED
    assert "reserved: starts by 1970-01-12 13:48:20 UTC (needs gpu 16)" in message, message
    # The long one would still run at 100 s and take what the big gang needs then.
    assert d.pending["long"][0] == admission.PENDING_BEHIND
    assert "would delay the reservation of job big" in d.pending["long"][1]


def test_a_backfilled_gang_is_told_how_it_got_past_the_reservation() -> None:
    queue = [gang("big", 16, seq=0), gang("short", 4, seq=1), gang("long", 2, seq=2)]
    plan = outlook([(100, 10)], {"short": 50, "long": 1e6})
    d = admit(queue, room(64, allocation=54), gpus(10), CLUSTER, outlook=plan)
    assert keys(d.admitted) == ["short", "long"]
    assert d.backfilled == {
        "short": "backfilled: ends by 1970-01-12 13:47:30 UTC, before job big's reservation "
        "at 1970-01-12 13:48:20 UTC",
        "long": "backfilled: fits in what job big's reservation leaves spare",
    }


def test_gangs_admitted_in_the_same_pass_count_toward_the_reservation() -> None:
    # Nothing runs; 4 GPUs free: "first" (3 GPUs, 60 s) starts now, "big" (4) then waits for
    # it and is reserved at its end, and "quick" (1 GPU, 30 s) backfills before that: no cycle
    # has to pass for "first" to count as running first.
    queue = [gang("first", 3, seq=0), gang("big", 4, seq=1), gang("quick", 1, seq=2)]
    plan = outlook([], {"first": 60, "big": 60, "quick": 30})
    d = admit(queue, room(64), gpus(4), CLUSTER, outlook=plan)
    assert keys(d.admitted) == ["first", "quick"]
    assert "reserved: starts by 1970-01-12 13:47:40 UTC" in d.pending["big"][1], d.pending["big"]
    assert d.backfilled["quick"].startswith("backfilled: ends by"), d.backfilled


def test_a_long_gang_backfills_into_what_the_reservation_leaves_spare() -> None:
    # At 100 s: 10 free now + 10 freed = 20, the big gang needs 16: 4 spare.
    queue = [gang("big", 16, seq=0), gang("long", 4, seq=1), gang("long2", 1, seq=2)]
    plan = outlook([(100, 10)], {"long": 1e6, "long2": 1e6})
    d = admit(queue, room(64, allocation=54), gpus(10), CLUSTER, outlook=plan)
    assert keys(d.admitted) == ["long"]
    assert d.pending["long2"][0] == admission.PENDING_BEHIND


def test_without_expected_ends_the_reservation_holds_what_it_needs() -> None:
    queue = [gang("big", 16, seq=0), gang("small", 1, seq=1)]
    d = admit(queue, room(64, allocation=54), gpus(10), CLUSTER, outlook=outlook([(math.inf, 8)]))
    assert keys(d.admitted) == []
    assert "no running gang has an expected end" in d.pending["big"][1]


def test_a_gang_placement_cannot_hold_now_is_not_admitted_and_says_why() -> None:
    def place(w: Waiting) -> str | None:
        return "needs 2 hosts with 8 free GPUs of model A100; 1 has" if w.key == "a100" else None

    queue = [gang("a100", 16, seq=0), gang("any", 2, seq=1)]
    d = admit(queue, room(64), gpus(30), CLUSTER, outlook=outlook([(60, 8)], {"any": 10}, place))
    assert keys(d.admitted) == ["any"]
    reason, message = d.pending["a100"]
    # It fits the totals, not the hosts: it is reserved on what the running gangs free.
    assert reason == admission.PENDING_RESERVED
    assert message.endswith("placement now: needs 2 hosts with 8 free GPUs of model A100; 1 has")


running_ends = st.lists(st.tuples(st.floats(1, 1000), st.integers(1, 16)), min_size=0, max_size=6)
queued = st.lists(
    st.tuples(st.integers(1, 24), st.one_of(st.none(), st.floats(1, 2000))), min_size=1, max_size=8
)


@settings(max_examples=300, deadline=None)
@given(ends=running_ends, queue=queued, free=st.integers(0, 24))
def test_backfilled_gangs_never_delay_the_reservation(
    ends: list[tuple[float, int]], queue: list[tuple[int, float | None]], free: int
) -> None:
    gangs = [gang(f"g{i}", n, seq=i) for i, (n, _) in enumerate(queue)]
    runtimes = {f"g{i}": t for i, (_, t) in enumerate(queue) if t is not None}
    plan = outlook(ends, runtimes)
    d = admit(gangs, room(1000), gpus(free), Resources(cpu=1000, gpu=1000), outlook=plan)
    reserved = [g for g in gangs if d.pending.get(g.key, ("",))[0] == admission.PENDING_RESERVED]
    if not reserved:
        return
    head = reserved[0]
    position = gangs.index(head)
    admitted = {g.key for g in d.admitted}
    ahead = [g for g in gangs[:position] if g.key in admitted]
    before = sum(g.total.gpu for g in ahead)
    after = [g for g in gangs[position + 1 :] if g.key in admitted]
    # The gangs admitted ahead of it start now: their expected ends count.
    started = [(NOW + runtimes.get(g.key, math.inf), g.total) for g in ahead]
    start = admission._reserve(head, gpus(free - before), plan, started).start
    # What the reserved gang sees once the backfilled gangs run: less free now, and what they
    # hold back until their expected ends.
    later = Outlook(
        NOW,
        [*plan.ends, *started, *((NOW + runtimes.get(g.key, math.inf), g.total) for g in after)],
        runtimes,
    )
    left = free - before - sum(g.total.gpu for g in after)
    assert left >= 0
    assert admission._reserve(head, gpus(left), later).start <= start


def test_las_serves_the_least_attained_service_first_and_promotes_the_starved() -> None:
    fresh = Waiting("fresh", 0, True, NOW - 10, 2, 1, gpus(1), service=0)
    veteran = Waiting("veteran", 0, True, NOW - 30, 1, 1, gpus(8), service=8 * 3600 * 3)
    assert keys(order([veteran, fresh], QueuePolicy.LAS, NOW)) == ["fresh", "veteran"]
    # The veteran ran 3 h on its 8 GPUs; after waiting 2x that it is served first again.
    starved = Waiting("veteran", 0, True, NOW - 6 * 3600 - 1, 1, 1, gpus(8), service=8 * 3600 * 3)
    assert las_level(starved, NOW) == 0
    assert keys(order([starved, fresh], QueuePolicy.LAS, NOW)) == ["veteran", "fresh"]
    # Priority still comes first.
    urgent = Waiting("urgent", 5, True, NOW, 3, 1, gpus(1), service=1e9)
    assert keys(order([fresh, urgent], QueuePolicy.LAS, NOW))[0] == "urgent"


def test_the_pool_file_names_the_new_policies() -> None:
    assert {p.value for p in QueuePolicy} >= {"BACKFILL", "LAS"}
    assert POOL


# ---------------------------------------------------------------------------- in the daemon


@pytest.fixture
def h(db: Database) -> Iterator[Harness]:
    yield Harness(db, Resources(cpu=10_000, mem_mb=1e9, disk_mb=1e9, gpu=12))


@pytest.mark.parametrize(
    ("policy", "started"),
    [(QueuePolicy.BACKFILL, {"short"}), (QueuePolicy.PRIORITY_FIFO, set())],
)
def test_a_backfill_pool_starts_what_ends_before_the_reserved_gang_can_start(
    h: Harness, policy: QueuePolicy, started: set[str]
) -> None:
    h.rm.create_pool(PoolConfig("/bf", queue_policy=policy))
    h.submit("/bf", 6, min_instances=6, max_runtime_seconds=100, name="running")
    h.cycle()
    h.place_all()
    # 6 of 12 GPUs free; the big gang can start when the running one ends (at 100 s), with 2
    # GPUs spare then: the short gang ends before, the one of unknown run time needs 3.
    big = h.submit("/bf", 10, min_instances=10, name="big")
    short = h.submit("/bf", 2, min_instances=2, max_runtime_seconds=50, name="short")
    unknown = h.submit("/bf", 3, min_instances=3, name="unknown")
    h.cycle()
    admitted = {name for name, job in (("short", short), ("unknown", unknown))
                if h.counts(job).get("READY")}  # fmt: skip
    assert admitted == started
    if policy is QueuePolicy.BACKFILL:
        assert h.job(big).reason == admission.PENDING_RESERVED, h.job(big)
        assert "reserved: starts by" in h.job(big).message
        assert "would delay the reservation of job" in h.job(unknown).message
