"""A client given several daemons' addresses fails over between them.

In process: a front daemon that loses its replies (it forwards each call to a real daemon, then
fails UNAVAILABLE as a daemon dying before it answers would) shows that a create retried on the
next daemon returns the job the first attempt made, that a restart is not sent twice, that other
errors are not retried, and that a watch resumes after the last event it passed on.

Real processes: two daemons on one PostgreSQL database and a minicluster; the one listed first
(the leader) is SIGKILLed; the client's next calls succeed at the other, the job it watched and
the jobs created through it run to their end, each attempt launched once, and the CLI given both
addresses prints the job."""

from __future__ import annotations

import shlex
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from daemon import (
    DONE,
    ROOT,
    DaemonProcess,
    address,
    drive,
    error_line,
    in_process_server,
    run_peloton,
    start_minicluster,
    wait_for,
)
from support import TO_RUNNING, make_spec
from test_several_daemons import (
    AGENT,
    SCHEDULES,
    START_SECONDS,
    TAKEOVER_SECONDS,
    assert_launched_once,
    close_all,
    start,
    wait_leader,
)

from peloton.client import ClientError, PelotonClient, server_addresses
from peloton.core.states import TaskState
from peloton.minicluster import AgentSpec, Minicluster
from peloton.server import Server
from peloton.v1 import job_pb2, job_pb2_grpc

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
# The client timeout against a daemon that never answers: the next daemon must answer within it
# too, on a loaded machine.
FROZEN_TIMEOUT = 3.0


# ---------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("given", "targets"),
    [
        ("db.example", ["db.example:5392"]),
        ("a:7000,b", ["a:7000", "b:5392"]),
        (" a:7000 , [::1]:7001 ", ["a:7000", "[::1]:7001"]),
        # gRPC's own list forms stay one target.
        ("ipv4:10.0.0.1:7000,10.0.0.2:7000", ["ipv4:10.0.0.1:7000,10.0.0.2:7000"]),
        ("dns:///db.example:7000", ["dns:///db.example:7000"]),
    ],
)
def test_server_addresses(given: str, targets: list[str]) -> None:
    assert server_addresses(given) == targets


def test_a_list_with_an_empty_or_bad_address_is_a_usage_error() -> None:
    for bad, why in (("a:7000,", "has an empty address"), ("a,b:http", "the port must be")):
        line = error_line(run_peloton("job", "list", server=bad))
        assert line.startswith("error: invalid value for '--server' / '-s': "), line
        assert why in line, line


# ---------------------------------------------------------------------------- in process


class LosingFront(job_pb2_grpc.JobServiceServicer):
    """A daemon that forwards calls to ``upstream`` and loses the replies (UNAVAILABLE)."""

    def __init__(self, upstream: str, events_before_failing: int = 2) -> None:
        self._channel = grpc.insecure_channel(upstream)
        self._upstream = job_pb2_grpc.JobServiceStub(self._channel)
        self._events = events_before_failing
        self.requests: list[object] = []

    def CreateJob(
        self, request: job_pb2.CreateJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.CreateJobResponse:
        self.requests.append(request)
        self._upstream.CreateJob(request, timeout=10)  # done upstream, and then the reply is lost
        context.abort(UNAVAILABLE, "the daemon died before it answered")

    def RestartJob(
        self, request: job_pb2.RestartJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.RestartJobResponse:
        self.requests.append(request)
        self._upstream.RestartJob(request, timeout=10)
        context.abort(UNAVAILABLE, "the daemon died before it answered")

    def GetJob(
        self, request: job_pb2.GetJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.GetJobResponse:
        self.requests.append(request)
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not retried")

    def WatchJob(
        self, request: job_pb2.WatchJobRequest, context: grpc.ServicerContext
    ) -> Iterator[job_pb2.WatchJobResponse]:
        self.requests.append(request)
        for n, update in enumerate(self._upstream.WatchJob(request, timeout=10)):
            if n == self._events:
                context.abort(UNAVAILABLE, "the daemon died mid-stream")
            yield update

    def close(self) -> None:
        self._channel.close()


@contextmanager
def serving(servicer: job_pb2_grpc.JobServiceServicer) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    job_pb2_grpc.add_JobServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield address(port)
    finally:
        server.stop(grace=None)


@contextmanager
def losing_front(upstream: str) -> Iterator[tuple[LosingFront, str]]:
    front = LosingFront(upstream)
    try:
        with serving(front) as where:
            yield front, where
    finally:
        front.close()


class FrozenFront(job_pb2_grpc.JobServiceServicer):
    """A daemon that takes calls and never answers (a stopped process keeps its socket: the
    call is accepted, then nothing), until ``thaw``."""

    def __init__(self) -> None:
        self.thawed = threading.Event()
        self.requests: list[object] = []

    def _freeze(self, request: object, context: grpc.ServicerContext) -> None:
        self.requests.append(request)
        self.thawed.wait()
        context.abort(UNAVAILABLE, "thawed after the test")

    def GetJob(
        self, request: job_pb2.GetJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.GetJobResponse:
        self._freeze(request, context)
        raise AssertionError("unreachable: abort raises")

    def RestartJob(
        self, request: job_pb2.RestartJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.RestartJobResponse:
        self._freeze(request, context)
        raise AssertionError("unreachable: abort raises")


@pytest.fixture
def real(db_url: str, tmp_path: Path) -> Iterator[Server]:
    with in_process_server(db_url, tmp_path / "data") as server:
        yield server


def all_jobs(server: Server) -> list[job_pb2.Job]:
    with PelotonClient(address(server.grpc_port), timeout=10) as client:
        return list(client.iter_jobs())


def test_a_create_whose_reply_was_lost_is_retried_without_a_second_job(real: Server) -> None:
    with (
        losing_front(address(real.grpc_port)) as (front, lossy),
        PelotonClient(f"{lossy},{address(real.grpc_port)}", timeout=10) as client,
    ):
        response = client.create_job_ex(make_spec(2, name="once"))
        # The front made the job, then lost the reply; the retry found it by its request id.
        assert response.created
        (sent,) = front.requests
        assert isinstance(sent, job_pb2.CreateJobRequest) and sent.request_id
        assert [j.job_id for j in all_jobs(real)] == [response.job.job_id]
        # It stays with the daemon that answered.
        assert client.current == address(real.grpc_port)
        assert client.create_job(make_spec(1, name="second")).job_id != response.job.job_id
        assert len(front.requests) == 1
        # A caller's own request id is sent as it is.
        again = client.create_job_ex(make_spec(1, name="second"), request_id="mine")
        assert again.created and len(all_jobs(real)) == 3


def test_one_address_keeps_the_one_daemon_behaviour(real: Server) -> None:
    with (
        losing_front(address(real.grpc_port)) as (front, lossy),
        PelotonClient(lossy, timeout=10) as client,
        pytest.raises(ClientError) as lost,
    ):
        client.create_job(make_spec(1))
    assert lost.value.code == UNAVAILABLE
    (sent,) = front.requests
    assert isinstance(sent, job_pb2.CreateJobRequest) and sent.request_id == ""
    assert len(all_jobs(real)) == 1


def test_other_errors_and_a_restart_whose_reply_was_lost_are_not_retried(real: Server) -> None:
    real_address = address(real.grpc_port)
    with PelotonClient(real_address, timeout=10) as direct:
        job_id = direct.create_job(make_spec(1)).job_id
    drive(real, job_id, [0], (*TO_RUNNING, TaskState.SUCCEEDED))
    with (
        losing_front(real_address) as (front, lossy),
        PelotonClient(f"{lossy},{real_address}", timeout=10) as client,
    ):
        with pytest.raises(ClientError) as refused:
            client.get_job(job_id)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        # Restarted by the front; sent again it would start the new attempt over.
        with pytest.raises(ClientError) as lost:
            client.restart_job(job_id)
        assert lost.value.code == UNAVAILABLE
        assert client.current == lossy
    kinds = [type(r).__name__ for r in front.requests]
    assert kinds == ["GetJobRequest", "RestartJobRequest"]
    with PelotonClient(real_address, timeout=10) as direct:
        (task,) = direct.list_tasks(job_id).tasks
        assert task.current.attempt == 2, task


def test_a_restart_fails_over_when_the_first_daemon_cannot_be_reached(real: Server) -> None:
    real_address = address(real.grpc_port)
    with losing_front(real_address) as (_, gone):
        pass  # stopped: nothing listens there now
    with PelotonClient(real_address, timeout=10) as direct:
        job_id = direct.create_job(make_spec(1)).job_id
    drive(real, job_id, [0], (*TO_RUNNING, TaskState.SUCCEEDED))
    with PelotonClient(f"{gone},{real_address}", timeout=10) as client:
        client.restart_job(job_id)  # the request never left: safe to send to the next daemon
        assert client.current == real_address
        (task,) = client.list_tasks(job_id).tasks
        assert task.current.attempt == 2, task


def test_a_watch_resumes_on_the_next_daemon_after_the_last_event(real: Server) -> None:
    real_address = address(real.grpc_port)
    with PelotonClient(real_address, timeout=10) as direct:
        job_id = direct.create_job(make_spec(2)).job_id
        drive(real, job_id, [0, 1], (*TO_RUNNING, TaskState.SUCCEEDED))
        whole = [u.event.sequence for u in direct.watch_job(job_id)]
    assert len(whole) > 3
    with (
        losing_front(real_address) as (front, lossy),
        PelotonClient(f"{lossy},{real_address}", timeout=10) as client,
    ):
        updates = list(client.watch_job(job_id))
        assert client.current == real_address
    # Two events from the front, the rest from the real daemon: each once, in order.
    assert [u.event.sequence for u in updates] == whole
    assert updates[-1].job_state == job_pb2.JOB_STATE_SUCCEEDED
    assert len(front.requests) == 1


# ---------------------------------------------------------------------------- real processes

on_postgresql = pytest.mark.parametrize("backend", ["postgresql"])
RUN_SECONDS = 120


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    """Two agents with 2 GPUs each."""
    mc = start_minicluster([AgentSpec(f"agent-{i}", resources=AGENT) for i in range(2)], tmp_path)
    yield mc
    mc.stop()


@pytest.fixture
def pair(db_url: str, tmp_path: Path, cluster: Minicluster) -> Iterator[dict[str, DaemonProcess]]:
    """Daemons a (the leader) and b on one database and one minicluster."""
    mesos = ["--mesos-master", cluster.address, "--offer-refuse-seconds", "1"]
    procs: dict[str, DaemonProcess] = {}
    try:
        a = procs["a"] = start(db_url, tmp_path, "a", mesos).wait_ready()
        wait_for(
            lambda: SCHEDULES in a.stderr, START_SECONDS, "a to schedule", state=lambda: a.stderr
        )
        procs["b"] = start(db_url, tmp_path, "b", mesos).wait_ready()
        yield procs
    finally:
        close_all(procs)


class Watcher:
    """``client.watch_job`` consumed on a thread of its own, so that the test waits on it with
    a deadline (and sees what it got so far)."""

    def __init__(self, client: PelotonClient, job_id: str) -> None:
        self.updates: list[job_pb2.WatchJobResponse] = []
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(client, job_id), name="watcher", daemon=True
        )
        self._thread.start()

    def _run(self, client: PelotonClient, job_id: str) -> None:
        try:
            for update in client.watch_job(job_id):
                self.updates.append(update)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.done.set()

    def seen(self) -> list[str]:
        return [f"{u.event.sequence} {u.event.to_state}" for u in self.updates]


def job_states(client: PelotonClient, job_ids: list[str]) -> dict[str, str]:
    return {j: job_pb2.JobState.Name(client.get_job(j).state) for j in job_ids}


@on_postgresql
def test_the_client_fails_over_when_the_daemon_listed_first_is_killed(
    db_url: str, cluster: Minicluster, pair: dict[str, DaemonProcess]
) -> None:
    a, b = pair["a"], pair["b"]
    both = f"{a.address},{b.address}"
    with PelotonClient(both, timeout=10) as client, PelotonClient(b.address, timeout=10) as on_b:
        first = client.create_job(make_spec(2, name="first", command="sleep 2", gpu=1)).job_id
        assert client.current == a.address
        watcher = Watcher(client, first)
        # A watch on the follower sees what the leader writes (b polls the events).
        on_follower = Watcher(on_b, first)
        wait_for(
            lambda: any(u.job_state == job_pb2.JOB_STATE_RUNNING for u in on_follower.updates),
            START_SECONDS,
            "the first job running, seen by a watch on b",
            state=lambda: (job_states(on_b, [first]), watcher.seen(), on_follower.seen()),
        )
        a.kill()
        # The next calls go to a, are refused, and are sent to b, which answers.
        second = client.create_job(make_spec(2, name="second", command="true", gpu=1))
        assert client.current == b.address
        assert client.get_job(second.job_id).job_id == second.job_id
        listed = {j.job_id for j in client.iter_jobs()}
        assert listed == {first, second.job_id}
        # The CLI given both addresses too.
        shown = run_peloton("job", "get", second.job_id, server=both)
        assert shown.returncode == 0, shown.stderr
        assert second.job_id in shown.stdout
        assert wait_leader(db_url, {"b": b}, TAKEOVER_SECONDS) == "b"
        jobs = [first, second.job_id]
        wait_for(
            lambda: all(client.get_job(j).state in DONE for j in jobs),
            RUN_SECONDS,
            "both jobs to end",
            interval=0.2,
            state=lambda: (job_states(on_b, jobs), watcher.seen()),
        )
        assert set(job_states(client, jobs).values()) == {"JOB_STATE_SUCCEEDED"}
        # The watch that was on a resumed on b: every event of the job once, in order.
        whole = [u.event.sequence for u in on_b.watch_job(first)]
        for w in (watcher, on_follower):
            wait_for(
                w.done.is_set,
                TAKEOVER_SECONDS,
                "the watch to end",
                state=lambda w=w: (w.error, w.seen(), whole),
            )
            assert w.error is None, w.error
            assert [u.event.sequence for u in w.updates] == whole
            assert w.updates[-1].job_state == job_pb2.JOB_STATE_SUCCEEDED
        listing = run_peloton("job", "list", server=both)
        assert listing.returncode == 0 and first in listing.stdout, listing
    assert_launched_once(cluster)


# ---------------------------------------------------------------------------- README

README_ADDRESSES = ("127.0.0.1:5392", "127.0.0.1:5393")


def readme_failover_block() -> str:
    """The second block of README's "Several daemons": commands given both daemons."""
    section = (ROOT / "README.md").read_text().split("\n## Several daemons\n", 1)[1]
    return section.split("\n## ", 1)[0].split("\n```\n")[3]


@on_postgresql
def test_the_readme_failover_block_runs_as_written(db_url: str, tmp_path: Path) -> None:
    """The block's commands, on the README's two daemons (ports the kernel picked), the first
    of them killed."""
    procs: dict[str, DaemonProcess] = {}
    try:
        for name in ("a", "b"):  # one after the other (README: both would create /default)
            procs[name] = start(db_url, tmp_path, name).wait_ready()
        procs["a"].kill()
        text = readme_failover_block()
        for readme, proc in zip(README_ADDRESSES, procs.values(), strict=True):
            assert readme in text, text
            text = text.replace(readme, proc.address)
        outputs = []
        for line in text.splitlines():
            words = shlex.split(line)
            assert words[0] == "peloton", line
            result = run_peloton(*words[1:], env={"XDG_DATA_HOME": str(tmp_path / "xdg")})
            assert result.returncode == 0, (line, result.stderr)
            outputs.append(result.stdout)
        submitted, listed = outputs
        job_id = submitted.split()[1]
        assert submitted == f"job {job_id} created\n", submitted
        assert job_id in listed, listed
    finally:
        close_all(procs)


def test_a_frozen_daemon_is_left_for_the_next_after_the_call_s_timeout(real: Server) -> None:
    real_address = address(real.grpc_port)
    with PelotonClient(real_address, timeout=10) as direct:
        job_id = direct.create_job(make_spec(1)).job_id
    drive(real, job_id, [0], (*TO_RUNNING, TaskState.SUCCEEDED))
    frozen = FrozenFront()
    try:
        with serving(frozen) as stuck:
            with PelotonClient(f"{stuck},{real_address}", timeout=FROZEN_TIMEOUT) as client:
                # A read: DEADLINE_EXCEEDED at the frozen one, then the next one's answer.
                assert client.get_job(job_id).job_id == job_id
                assert client.current == real_address
            # A restart is not sent again where the first daemon may have done it.
            with (
                PelotonClient(f"{stuck},{real_address}", timeout=FROZEN_TIMEOUT) as client,
                pytest.raises(ClientError) as late,
            ):
                client.restart_job(job_id)
            assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert [type(r).__name__ for r in frozen.requests] == [
                "GetJobRequest",
                "RestartJobRequest",
            ]
    finally:
        frozen.thawed.set()
    with PelotonClient(real_address, timeout=10) as direct:
        (task,) = direct.list_tasks(job_id).tasks
        assert task.current.attempt == 1, task
