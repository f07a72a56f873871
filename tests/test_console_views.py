"""The console's pure parts: the JSON views built from snapshots (properties: every GPU of every
host once, no host over its total, utilization and fragmentation in [0, 1], hidden holders
reveal nothing) and the change feed's coalescing."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st
from resmgr_support import Harness
from support import make_spec

from peloton.api.host_service import HostService
from peloton.console import views
from peloton.console.cache import AnswerCache, Encoded
from peloton.console.feed import Feed
from peloton.console.follow import OthersWrites
from peloton.console.sources import GpuReports
from peloton.console.views import Holder, Holding
from peloton.core.hosts import HostRecord, HostState, HostView
from peloton.core.records import EventRecord, JobRecord
from peloton.core.resources import Resources
from peloton.core.states import Goal, JobState, TaskState
from peloton.resmgr.admission import PENDING_BEHIND, PENDING_RESERVED
from peloton.resmgr.manager import QueuedGang
from peloton.v1 import host_pb2

T0 = datetime(2026, 11, 27, 6, 0, tzinfo=UTC)


def host(name: str, gpus: int, state: HostState = HostState.UP, rack: str = "r1") -> HostView:
    record = HostRecord(
        name,
        f"agent-{name}",
        state,
        Resources(cpu=8, mem_mb=1024, gpu=gpus),
        {"rack": rack},
        "",
        T0,
    )
    return HostView(record, Resources(cpu=1, gpu=gpus))


def job(job_id: str, pool: str, **kw: object) -> JobRecord:
    spec = make_spec(2, name=f"name-{job_id}", pool=pool)
    return JobRecord(job_id, spec, JobState.PENDING, Goal.RUN, "why", "waits", T0, T0, 1, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the cluster


def test_gpus_take_the_reported_indices_then_the_lowest_free_ones() -> None:
    a = Holding("a-0-1", "x", "a", 0, 2, reported=(3, 1))
    b = Holding("b-0-1", "x", "b", 0, 2)  # not reported: the lowest free
    slots = views.assign_gpus(4, [b, a])
    assert [s.job_id if s else None for s in slots] == ["b", "a", "b", "a"]


def test_a_hidden_holder_shows_only_that_the_gpu_is_used() -> None:
    hosts = [host("h1", 2), host("h2", 2, HostState.DRAINING, rack="r2")]
    holdings = [Holding("secret-0-1", "agent-h1", "secret", 0, 1)]
    holders = {"secret": Holder("secret-name", "/vision")}
    out = views.cluster_json(hosts, holdings, holders, lambda pool: pool != "/vision")
    (r1, r2) = out["racks"]
    cells = r1["hosts"][0]["gpus"]
    assert cells[0] == {
        "index": 0,
        "state": "used",
        "job_id": None,
        "job_name": None,
        "instance_id": None,
        "pool": None,
        "since": None,
        "hidden": True,
    }
    assert cells[1]["state"] == "free"
    assert [g["state"] for g in r2["hosts"][0]["gpus"]] == ["draining", "draining"]
    assert "secret" not in json.dumps(out)
    shown = views.cluster_json(hosts, holdings, holders, lambda pool: True)
    assert shown["racks"][0]["hosts"][0]["gpus"][0]["job_name"] == "secret-name"
    assert shown["summary"]["utilization"] == 0.25
    # The free GPU beside the used one is on a partly used host; the drained ones are not.
    assert shown["summary"]["fragmentation"] == 1 / 3


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[HostView], list[Holding], dict[str, Holder]]:
    names = draw(st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=6))
    hosts = [
        host(
            n,
            draw(st.integers(0, 8)),
            draw(st.sampled_from(HostState)),
            draw(st.sampled_from(["", "r1", "r2"])),
        )
        for n in names
    ]
    agents = [h.record.agent_id for h in hosts] + ["agent-gone"]
    holdings = []
    for i in range(draw(st.integers(0, 12))):
        reported = draw(st.none() | st.lists(st.integers(-1, 9), max_size=5).map(tuple))
        holdings.append(
            Holding(
                f"job{i % 4}-{i}-1",
                draw(st.sampled_from(agents)),
                f"job{i % 4}",
                i,
                draw(st.integers(0, 4)),
                reported,
            )
        )
    holders = {
        f"job{j}": Holder(f"secret{j}", draw(st.sampled_from(["/a", "/b"]))) for j in range(3)
    }
    return hosts, holdings, holders


@given(clusters(), st.sampled_from([frozenset(), frozenset({"/a"}), frozenset({"/a", "/b"})]))
def test_cluster_view_invariants(
    cluster: tuple[list[HostView], list[Holding], dict[str, Holder]], viewable: frozenset[str]
) -> None:
    hosts, holdings, holders = cluster
    out = views.cluster_json(hosts, holdings, holders, viewable.__contains__)
    built = [h for rack in out["racks"] for h in rack["hosts"]]
    assert sorted(h["hostname"] for h in built) == sorted(v.record.hostname for v in hosts)
    assert [r["rack"] for r in out["racks"]] == sorted(r["rack"] for r in out["racks"])
    for h in built:
        # Every GPU once, numbered 0..total-1; never more used than the host has.
        assert [g["index"] for g in h["gpus"]] == list(range(h["gpus_total"]))
        used = [g for g in h["gpus"] if g["state"] == "used"]
        assert len(used) + h["gpus_free"] <= h["gpus_total"]
        for g in used:
            if g["hidden"]:
                assert {g[k] for k in ("job_id", "job_name", "instance_id", "pool", "since")} == {
                    None
                }
            else:
                assert g["pool"] in viewable
    summary = out["summary"]
    assert 0 <= summary["utilization"] <= 1
    assert 0 <= summary["fragmentation"] <= 1
    assert summary["gpus_used"] + summary["gpus_free"] == summary["gpus_total"]
    # A holder the caller may not view: neither its job's id nor its name appears anywhere.
    text = json.dumps(out)
    for job_id, holder in holders.items():
        if holder.pool not in viewable:
            assert f'"{job_id}"' not in text and holder.job_name not in text


@given(
    st.integers(0, 8),
    st.lists(
        st.tuples(st.integers(0, 4), st.none() | st.lists(st.integers(-2, 9), max_size=4)),
        max_size=6,
    ),
)
def test_assigned_gpus_honour_valid_reports(
    total: int, wanted: list[tuple[int, list[int] | None]]
) -> None:
    holdings = [
        Holding(f"j-{i}-1", "x", "j", i, n, tuple(r) if r is not None else None)
        for i, (n, r) in enumerate(wanted)
    ]
    slots = views.assign_gpus(total, holdings)
    assert len(slots) == total
    for h in holdings:
        held = [i for i, s in enumerate(slots) if s is h]
        assert len(held) <= h.gpus
    first = holdings[0] if holdings else None
    if first is not None and first.reported is not None:
        # The first attempt (in id order) gets every index it reported that exists.
        valid = [i for i in dict.fromkeys(first.reported) if 0 <= i < total][: first.gpus]
        assert all(slots[i] is first for i in valid)


# ---------------------------------------------------------------- queues, jobs, pools


def gang(job_id: str, position: int, size: int, reason: str = "cluster_capacity") -> QueuedGang:
    return QueuedGang(job_id, position, size, Resources(gpu=size), reason, f"m-{job_id}", T0)


def test_queue_leaves_out_what_the_caller_may_not_view_and_splits_instances() -> None:
    queues = {
        "/a": [gang("x", 1, 2), gang("hidden", 2, 1), gang("x", 3, 1, PENDING_BEHIND)],
        "/b": [],
    }
    jobs = {"x": job("x", "/a"), "hidden": job("hidden", "/secret")}
    out = views.queue_json(queues, jobs, {"x": (0, 1, 2)}, lambda pool: pool == "/a")
    (a, b) = out["pools"]
    assert b == {"path": "/b", "gangs": []}
    assert [(g["position"], g["instances"], g["window"]) for g in a["gangs"]] == [
        (1, [0, 1], None),
        (3, [2], {"kind": "backfill", "start": None, "detail": "m-x"}),
    ]
    assert "hidden" not in json.dumps(out)


def test_a_reserved_gang_shows_when_and_where_it_starts() -> None:
    reserved = QueuedGang(
        "x",
        1,
        4,
        Resources(gpu=4),
        PENDING_RESERVED,
        "pool /a: reserved: ...",
        T0,
        T0,
        "on 2 hosts",
    )
    (a,) = views.queue_json({"/a": [reserved]}, {"x": job("x", "/a")}, {}, lambda p: True)["pools"]
    assert a["gangs"][0]["window"] == {
        "kind": "reservation",
        "start": "2026-11-27T06:00:00Z",
        "detail": "on 2 hosts",
    }


def test_a_job_row() -> None:
    row = views.job_json(job("j", "/a", task_counts={TaskState.PENDING: 2}, owner="alice"))
    assert row["state"] == "PENDING" and row["owner"] == "alice"
    assert row["task_counts"] == {"PENDING": 2}
    assert row["created_at"] == "2026-11-27T06:00:00Z"


def test_event_kinds() -> None:
    def event(instance: int | None, to: str, reason: str = "") -> EventRecord:
        return EventRecord(1, "j", instance, T0, "", to, reason, "", "", "")

    assert views.event_kind(event(None, "RUNNING")) == "job"
    assert views.event_kind(event(0, "PREEMPTING", "preempted")) == "preemption"
    assert views.event_kind(event(0, "FAILED")) == "failure"
    assert views.event_kind(event(0, "PENDING", "restarted")) == "restart"
    assert views.event_kind(event(0, "RUNNING")) == "attempt"


# ---------------------------------------------------------------- the change feed


def test_the_feed_coalesces_changes_and_ends_on_close() -> None:
    feed = Feed(coalesce=0.05, keepalive=30)
    with feed.stream() as batches:
        feed.job_changed("a")
        first = next(batches)
        assert first is not None and first.jobs == {"a"}
        feed.job_changed("b")
        feed.job_changed("c")  # within the interval: one batch with both
        second = next(batches)
        assert second is not None and second.jobs == {"b", "c"} and "cluster" in second.topics
        feed.close()
        assert list(batches) == []


def test_an_idle_stream_gets_keepalives() -> None:
    feed = Feed(coalesce=0.05, keepalive=0.01)
    with feed.stream() as batches:
        assert next(batches) is None


# ---------------------------------------------------------------- the resource manager's queue


def test_the_queue_is_the_admission_order_with_each_gangs_reason_and_changes_nothing() -> None:
    h = Harness.in_memory(Resources(cpu=64, mem_mb=65536, gpu=4))
    h.pool("/a")
    running = h.submit("/a", 4)
    h.cycle()
    h.place_all()
    low = h.submit("/a", 2, name="low", priority=0)
    high = h.submit("/a", 2, name="high", priority=5)
    h.cycle()
    before = {j: h.job(j).version for j in (running, low, high)}
    queue = h.rm.queue()
    assert [(g.job_id, g.position, g.size) for g in queue["/a"]] == [(high, 1, 2), (low, 2, 2)]
    for g in queue["/a"]:
        assert (g.reason, g.message) == (h.job(g.job_id).reason, h.job(g.job_id).message)
        assert g.reason and g.total.gpu == 2
    assert {j: h.job(j).version for j in before} == before


# ---------------------------------------------------------------- shared answers


def test_an_answer_is_built_once_per_change_and_no_older_than_its_age() -> None:
    generation, now, builds = [0], [0.0], []

    def build() -> dict[str, int]:
        builds.append(generation[0])
        return {"n": len(builds)}

    cache = AnswerCache(lambda: generation[0], clock=lambda: now[0], max_age=1.0)
    first = cache.get("k", build)
    assert cache.get("k", build) is first and builds == [0]
    assert cache.get("other", build) is not first
    generation[0] += 1
    second = cache.get("k", build)
    assert second is not first and json.loads(second.plain) == {"n": 3}
    now[0] += 1.5  # nothing published, but too old
    assert cache.get("k", build) is not second
    big = Encoded({"x": "y" * 4096})
    assert big.gzipped() is big.gzipped() and len(big.gzipped() or b"") < len(big.plain)
    assert Encoded({"x": 1}).gzipped() is None


# ---------------------------------------------------------------- GPU reports


class FakeGpus:
    """GetTaskGpus of a host service whose tasks report ``indices`` (attempt id -> indices)."""

    def __init__(self, indices: dict[str, list[int]]) -> None:
        self.indices = indices
        self.asked: list[str] = []

    def GetTaskGpus(self, request: host_pb2.GetTaskGpusRequest, context: object) -> Any:
        attempt = f"{request.job_id}-{request.instance_id}-{request.attempt}"
        self.asked.append(attempt)
        got = self.indices.get(attempt)
        return host_pb2.GetTaskGpusResponse(reported=got is not None, gpu_indices=got or [])


def test_gpu_reports_are_asked_in_the_background_once_per_attempt() -> None:
    fake = FakeGpus({"j-0-1": [3], "j-1-1": [0, 1]})
    came = threading.Event()
    reports = GpuReports(cast(HostService, fake), reported=came.set)
    reports.start()
    try:
        running = ["j-0-1", "j-1-1", "j-2-1"]  # j-2-1 has not reported
        assert reports.lookup(running) == {}  # never waits for an agent
        assert came.wait(10), fake.asked
        assert reports.lookup(running) == {"j-0-1": (3,), "j-1-1": (0, 1)}
        assert reports.known("j-1-1") == (0, 1)
        assert sorted(fake.asked) == running  # each asked once; j-2-1 again only later
        assert reports.lookup(["j-1-1"]) == {"j-1-1": (0, 1)}
        assert reports.known("j-0-1") is None  # ended: forgotten
    finally:
        reports.stop()


def test_a_daemon_that_does_not_lead_hears_of_the_others_writes_by_polling() -> None:
    leads, newest, changes = [False], [10], {"a": 11, "b": 12}
    told: list[str] = []
    follow = OthersWrites(
        changes=lambda after: {j: s for j, s in changes.items() if s > after},
        newest=lambda: newest[0],
        leads=lambda: leads[0],
        changed=told.append,
    )
    follow.poll()  # marks where it reads from (start() does, before its thread polls)
    follow.poll()
    assert told == ["a", "b"]
    follow.poll()  # each event told once
    changes["a"] = 13
    follow.poll()
    assert told == ["a", "b", "a"]
    leads[0] = True  # the leader's own bus tells it everything
    changes["b"] = 14
    follow.poll()
    assert told == ["a", "b", "a"]
