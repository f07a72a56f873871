"""The gRPC API over a real server on loopback, on SQLite and on PostgreSQL.

Tasks are moved through their states with the server's job manager (``server.jobs``), the
interface the host manager uses; everything else goes through the wire.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from daemon import (
    Samples,
    address,
    drive,
    health_status,
    in_process_server,
    scrape_metrics,
)
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from support import TO_RUNNING, independent_spec, make_spec

from peloton.client import ClientError, PelotonClient
from peloton.core.records import TaskUpdate
from peloton.core.states import TaskState
from peloton.server import Server
from peloton.v1 import job_pb2, job_pb2_grpc

S = TaskState
J = job_pb2
WATCH_TIMEOUT = 15.0


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    with in_process_server(db_url, tmp_path / "data") as s:
        yield s


@pytest.fixture
def client(server: Server) -> Iterator[PelotonClient]:
    with PelotonClient(address(server.grpc_port), timeout=10) as c:
        yield c


@pytest.fixture
def stub(server: Server) -> Iterator[job_pb2_grpc.JobServiceStub]:
    with grpc.insecure_channel(address(server.grpc_port)) as channel:
        yield job_pb2_grpc.JobServiceStub(channel)


def expect_error(code: grpc.StatusCode, call: Callable[[], Any]) -> ClientError:
    with pytest.raises(ClientError) as info:
        call()
    assert info.value.code == code, info.value
    return info.value


def expect_invalid(field: str, call: Callable[[], Any]) -> None:
    err = expect_error(grpc.StatusCode.INVALID_ARGUMENT, call)
    assert err.details.startswith(f"{field}: "), err.details


def counts(job: job_pb2.Job) -> dict[str, int]:
    return {J.TaskState.Name(c.state).removeprefix("TASK_STATE_"): c.count for c in job.task_states}


def job_ids(response: job_pb2.ListJobsResponse) -> set[str]:
    return {j.job_id for j in response.jobs}


def run_job_to(server: Server, job_id: str, instances: int, final: TaskState) -> None:
    drive(server, job_id, range(instances), (*TO_RUNNING, final))


# ---------------------------------------------------------------------------- CreateJob, GetJob


def test_create_job_returns_a_pending_job_with_defaults(client: PelotonClient) -> None:
    response = client.create_job_ex(make_spec(3, name="resnet", labels={"team": "vision"}))
    assert response.created
    job = response.job
    uuid.UUID(job.job_id)
    assert job.state == J.JOB_STATE_PENDING
    assert job.spec.name == "resnet"
    assert job.spec.pool == "/default"
    assert job.spec.gang.min_instances == 3
    assert job.spec.restart.max_failures == 3
    assert dict(job.spec.labels) == {"team": "vision"}
    assert counts(job) == {"PENDING": 3}
    assert job.created_at.seconds > 0
    assert job.version >= 1

    fetched = client.get_job(job.job_id)
    # The resource manager may meanwhile have said why it waits (no hosts in this test).
    assert fetched.reason in ("", "no_hosts")
    fetched.ClearField("reason")
    fetched.ClearField("message")
    assert fetched == job


def test_create_job_is_idempotent_on_request_id(client: PelotonClient) -> None:
    spec = make_spec(2, name="idem")
    first = client.create_job_ex(spec, request_id="req-1")
    again = client.create_job_ex(spec, request_id="req-1")
    assert first.created
    assert not again.created
    assert again.job.job_id == first.job.job_id
    assert [j.job_id for j in client.iter_jobs()] == [first.job.job_id]

    other = make_spec(3, name="idem")
    err = expect_error(
        grpc.StatusCode.ALREADY_EXISTS, lambda: client.create_job_ex(other, request_id="req-1")
    )
    assert "req-1" in err.details
    assert first.job.job_id in err.details
    # A different request id is a different job.
    assert client.create_job_ex(spec, request_id="req-2").created
    assert len(list(client.iter_jobs())) == 2


def test_create_job_rejects_bad_specs_naming_the_field(
    client: PelotonClient, stub: job_pb2_grpc.JobServiceStub
) -> None:
    def spec_with(change: Callable[[job_pb2.JobSpec], None]) -> job_pb2.JobSpec:
        spec = make_spec(2)
        change(spec)
        return spec

    cases: list[tuple[str, job_pb2.JobSpec]] = [
        ("instances", spec_with(lambda s: setattr(s, "instances", 0))),
        ("task.resources.gpu", spec_with(lambda s: setattr(s.task.resources, "gpu", 0.5))),
        ("task.resources.cpu", spec_with(lambda s: setattr(s.task.resources, "cpu", 0))),
        ("name", spec_with(lambda s: setattr(s, "name", ""))),
        ("pool", spec_with(lambda s: setattr(s, "pool", "research"))),
        ("task", spec_with(lambda s: s.ClearField("task"))),
        ("gang.min_instances", spec_with(lambda s: setattr(s.gang, "min_instances", 3))),
        ("task.env.PELOTON_X", spec_with(lambda s: s.task.env.update({"PELOTON_X": "1"}))),
    ]
    for field, spec in cases:
        expect_invalid(field, functools.partial(client.create_job, spec))
    expect_invalid("request_id", lambda: client.create_job(make_spec(), request_id="r" * 129))

    # No spec at all (the typed client always sends one; the raw stub need not).
    with pytest.raises(grpc.RpcError) as info:
        stub.CreateJob(job_pb2.CreateJobRequest(request_id="x"), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("spec: ")
    # Nothing was written by any rejected request.
    assert list(client.iter_jobs()) == []


def test_rpcs_taking_a_job_id_reject_an_empty_one(stub: job_pb2_grpc.JobServiceStub) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: stub.GetJob(J.GetJobRequest(), timeout=10),
        lambda: stub.KillJob(J.KillJobRequest(), timeout=10),
        lambda: stub.RestartJob(J.RestartJobRequest(), timeout=10),
        lambda: stub.DeleteJob(J.DeleteJobRequest(), timeout=10),
        lambda: stub.GetTask(J.GetTaskRequest(), timeout=10),
        lambda: stub.ListTasks(J.ListTasksRequest(), timeout=10),
        lambda: list(stub.WatchJob(J.WatchJobRequest(), timeout=10)),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == "job_id: is required"


def test_unknown_job_is_not_found_everywhere(client: PelotonClient) -> None:
    missing = str(uuid.uuid4())
    calls: list[Callable[[], Any]] = [
        lambda: client.get_job(missing),
        lambda: client.kill_job(missing),
        lambda: client.restart_job(missing),
        lambda: client.delete_job(missing),
        lambda: client.get_task(missing, 0),
        lambda: client.list_tasks(missing),
        lambda: list(client.watch_job(missing)),
    ]
    for call in calls:
        err = expect_error(grpc.StatusCode.NOT_FOUND, call)
        assert missing in err.details


# ---------------------------------------------------------------------------- ListJobs


def test_list_jobs_filters(server: Server, client: PelotonClient) -> None:
    a = client.create_job(
        make_spec(1, name="train-a", pool="/research/vision", labels={"team": "cv", "env": "prod"})
    ).job_id
    b = client.create_job(
        make_spec(1, name="train-b", pool="/research/nlp", labels={"team": "nlp"})
    )
    c = client.create_job(
        make_spec(1, name="eval_c", pool="/research/vision", labels={"team": "cv", "env": "dev"})
    ).job_id
    client.kill_job(b.job_id)
    drive(server, c, [0], TO_RUNNING)
    b_id = b.job_id

    def ids(**filters: Any) -> set[str]:
        return job_ids(client.list_jobs(**filters))

    assert ids() == {a, b_id, c}
    assert ids(states=[J.JOB_STATE_RUNNING]) == {c}
    assert ids(states=[J.JOB_STATE_PENDING, J.JOB_STATE_KILLED]) == {a, b_id}
    assert ids(states=[J.JOB_STATE_SUCCEEDED]) == set()
    assert ids(pool="/research/vision") == {a, c}
    assert ids(pool="/research") == set()
    assert ids(name_prefix="train-") == {a, b_id}
    # LIKE wildcards in a prefix are literal characters.
    assert ids(name_prefix="eval_") == {c}
    assert ids(name_prefix="train_") == set()
    assert ids(name_prefix="%") == set()
    assert ids(labels={"team": "cv"}) == {a, c}
    assert ids(labels={"team": "cv", "env": "prod"}) == {a}
    assert ids(labels={"team": "cv", "env": "qa"}) == set()
    assert ids(pool="/research/vision", states=[J.JOB_STATE_PENDING]) == {a}
    listed = {j.job_id: j for j in client.list_jobs().jobs}
    assert listed[c].state == J.JOB_STATE_RUNNING
    assert counts(listed[c]) == {"RUNNING": 1}
    assert listed[b_id].state == J.JOB_STATE_KILLED


def test_list_jobs_pages_newest_first(client: PelotonClient) -> None:
    created = [client.create_job(make_spec(1, name=f"job-{i}")).job_id for i in range(5)]
    everything = client.list_jobs()
    assert everything.next_page_token == ""
    assert [j.job_id for j in everything.jobs] == list(reversed(created))

    pages: list[list[str]] = []
    token = ""
    while True:
        page = client.list_jobs(page_size=2, page_token=token)
        pages.append([j.job_id for j in page.jobs])
        token = page.next_page_token
        if not token:
            break
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [j for p in pages for j in p] == list(reversed(created))
    # A filter applies across pages.
    filtered = client.list_jobs(page_size=1, name_prefix="job-3")
    assert [j.job_id for j in filtered.jobs] == [created[3]]
    assert filtered.next_page_token == ""


def test_list_jobs_rejects_bad_arguments(client: PelotonClient) -> None:
    expect_invalid("page_token", lambda: client.list_jobs(page_token="not-a-token"))
    expect_invalid("page_token", lambda: client.list_jobs(page_token="WzEsMiwzXQ=="))  # [1,2,3]
    expect_invalid("page_size", lambda: client.list_jobs(page_size=1001))
    assert client.list_jobs(page_size=1000).jobs == []
    expect_invalid("states", lambda: client.list_jobs(states=[99]))  # type: ignore[list-item]
    expect_invalid("states", lambda: client.list_jobs(states=[J.JOB_STATE_UNSPECIFIED]))


# ---------------------------------------------------------------------------- Kill, Restart, Delete


def test_kill_pending_job_kills_it_at_once(client: PelotonClient) -> None:
    job_id = client.create_job(make_spec(3)).job_id
    killed = client.kill_job(job_id, message="not needed")
    assert killed.state == J.JOB_STATE_KILLED
    assert killed.reason == "killed"
    assert killed.message == "not needed"
    assert counts(killed) == {"KILLED": 3}
    assert client.get_job(job_id) == killed

    err = expect_error(grpc.StatusCode.FAILED_PRECONDITION, lambda: client.kill_job(job_id))
    assert "KILLED" in err.details


def test_kill_running_job_waits_for_its_tasks(server: Server, client: PelotonClient) -> None:
    job_id = client.create_job(make_spec(2)).job_id
    drive(server, job_id, [0, 1], TO_RUNNING)
    killing = client.kill_job(job_id)
    assert killing.state == J.JOB_STATE_KILLING
    assert counts(killing) == {"KILLING": 2}
    # Killing again while it is being killed is accepted and changes nothing.
    assert client.kill_job(job_id).state == J.JOB_STATE_KILLING
    drive(server, job_id, [0, 1], [S.KILLED])
    job = client.get_job(job_id)
    assert job.state == J.JOB_STATE_KILLED
    assert counts(job) == {"KILLED": 2}


def test_restart_pending_job_is_refused(client: PelotonClient) -> None:
    job_id = client.create_job(make_spec(1)).job_id
    err = expect_error(grpc.StatusCode.FAILED_PRECONDITION, lambda: client.restart_job(job_id))
    assert "PENDING" in err.details
    assert client.get_job(job_id).state == J.JOB_STATE_PENDING


def test_restart_ended_job_starts_new_attempts_with_history(
    server: Server, client: PelotonClient
) -> None:
    job_id = client.create_job(make_spec(2)).job_id
    run_job_to(server, job_id, 2, S.SUCCEEDED)
    assert client.get_job(job_id).state == J.JOB_STATE_SUCCEEDED

    restarted = client.restart_job(job_id, message="again")
    assert restarted.state == J.JOB_STATE_PENDING
    assert counts(restarted) == {"PENDING": 2}

    tasks = client.list_tasks(job_id).tasks
    assert [t.instance_id for t in tasks] == [0, 1]
    for t in tasks:
        assert t.state == J.TASK_STATE_PENDING
        assert t.current.attempt == 2
        assert t.current.attempt_id == f"{job_id}-{t.instance_id}-2"
        assert [a.attempt for a in t.history] == [1]
        old = t.history[0]
        assert old.attempt_id == f"{job_id}-{t.instance_id}-1"
        assert old.state == J.TASK_STATE_SUCCEEDED
        assert old.host == f"host-{t.instance_id}"
        assert old.started_at.seconds > 0
        assert old.ended_at.seconds > 0

    # The new attempt runs like the first one did.
    drive(server, job_id, [0, 1], TO_RUNNING, attempt=2)
    assert client.get_job(job_id).state == J.JOB_STATE_RUNNING


def test_restart_running_job_kills_then_starts_new_attempts(
    server: Server, client: PelotonClient
) -> None:
    job_id = client.create_job(make_spec(1)).job_id
    drive(server, job_id, [0], TO_RUNNING)
    client.restart_job(job_id)
    task = client.get_task(job_id, 0).task
    assert task.state == J.TASK_STATE_KILLING
    assert task.current.attempt == 1
    # An update for an attempt that is not current is stale and ignored.
    assert server.jobs is not None
    server.jobs.update_tasks(job_id, [TaskUpdate(0, 2, S.RUNNING)])
    assert client.get_task(job_id, 0).task.state == J.TASK_STATE_KILLING

    drive(server, job_id, [0], [S.KILLED])
    task = client.get_task(job_id, 0).task
    assert task.state == J.TASK_STATE_PENDING
    assert task.current.attempt == 2
    assert [(a.attempt, a.state) for a in task.history] == [(1, J.TASK_STATE_KILLED)]
    assert client.get_job(job_id).state == J.JOB_STATE_PENDING


def test_delete_job(server: Server, client: PelotonClient) -> None:
    keep = client.create_job(make_spec(1, name="keep")).job_id
    job_id = client.create_job(make_spec(2, name="gone")).job_id
    drive(server, job_id, [0, 1], TO_RUNNING)
    err = expect_error(grpc.StatusCode.FAILED_PRECONDITION, lambda: client.delete_job(job_id))
    assert "RUNNING" in err.details
    assert client.get_job(job_id).state == J.JOB_STATE_RUNNING

    drive(server, job_id, [0, 1], [S.SUCCEEDED])
    client.delete_job(job_id)
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: client.get_job(job_id))
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: client.list_tasks(job_id))
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: client.get_task(job_id, 0))
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: client.delete_job(job_id))
    assert job_ids(client.list_jobs()) == {keep}


# ---------------------------------------------------------------------------- GetTask, ListTasks


def test_get_task_with_its_events(server: Server, client: PelotonClient) -> None:
    job_id = client.create_job(make_spec(2)).job_id
    drive(server, job_id, [1], TO_RUNNING)
    response = client.get_task(job_id, 1)
    task = response.task
    assert (task.job_id, task.instance_id) == (job_id, 1)
    assert task.state == J.TASK_STATE_RUNNING
    assert task.current.attempt == 1
    assert task.current.host == "host-1"
    assert task.current.started_at.seconds > 0
    assert not task.current.HasField("ended_at")
    assert list(task.history) == []
    assert task.failures == 0
    events = list(response.events)
    assert all(e.has_instance and e.instance_id == 1 for e in events)
    assert [(e.from_state, e.to_state) for e in events] == list(
        zip(("PENDING", *TO_RUNNING[:-1]), TO_RUNNING, strict=True)
    )
    assert [e.sequence for e in events] == sorted({e.sequence for e in events})
    assert all(e.attempt_id == f"{job_id}-1-1" for e in events)

    other = client.get_task(job_id, 0)
    assert other.task.state == J.TASK_STATE_PENDING
    assert list(other.events) == []

    err = expect_error(grpc.StatusCode.NOT_FOUND, lambda: client.get_task(job_id, 2))
    assert "instance 2" in err.details


def test_list_tasks_states_and_paging(server: Server, client: PelotonClient) -> None:
    job_id = client.create_job(independent_spec(5)).job_id
    drive(server, job_id, [1, 3], TO_RUNNING)
    drive(server, job_id, [3], [S.FAILED])

    everything = client.list_tasks(job_id)
    assert everything.next_page_token == ""
    assert [(t.instance_id, t.state) for t in everything.tasks] == [
        (0, J.TASK_STATE_PENDING),
        (1, J.TASK_STATE_RUNNING),
        (2, J.TASK_STATE_PENDING),
        (3, J.TASK_STATE_FAILED),
        (4, J.TASK_STATE_PENDING),
    ]
    assert everything.tasks[3].failures == 1

    running = client.list_tasks(job_id, states=[J.TASK_STATE_RUNNING, J.TASK_STATE_FAILED])
    assert [t.instance_id for t in running.tasks] == [1, 3]

    seen: list[int] = []
    token = ""
    pages = 0
    while True:
        page = client.list_tasks(job_id, page_size=2, page_token=token)
        pages += 1
        seen += [t.instance_id for t in page.tasks]
        token = page.next_page_token
        if not token:
            break
    assert seen == [0, 1, 2, 3, 4]
    assert pages == 3

    expect_invalid("page_token", lambda: client.list_tasks(job_id, page_token="%%%"))
    expect_invalid("page_token", lambda: client.list_tasks(job_id, page_token="WyJ4Il0="))  # ["x"]
    expect_invalid("page_size", lambda: client.list_tasks(job_id, page_size=10_001))
    expect_invalid("states", lambda: client.list_tasks(job_id, states=[77]))  # type: ignore[list-item]


# ---------------------------------------------------------------------------- WatchJob


def expected_run_events(instances: int, final: TaskState) -> list[tuple[int | None, str, str]]:
    """(instance or None for the job, from, to) of a job driven as run_job_to drives it."""
    out: list[tuple[int | None, str, str]] = [(None, "", "PENDING")]
    prev = "PENDING"
    for state in (*TO_RUNNING, final):
        out += [(i, prev, state.value) for i in range(instances)]
        if state == S.LAUNCHING:
            out.append((None, "PENDING", "RUNNING"))
        prev = state.value
    out.append((None, "RUNNING", final.value))
    return out


def summary(updates: list[job_pb2.WatchJobResponse]) -> list[tuple[int | None, str, str]]:
    return [
        (
            u.event.instance_id if u.event.has_instance else None,
            u.event.from_state,
            u.event.to_state,
        )
        for u in updates
    ]


def job_states_of(updates: list[job_pb2.WatchJobResponse]) -> list[str]:
    return [J.JobState.Name(u.job_state).removeprefix("JOB_STATE_") for u in updates]


def expected_job_states(events: list[tuple[int | None, str, str]]) -> list[str]:
    """The job's state as of each event: a job event's target, else the one before it."""
    states: list[str] = []
    state = ""
    for instance, _src, dst in events:
        if instance is None:
            state = dst
        states.append(state)
    return states


class Watcher:
    """WatchJob in a thread; ``first`` is set once the first event arrived."""

    def __init__(self, client: PelotonClient, job_id: str, after: int = 0) -> None:
        self.updates: list[job_pb2.WatchJobResponse] = []
        self.error: BaseException | None = None
        self.first = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(client, job_id, after), daemon=True)
        self._thread.start()

    def _run(self, client: PelotonClient, job_id: str, after: int) -> None:
        try:
            for update in client.watch_job(job_id, after_sequence=after):
                self.updates.append(update)
                self.first.set()
        except BaseException as exc:
            self.error = exc
        finally:
            self.first.set()

    def join(self, timeout: float = WATCH_TIMEOUT) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the watch did not end"
        assert self.error is None, self.error


def test_watch_streams_events_until_the_job_succeeds(server: Server, client: PelotonClient) -> None:
    job_id = client.create_job(make_spec(2)).job_id
    watcher = Watcher(client, job_id)
    assert watcher.first.wait(WATCH_TIMEOUT)
    assert summary(watcher.updates) == [(None, "", "PENDING")]  # live, before anything ran

    run_job_to(server, job_id, 2, S.SUCCEEDED)
    watcher.join()

    updates = watcher.updates
    expected = expected_run_events(2, S.SUCCEEDED)
    assert summary(updates) == expected
    assert job_states_of(updates) == expected_job_states(expected)
    assert updates[-1].job_state == J.JOB_STATE_SUCCEEDED
    sequences = [u.event.sequence for u in updates]
    assert sequences == sorted(set(sequences))
    assert all(u.event.job_id == job_id for u in updates)
    assert updates[0].event.reason == "created"
    for u in updates:
        if u.event.has_instance:
            assert u.event.attempt_id == f"{job_id}-{u.event.instance_id}-1"
            if u.event.to_state != "READY":
                assert u.event.host == f"host-{u.event.instance_id}"


def test_watch_of_an_ended_job_returns_its_history_and_ends(
    server: Server, client: PelotonClient
) -> None:
    job_id = client.create_job(independent_spec(1)).job_id
    run_job_to(server, job_id, 1, S.FAILED)
    updates = list(client.watch_job(job_id))
    expected = expected_run_events(1, S.FAILED)
    assert summary(updates) == expected
    # The state as of each event, not as of the watch: the creation event says PENDING.
    assert job_states_of(updates) == expected_job_states(expected)
    assert updates[-1].job_state == J.JOB_STATE_FAILED


def test_watch_resumes_after_a_sequence(server: Server, client: PelotonClient) -> None:
    job_id = client.create_job(make_spec(1)).job_id
    other = client.create_job(make_spec(1, name="other")).job_id
    run_job_to(server, job_id, 1, S.SUCCEEDED)
    run_job_to(server, other, 1, S.SUCCEEDED)
    full = list(client.watch_job(job_id))
    cut = full[5].event.sequence
    rest = list(client.watch_job(job_id, after_sequence=cut))
    assert [u.event for u in rest] == [u.event for u in full[6:]]
    assert rest[-1].job_state == J.JOB_STATE_SUCCEEDED
    assert list(client.watch_job(job_id, after_sequence=full[-1].event.sequence)) == []

    # Resuming a live watch: it waits for new events after the cut, then ends with the job.
    live = client.create_job(make_spec(1, name="live")).job_id
    drive(server, live, [0], TO_RUNNING)
    history: list[job_pb2.WatchJobResponse] = []
    for update in client.watch_job(live):
        history.append(update)
        if update.event.to_state == "RUNNING" and update.event.has_instance:
            break
    after = history[-1].event.sequence
    watcher = Watcher(client, live, after=after)
    drive(server, live, [0], [S.SUCCEEDED])
    watcher.join()
    assert summary(watcher.updates) == [(0, "RUNNING", "SUCCEEDED"), (None, "RUNNING", "SUCCEEDED")]
    assert all(u.event.sequence > after for u in watcher.updates)


def test_watch_job_state_matches_the_events_it_is_sent_with(
    server: Server, client: PelotonClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job can end between the watch reading the job and reading its events; the final
    event must still be labelled with the final state (the CLI's exit code depends on it)."""
    job_id = client.create_job(make_spec(1)).job_id
    drive(server, job_id, [0], TO_RUNNING)
    manager = server.jobs
    assert manager is not None
    original = manager.job_events
    calls = 0

    def job_events(job: str, after: int = 0, limit: int = 1000) -> list[Any]:
        nonlocal calls
        calls += 1
        if calls == 2:  # the watch has read the job (RUNNING) and now reads its events
            drive(server, job_id, [0], [S.SUCCEEDED])
        return original(job, after=after, limit=limit)

    monkeypatch.setattr(manager, "job_events", job_events)
    updates = list(client.watch_job(job_id))
    assert calls >= 2
    assert summary(updates) == expected_run_events(1, S.SUCCEEDED)
    assert updates[-1].event.to_state == "SUCCEEDED"
    assert updates[-1].job_state == J.JOB_STATE_SUCCEEDED


def test_watch_of_a_killed_job_ends_killed(client: PelotonClient) -> None:
    job_id = client.create_job(make_spec(2)).job_id
    watcher = Watcher(client, job_id)
    assert watcher.first.wait(WATCH_TIMEOUT)
    client.kill_job(job_id)
    watcher.join()
    assert summary(watcher.updates) == [
        (None, "", "PENDING"),
        (0, "PENDING", "KILLED"),
        (1, "PENDING", "KILLED"),
        (None, "PENDING", "KILLED"),
    ]
    assert watcher.updates[-1].job_state == J.JOB_STATE_KILLED


def test_watch_ends_when_the_server_stops(server: Server, client: PelotonClient) -> None:
    job_id = client.create_job(make_spec(1)).job_id
    watcher = Watcher(client, job_id)
    assert watcher.first.wait(WATCH_TIMEOUT)
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 5.0})
    stopper.start()
    watcher.join(timeout=10)
    stopper.join(10)
    assert not stopper.is_alive()
    assert summary(watcher.updates) == [(None, "", "PENDING")]


# ---------------------------------------------------------------------------- health, reflection


def test_health_reports_serving(server: Server) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health_status(server.grpc_port, "") == serving
    assert health_status(server.grpc_port, "peloton.v1.JobService") == serving
    with pytest.raises(grpc.RpcError) as info:
        health_status(server.grpc_port, "peloton.v1.NoSuchService")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_job_service(server: Server) -> None:
    with grpc.insecure_channel(address(server.grpc_port)) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {"peloton.v1.JobService", "grpc.health.v1.Health"} <= services
        pool = descriptor_pool.DescriptorPool(database)
        service = pool.FindServiceByName("peloton.v1.JobService")
        assert {m.name for m in service.methods} == {
            "CreateJob",
            "GetJob",
            "ListJobs",
            "KillJob",
            "RestartJob",
            "DeleteJob",
            "GetTask",
            "ListTasks",
            "WatchJob",
        }
        watch = service.methods_by_name["WatchJob"]
        assert watch.server_streaming
        assert watch.output_type.full_name == "peloton.v1.WatchJobResponse"


# ---------------------------------------------------------------------------- metrics


def scrape(server: Server) -> Samples:
    return scrape_metrics(server.metrics_port)


def test_metrics_count_requests_and_states(server: Server, client: PelotonClient) -> None:
    done = client.create_job(make_spec(2, name="done")).job_id
    killed = client.create_job(make_spec(1, name="killed")).job_id
    client.create_job(make_spec(3, name="waiting"))
    run_job_to(server, done, 2, S.SUCCEEDED)
    client.kill_job(killed)
    client.get_job(done)
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: client.get_job("missing"))
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: client.get_job("missing-too"))
    list(client.watch_job(done))

    m = scrape(server)

    def requests(method: str, code: str) -> float:
        return m.get(("peloton_grpc_requests_total", (("code", code), ("method", method))), 0.0)

    assert requests("CreateJob", "OK") == 3
    assert requests("GetJob", "OK") == 1
    assert requests("GetJob", "NOT_FOUND") == 2
    assert requests("KillJob", "OK") == 1
    assert requests("WatchJob", "OK") == 1
    assert requests("KillJob", "NOT_FOUND") == 0

    def seconds(kind: str, method: str, le: str | None = None) -> float:
        labels = [("method", method)] + ([("le", le)] if le is not None else [])
        return m[(f"peloton_grpc_request_seconds_{kind}", tuple(sorted(labels)))]

    assert seconds("count", "GetJob") == 3  # failures are timed too
    assert seconds("bucket", "GetJob", "+Inf") == 3
    assert seconds("count", "CreateJob") == 3
    assert seconds("sum", "CreateJob") > 0
    assert seconds("bucket", "CreateJob", "0.0005") <= seconds("bucket", "CreateJob", "10.0")

    jobs = {s: m[("peloton_jobs", (("state", s),))] for s in ("PENDING", "SUCCEEDED", "KILLED")}
    assert jobs == {"PENDING": 1, "SUCCEEDED": 1, "KILLED": 1}
    assert m[("peloton_jobs", (("state", "RUNNING"),))] == 0
    tasks = {s: m[("peloton_tasks", (("state", s),))] for s in ("PENDING", "SUCCEEDED", "KILLED")}
    assert tasks == {"PENDING": 3, "SUCCEEDED": 2, "KILLED": 1}
    assert m[("peloton_tasks", (("state", "RUNNING"),))] == 0

    # Gauges follow the database, scrape by scrape.
    client.delete_job(done)
    m = scrape(server)
    assert m[("peloton_jobs", (("state", "SUCCEEDED"),))] == 0
    assert m[("peloton_tasks", (("state", "SUCCEEDED"),))] == 0
