"""The database misbehaving costs errors within the client's deadline, never a frozen API: a
silent server (through a proxy the test silences), a query the client gave up on, a daemon
stopped while a query runs, and label filters the planner used to choke on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import psycopg2
import pytest
from daemon import DaemonProcess, health_status, in_process_server, wait_for
from db_proxy import StallingProxy
from grpc_health.v1 import health_pb2
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from support import make_spec

from peloton.config import ServerConfig
from peloton.core.records import JobFilter
from peloton.jobmgr.manager import JobManager
from peloton.server import DATABASE_STOP_SECONDS, Server
from peloton.storage import jobs as repo
from peloton.storage.db import Database
from peloton.storage.deadline import RpcScope, scoped
from peloton.v1 import job_pb2, job_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LIST = job_pb2.ListJobsRequest()


# These need a server on TCP (a proxy in front, pg_stat_activity): PostgreSQL only.
postgres_only = pytest.mark.parametrize("backend", ["postgresql"])


@contextmanager
def stub_for(port: int) -> Iterator[job_pb2_grpc.JobServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield job_pb2_grpc.JobServiceStub(channel)


def _code(call: grpc.Future) -> grpc.StatusCode:
    try:
        call.result()
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@postgres_only
def test_a_silent_database_costs_unavailable_within_the_deadline_then_recovers(
    db_url: str, tmp_path: Path
) -> None:
    url = make_url(db_url)
    with StallingProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(False)
        config = ServerConfig(
            db_url=proxied,
            grpc_port=0,
            metrics_port=0,
            console_port=0,
            data_dir=tmp_path,
            db_connect_timeout_seconds=1,
            db_probe_interval_seconds=0.1,
        )
        server = Server(config)
        server.start()
        try:
            with stub_for(server.grpc_port) as stub:
                stub.ListJobs(LIST, timeout=10)
                proxy.silence()

                started = time.monotonic()
                with pytest.raises(grpc.RpcError) as failed:
                    stub.ListJobs(LIST, timeout=5)
                took = time.monotonic() - started
                # UNAVAILABLE: the server answered before the deadline, with a reason.
                assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value
                assert took < 5, f"answered after {took:.2f} s, past the 5 s deadline"

                port = server.grpc_port
                wait_for(
                    lambda: health_status(port, timeout=2) == NOT_SERVING,
                    10,
                    "health NOT_SERVING while the database is silent",
                    state=lambda: health_status(port, timeout=2),
                )
                # More reads than worker threads: each fails at once, and health answers.
                calls = [stub.ListJobs.future(LIST, timeout=3) for _ in range(40)]
                assert health_status(port, timeout=1) == NOT_SERVING
                codes = {_code(c) for c in calls}
                assert codes == {grpc.StatusCode.UNAVAILABLE}, codes
                details = calls[0].exception().details()  # type: ignore[union-attr]
                assert "database unreachable" in details, details

                proxy.resume()
                wait_for(
                    lambda: health_status(port) == SERVING,
                    15,
                    "health SERVING once the database answers again",
                    state=lambda: health_status(port),
                )
                stub.ListJobs(LIST, timeout=10)
        finally:
            server.stop(grace=1.0)


@contextmanager
def jobs_locked(pg_url: str) -> Iterator[psycopg2.extensions.connection]:
    """The jobs table locked by another session: every query of it waits (a query running)."""
    locker = psycopg2.connect(pg_url)
    try:
        with locker.cursor() as cur:
            cur.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        yield locker
    finally:
        locker.rollback()
        locker.close()


def list_jobs_queries(pg_url: str) -> list[tuple[int, str, str]]:
    """(pid, state, query) of the sessions running ListJobs's query (the resource manager's
    background queries of the jobs table wait on the lock too, and are not the RPC's)."""
    with psycopg2.connect(pg_url) as watcher, watcher.cursor() as cur:
        cur.execute(
            "SELECT pid, state, query FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND state = 'active'"
            " AND query ILIKE '%FROM jobs ORDER BY jobs.created_at DESC%'"
        )
        rows = cur.fetchall()
    watcher.close()
    return rows


@postgres_only
def test_a_cancelled_rpc_leaves_no_query_running(db_url: str, tmp_path: Path) -> None:
    with (
        in_process_server(db_url, tmp_path) as server,
        stub_for(server.grpc_port) as stub,
        jobs_locked(db_url),
    ):
        call = stub.ListJobs.future(LIST, timeout=60)
        wait_for(lambda: list_jobs_queries(db_url), 10, "ListJobs's query waiting")
        call.cancel()
        wait_for(
            lambda: not list_jobs_queries(db_url),
            10,
            "no query left once the RPC was cancelled",
            state=lambda: list_jobs_queries(db_url),
        )


@postgres_only
def test_the_daemon_stops_within_a_bound_while_a_query_runs(db_url: str, tmp_path: Path) -> None:
    grace = 1.0
    args = ["--db-url", db_url, "--data-dir", str(tmp_path / "data"), "--grpc-port", "0"]
    args += ["--metrics-port", "0", "--shutdown-grace-seconds", str(grace)]
    with DaemonProcess(tmp_path / "d", args) as daemon:
        daemon.wait_ready()
        with stub_for(daemon.grpc_port) as stub, jobs_locked(db_url):
            call = stub.ListJobs.future(LIST, timeout=60)
            wait_for(lambda: list_jobs_queries(db_url), 10, "ListJobs's query waiting")
            started = time.monotonic()
            bound = grace + DATABASE_STOP_SECONDS + 5
            try:
                code = daemon.terminate(timeout=bound)
            except Exception as exc:
                raise AssertionError(
                    f"still running {bound:g} s after SIGTERM; log:\n{daemon.stderr}"
                ) from exc
            assert code == 0, daemon.stderr
            assert time.monotonic() - started < bound
            assert _code(call) != grpc.StatusCode.OK
            wait_for(
                lambda: not list_jobs_queries(db_url),
                10,
                "no query left after the daemon stopped",
                state=lambda: list_jobs_queries(db_url),
            )


def test_two_hundred_label_filters_are_answered_fast_or_refused(
    db_url: str, tmp_path: Path
) -> None:
    with in_process_server(db_url, tmp_path) as server, stub_for(server.grpc_port) as stub:
        spec = make_spec(1, labels={"team": "cv", "env": "prod"})
        job_id = stub.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=10).job.job_id
        labels = {"team": "cv", "env": "prod"} | {f"k{i}": "v" for i in range(198)}
        started = time.monotonic()
        try:
            listed = stub.ListJobs(job_pb2.ListJobsRequest(labels=labels), timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
        else:
            assert list(listed.jobs) == []
        took = time.monotonic() - started
        assert took < 2, f"200 label filters took {took:.2f} s"
        two = stub.ListJobs(job_pb2.ListJobsRequest(labels={"team": "cv", "env": "prod"}))
        assert [j.job_id for j in two.jobs] == [job_id]


def test_the_label_query_stays_fast_with_two_hundred_labels(
    db: Database, manager: JobManager
) -> None:
    """Below the API's cap too: the query costs about the same for 2 labels or 200."""
    job, _ = manager.create_job(make_spec(1, labels={"team": "cv", "env": "prod"}))
    job_id = job.id
    many = {"team": "cv", "env": "prod"} | {f"k{i}": "v" for i in range(198)}
    with db.reading() as session:
        started = time.monotonic()
        assert repo.list_jobs(session, JobFilter(labels=many), 10, "") == ([], "")
        took = time.monotonic() - started
        found, _ = repo.list_jobs(session, JobFilter(labels={"team": "cv", "env": "prod"}), 10, "")
    assert took < 1, f"200 label filters took {took:.2f} s"
    assert [j.id for j in found] == [job_id]


@pytest.mark.parametrize(
    ("deadline_s", "server_timeout_ms"), [(3.0, range(1, 3_000)), (60.0, range(30_000, 30_001))]
)
def test_the_server_times_out_an_rpc_s_transaction_at_its_deadline_where_it_is_shorter(
    pg_empty_url: str, deadline_s: float, server_timeout_ms: range
) -> None:
    """A transaction of an RPC whose deadline is shorter than the session's statement_timeout
    (30 s) sets its own, a round trip of its own; one whose deadline is no shorter (a client's
    usual 30 s, less the answer's reserve) keeps the session's and saves the round trip."""
    db = Database.from_url(pg_empty_url)
    with db.reading() as session:  # the pool's connection is made before the clock runs
        session.execute(text("SELECT 1"))
    statements: list[str] = []

    def executed(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    event.listen(db.engine, "before_cursor_execute", executed)
    scope = RpcScope(deadline_s)
    try:
        with scoped(scope), db.writing() as session:
            timeout = session.execute(text("SHOW statement_timeout")).scalar_one()
    finally:
        scope.end()
        db.dispose()
    set_local = [s for s in statements if s.startswith("SET LOCAL")]
    assert len(set_local) == (1 if deadline_s < 30 else 0), statements
    assert _milliseconds(timeout) in server_timeout_ms, timeout


def _milliseconds(setting: str) -> int:
    """A duration as PostgreSQL shows it (``2789ms``, ``30s``), in milliseconds."""
    if setting.endswith("ms"):
        return int(setting[:-2])
    return int(setting.removesuffix("s")) * 1000
