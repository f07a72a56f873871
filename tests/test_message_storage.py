"""Free text that would multiply, against a real server on loopback, on SQLite and PostgreSQL:
a job-wide action's message is stored once however many tasks it touches, and GetTask's answer
stays within what a default gRPC client (4 MiB) accepts however many events a task has."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from daemon import address, in_process_server, run_peloton
from sqlalchemy import inspect, text
from support import TO_RUNNING, make_spec

from peloton.api import limits
from peloton.api.job_service import GET_TASK_BUDGET
from peloton.client import PelotonClient
from peloton.core.records import TaskUpdate
from peloton.core.states import TaskState
from peloton.jobmgr.manager import JobManager
from peloton.server import Server
from peloton.storage import jobs as repo
from peloton.storage.db import Database
from peloton.v1 import job_pb2, job_pb2_grpc

# Every column that holds a message: tasks' current attempts, ended attempts, events, the job,
# and the table the shared ones live in.
MESSAGE_TABLES = ("tasks", "task_attempts", "job_events", "jobs", "job_messages")


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    with in_process_server(db_url, tmp_path / "data") as s:
        yield s


@pytest.fixture
def client(server: Server) -> Iterator[PelotonClient]:
    with PelotonClient(address(server.grpc_port), timeout=120) as c:
        yield c


@pytest.fixture
def stub(server: Server) -> Iterator[job_pb2_grpc.JobServiceStub]:
    """A default client: it accepts answers of at most 4 MiB."""
    with grpc.insecure_channel(address(server.grpc_port)) as channel:
        yield job_pb2_grpc.JobServiceStub(channel)


def stored_message_chars(db_url: str) -> int:
    """Characters of message text in the database, over every table that holds some (a table
    the schema lacks counts nothing)."""
    db = Database.from_url(db_url)
    try:
        with db.reading() as session:
            present = set(inspect(session.connection()).get_table_names())
            total = 0
            for table in MESSAGE_TABLES:
                if table not in present:
                    continue
                column = "text" if table == "job_messages" else "message"
                total += session.execute(
                    text(f"SELECT coalesce(sum(length({column})), 0) FROM {table}")
                ).scalar_one()
            return int(total)
    finally:
        db.dispose()


def watched(stub: job_pb2_grpc.JobServiceStub, job_id: str) -> list[job_pb2.JobEvent]:
    """Every event of a job that has ended, as WatchJob sends them."""
    return [r.event for r in stub.WatchJob(job_pb2.WatchJobRequest(job_id=job_id), timeout=120)]


def test_a_10000_task_job_killed_and_restarted_with_the_longest_message_stores_it_once(
    client: PelotonClient, stub: job_pb2_grpc.JobServiceStub, db_url: str
) -> None:
    n = 10_000
    job = client.create_job(make_spec(n, gpu=0))
    longest = "é" * (limits.MAX_MESSAGE // 2)
    client.kill_job(job.job_id, longest)

    # Stored a few times (the job, its event, the shared text), not once per task and event:
    # the old copies were 2 x 10,000 x 512 characters.
    assert stored_message_chars(db_url) < 4 * 1024

    # Every answer still shows each task's message.
    task = stub.GetTask(job_pb2.GetTaskRequest(job_id=job.job_id, instance_id=n - 1))
    assert task.task.current.message == longest
    assert [(e.to_state, e.message) for e in task.events] == [("KILLED", longest)]
    seen, token = 0, ""
    while True:
        page = stub.ListTasks(
            job_pb2.ListTasksRequest(job_id=job.job_id, page_size=n, page_token=token)
        )
        assert all(t.current.message == longest for t in page.tasks)
        seen += len(page.tasks)
        token = page.next_page_token
        if not token:
            break
    assert seen == n
    events = watched(stub, job.job_id)
    task_events = [e for e in events if e.has_instance]
    assert len(task_events) == n
    assert all(e.message == longest for e in task_events)
    assert [e.message for e in events if not e.has_instance][-1] == longest

    # A restart with another long message: the killed attempts go to the history, the new
    # ones carry the restart's message; still stored a few times.
    restart = "ü" * (limits.MAX_MESSAGE // 2)
    client.restart_job(job.job_id, restart)
    assert stored_message_chars(db_url) < 8 * 1024
    got = stub.GetTask(job_pb2.GetTaskRequest(job_id=job.job_id, instance_id=7))
    assert got.task.current.message == restart
    assert [a.message for a in got.task.history] == [longest]
    assert [e.message for e in got.events] == [longest, restart]
    page = stub.ListTasks(job_pb2.ListTasksRequest(job_id=job.job_id, page_size=n))
    assert all(
        (t.current.message, [a.message for a in t.history]) == (restart, [longest])
        for t in page.tasks
    )


def test_get_task_keeps_the_newest_events_that_a_default_client_accepts(
    server: Server, client: PelotonClient, stub: job_pb2_grpc.JobServiceStub, db_url: str
) -> None:
    job = client.create_job(make_spec(2, gpu=0))
    # A task with 6,000 events of 1 KiB each (status updates from Mesos carry free text):
    # about 6 MiB, more than a default client accepts.
    count = 6000
    now = datetime.now(UTC)
    db = Database.from_url(db_url)
    try:
        with db.writing() as session:
            repo.insert_events(
                session,
                [
                    {
                        "job_id": job.job_id,
                        "instance_id": 0,
                        "time": now,
                        "from_state": "PENDING",
                        "to_state": "PENDING",
                        "reason": "status",
                        "message": f"{i:06d}" + "x" * 1018,
                    }
                    for i in range(count)
                ],
            )
    finally:
        db.dispose()

    response = stub.GetTask(job_pb2.GetTaskRequest(job_id=job.job_id, instance_id=0))
    assert response.ByteSize() <= GET_TASK_BUDGET
    kept = len(response.events)
    assert 0 < kept < count
    assert response.events_omitted == count - kept
    # The newest ones, oldest first as always.
    assert [e.message[:6] for e in response.events] == [
        f"{i:06d}" for i in range(count - kept, count)
    ]
    sequences = [e.sequence for e in response.events]
    assert sequences == sorted(sequences)
    # A task with few events gets them all.
    other = stub.GetTask(job_pb2.GetTaskRequest(job_id=job.job_id, instance_id=1))
    assert (len(other.events), other.events_omitted) == (0, 0)

    # The CLI says so, in its table and in its data.
    where = address(server.grpc_port)
    shown = run_peloton("task", "get", job.job_id, "0", server=where)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.rstrip().endswith(f"({count - kept} older events not shown)")
    data = run_peloton("task", "get", job.job_id, "0", "-o", "json", server=where)
    assert data.returncode == 0, data.stderr
    assert json.loads(data.stdout)["events_omitted"] == count - kept
    whole = run_peloton("task", "get", job.job_id, "1", "-o", "json", server=where)
    assert json.loads(whole.stdout)["events_omitted"] == 0


# ---------------------------------------------------------------------------- in the job manager


def _run_gang(manager: JobManager, job_id: str, n: int) -> None:
    """Admit a job's PENDING gang of ``n`` and take it to RUNNING, one update per state."""
    attempts = manager.attempts(job_id, {TaskState.PENDING})
    assert manager.admit_pending([(job_id, n, "admitted")]) == [tuple(range(n))]
    for state in TO_RUNNING[1:]:
        manager.update_tasks(
            job_id, [TaskUpdate(i, attempts[i], state, host=f"h{i}") for i in range(n)]
        )


def _killed(manager: JobManager, job_id: str, state: TaskState) -> None:
    """The host manager's report that every task of the job in ``state`` was killed."""
    attempts = manager.attempts(job_id, {state})
    manager.update_tasks(job_id, [TaskUpdate(i, a, TaskState.KILLED) for i, a in attempts.items()])


def test_preemption_and_gang_restarts_store_their_message_once(
    manager: JobManager, db_url: str
) -> None:
    n = 200
    job = manager.create_job(make_spec(n, gpu=0, max_failures=5, backoff_seconds=0))[0]
    _run_gang(manager, job.id, n)
    base = stored_message_chars(db_url)

    # A preemption: every task is killed, then starts a new attempt with the same message.
    why = "preempted for a higher-priority gang: " + "p" * 900
    manager.preempt(job.id, why)
    _killed(manager, job.id, TaskState.PREEMPTING)
    tasks, _ = manager.list_tasks(job.id)
    assert {(t.current.attempt, t.current.state, t.current.message) for t in tasks} == {
        (2, TaskState.PENDING, why)
    }
    assert {t.history[-1].message for t in tasks} == {why}
    events = manager.get_task(job.id, n - 1)[1]
    assert [e.message for e in events[-2:]] == ["", why]  # killed (Mesos said nothing), new
    assert stored_message_chars(db_url) - base < 4 * len(why)

    # A task fails with a long message from Mesos: the whole gang restarts, named by it.
    _run_gang(manager, job.id, n)
    base = stored_message_chars(db_url)
    detail = "x" * 1000
    manager.update_tasks(job.id, [TaskUpdate(3, 2, TaskState.FAILED, "failed", detail)])
    _killed(manager, job.id, TaskState.KILLING)
    tasks, _ = manager.list_tasks(job.id)
    messages = {t.current.message for t in tasks}
    assert len(messages) == 1 and detail in messages.pop()
    assert {t.current.attempt for t in tasks} == {3}
    # The failed task's own copy, its event's, the job's, its event's, the shared one.
    assert stored_message_chars(db_url) - base < 6 * (len(detail) + 200)
