"""WatchJob streams cost no worker thread: a real server on loopback keeps answering its unary
API while a thousand streams are open, wakes only the streams of the job that changed (also when
another daemon wrote it), and refuses streams beyond its quotas with RESOURCE_EXHAUSTED."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from daemon import address, error_line, in_process_server, run_peloton, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import make_spec

from peloton.api.watches import WatchHub, WatchQuotas
from peloton.errors import ResourceExhausted
from peloton.jobmgr.manager import JobManager
from peloton.server import Server
from peloton.storage.db import Database
from peloton.v1 import job_pb2, job_pb2_grpc

WATCHES = 1000
WATCHED_JOBS = 10
ROUNDS = 200
P99_LIMIT = 0.1


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    with in_process_server(db_url, tmp_path / "data") as s:
        yield s


def open_watches(server: Server) -> float:
    value = server.metrics.registry.get_sample_value("peloton_watches_open")
    return value or 0.0


def await_open(server: Server, count: int) -> None:
    wait_for(
        lambda: open_watches(server) == count,
        30,
        f"{count} open watches",
        state=lambda: f"{open_watches(server):g} open",
    )


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[int(len(ordered) * 0.99) - 1]


def timed(samples: list[float], call: Callable[[], object]) -> None:
    started = time.perf_counter()
    call()
    samples.append(time.perf_counter() - started)


def test_the_unary_api_answers_fast_while_a_thousand_watches_are_open(server: Server) -> None:
    with grpc.insecure_channel(address(server.grpc_port)) as channel:
        jobs = job_pb2_grpc.JobServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        watched = [
            jobs.CreateJob(job_pb2.CreateJobRequest(spec=make_spec(2))).job.job_id
            for _ in range(WATCHED_JOBS)
        ]
        streams = [
            jobs.WatchJob(job_pb2.WatchJobRequest(job_id=watched[i % WATCHED_JOBS]))
            for i in range(WATCHES)
        ]
        try:
            await_open(server, WATCHES)
            latency: dict[str, list[float]] = {"CreateJob": [], "GetJob": [], "Health": []}
            assert server.jobs is not None
            for round_ in range(ROUNDS):
                created = jobs.CreateJob(
                    job_pb2.CreateJobRequest(spec=make_spec(1)), timeout=5
                ).job.job_id
                timed(
                    latency["CreateJob"],
                    lambda: jobs.CreateJob(job_pb2.CreateJobRequest(spec=make_spec(1)), timeout=5),
                )
                timed(
                    latency["GetJob"],
                    lambda job_id=created: jobs.GetJob(
                        job_pb2.GetJobRequest(job_id=job_id), timeout=5
                    ),
                )
                timed(
                    latency["Health"],
                    lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5),
                )
                if round_ % 20 == 0:
                    # A new reason wakes the job's 100 streams, which read and find no event.
                    server.jobs.set_pending_reason(watched[round_ % WATCHED_JOBS], "r", str(round_))
            slow = {method: p99(samples) for method, samples in latency.items()}
            assert all(v < P99_LIMIT for v in slow.values()), f"p99 seconds: {slow}"
            # Every stream still works: the kills reach all of them, and they end.
            for job_id in watched:
                jobs.KillJob(job_pb2.KillJobRequest(job_id=job_id), timeout=5)
            last = [list(stream)[-1] for stream in streams]
            assert {u.job_state for u in last} == {job_pb2.JOB_STATE_KILLED}
            await_open(server, 0)
        finally:
            for stream in streams:
                stream.cancel()


def test_watches_beyond_a_clients_quota_are_refused_until_one_closes(
    db_url: str, tmp_path: Path
) -> None:
    with (
        in_process_server(db_url, tmp_path / "data", max_watches_per_client=2) as server,
        grpc.insecure_channel(address(server.grpc_port)) as channel,
    ):
        jobs = job_pb2_grpc.JobServiceStub(channel)
        job_id = jobs.CreateJob(job_pb2.CreateJobRequest(spec=make_spec(1))).job.job_id
        request = job_pb2.WatchJobRequest(job_id=job_id)
        first, second = jobs.WatchJob(request), jobs.WatchJob(request)
        await_open(server, 2)
        with pytest.raises(grpc.RpcError) as refused:
            next(jobs.WatchJob(request, timeout=5))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        full = "client ipv4:127.0.0.1 has 2 open watches, its most; close one or retry later"
        assert refused.value.details() == full
        cli = run_peloton("job", "watch", job_id, server=address(server.grpc_port), cwd=tmp_path)
        assert (cli.returncode, error_line(cli)) == (1, f"error: resource exhausted: {full}")
        first.cancel()
        await_open(server, 1)
        third = jobs.WatchJob(request)
        assert next(third).job_state == job_pb2.JOB_STATE_PENDING
        refusals = server.metrics.registry.get_sample_value(
            "peloton_watches_refused_total", {"quota": "per_client"}
        )
        assert refusals == 2
        second.cancel()
        third.cancel()


def test_watches_beyond_the_servers_quota_are_refused(db_url: str, tmp_path: Path) -> None:
    with (
        in_process_server(db_url, tmp_path / "data", max_watches=2) as server,
        grpc.insecure_channel(address(server.grpc_port)) as channel,
    ):
        jobs = job_pb2_grpc.JobServiceStub(channel)
        job_id = jobs.CreateJob(job_pb2.CreateJobRequest(spec=make_spec(1))).job.job_id
        request = job_pb2.WatchJobRequest(job_id=job_id)
        streams = [jobs.WatchJob(request), jobs.WatchJob(request)]
        await_open(server, 2)
        with pytest.raises(grpc.RpcError) as refused:
            next(jobs.WatchJob(request, timeout=5))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.details().startswith("the server has 2 open watches, its most")
        for stream in streams:
            stream.cancel()
        await_open(server, 0)


def test_a_watch_sees_events_another_daemon_wrote(server: Server, db_url: str) -> None:
    with grpc.insecure_channel(address(server.grpc_port)) as channel:
        jobs = job_pb2_grpc.JobServiceStub(channel)
        job_id = jobs.CreateJob(job_pb2.CreateJobRequest(spec=make_spec(2))).job.job_id
        stream = jobs.WatchJob(job_pb2.WatchJobRequest(job_id=job_id), timeout=30)
        assert next(stream).job_state == job_pb2.JOB_STATE_PENDING
        # Another daemon's job manager on the same database: nothing of it reaches this
        # daemon's event bus, only the rows.
        other_db = Database.from_url(db_url)
        try:
            JobManager(other_db).kill_job(job_id, "from elsewhere")
        finally:
            other_db.dispose()
        rest = list(stream)
        assert rest[-1].job_state == job_pb2.JOB_STATE_KILLED
        assert any(u.event.message == "from elsewhere" for u in rest)


# ---------------------------------------------------------------------------- the hub alone


def test_quotas_count_per_client_address_not_per_connection() -> None:
    async def scenario() -> list[str]:
        hub = WatchHub(
            ThreadPoolExecutor(1), WatchQuotas(total=3, per_client=2), lambda _: (0, set()), int
        )
        refusals = []
        with hub.open("j", "ipv4:10.0.0.1:4000"), hub.open("j", "ipv4:10.0.0.1:4001"):
            try:
                with hub.open("j", "ipv4:10.0.0.1:4002"):
                    pass
            except ResourceExhausted as exc:
                refusals.append(str(exc))
            with hub.open("j", "ipv4:10.0.0.2:4000"):
                try:
                    with hub.open("k", "ipv4:10.0.0.3:4000"):
                        pass
                except ResourceExhausted as exc:
                    refusals.append(str(exc))
        with hub.open("j", "ipv4:10.0.0.1:4003"):
            pass  # the slots came back
        return refusals

    assert asyncio.run(scenario()) == [
        "client ipv4:10.0.0.1 has 2 open watches, its most; close one or retry later",
        "the server has 3 open watches, its most; close one or retry later",
    ]


def test_a_publish_wakes_only_the_streams_of_that_job_and_close_wakes_all() -> None:
    async def scenario() -> list[tuple[bool, bool]]:
        hub = WatchHub(ThreadPoolExecutor(1), WatchQuotas(), lambda _: (0, set()), int)
        await hub.start()
        seen = []
        with hub.open("a", "ipv4:10.0.0.1:1") as a, hub.open("b", "ipv4:10.0.0.1:2") as b:
            # From another thread, as the job manager's writers publish.
            threading.Thread(target=hub.publish, args=("a",)).start()
            await asyncio.wait_for(a.changed.wait(), 5)
            seen.append((a.changed.is_set(), b.changed.is_set()))
            await hub.close()
            seen.append((a.changed.is_set(), b.changed.is_set()))
        return seen

    assert asyncio.run(scenario()) == [(True, False), (True, True)]


def test_streams_woken_together_share_one_read_but_never_one_older_than_their_wake() -> None:
    async def scenario() -> tuple[list[int], list[int]]:
        hub = WatchHub(ThreadPoolExecutor(2), WatchQuotas(), lambda _: (0, set()), int)
        await hub.start()
        reads = []
        release = threading.Event()

        def read() -> int:
            reads.append(hub.wakes("j"))
            which = len(reads)  # numbered when it starts: a later read may start meanwhile
            release.wait(5)
            return which

        with hub.open("j", "ipv4:10.0.0.1:1"):
            seen = hub.wakes("j")
            first = [asyncio.ensure_future(hub.read_shared("j", 0, seen, read)) for _ in range(50)]
            await asyncio.sleep(0)  # every stream has joined the read in flight
            hub.publish("j")  # a change committed while that read runs
            await asyncio.sleep(0)  # the loop runs the wake it was sent
            later = hub.wakes("j")
            second = asyncio.ensure_future(hub.read_shared("j", 0, later, read))
            await asyncio.sleep(0)
            release.set()
            results = await asyncio.gather(*first)
            return sorted(set(results)), [await second]

    shared, fresh = asyncio.run(scenario())
    assert shared == [1]  # fifty streams, one read
    assert fresh == [2]  # woken after it started: a read of its own
