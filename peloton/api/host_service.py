"""HostService: hosts (Mesos agents) and what task sandboxes hold: their logs and the GPUs their
tasks report (proto/peloton/v1/host.proto)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import grpc

from peloton.api.authz import Authorizer, method_name
from peloton.api.convert import timestamp
from peloton.core.containers import container_launch, runs_in_shell
from peloton.core.hosts import HostState, HostView
from peloton.core.records import AttemptRecord, EventRecord, TaskRecord
from peloton.core.states import TASK_ACTIVE, TASK_TERMINAL, TASK_UNLAUNCHED
from peloton.errors import FailedPrecondition, InvalidArgument, NotFound
from peloton.hostmgr.hosts import HostRegistry
from peloton.hostmgr.sandbox import GPU_REPORT, read_file, sandbox_path
from peloton.jobmgr.manager import JobManager
from peloton.v1 import host_pb2, host_pb2_grpc

if TYPE_CHECKING:  # pymesos (imported by the framework) is only loaded when Mesos is used
    from peloton.hostmgr.framework import HostManager

DEFAULT_LOG_BYTES = 64 * 1024
MAX_LOG_BYTES = 1024 * 1024
# A GPU report is one short line; what is longer names no indices anyway.
MAX_GPU_REPORT_BYTES = 4096
# How much of a report that names no indices its reason quotes.
QUOTED_REPORT_CHARS = 80

LIST_HOSTS = method_name("HostService", "ListHosts")
GET_HOST = method_name("HostService", "GetHost")
DRAIN_HOST = method_name("HostService", "DrainHost")
UNDRAIN_HOST = method_name("HostService", "UndrainHost")
GET_TASK_LOGS = method_name("HostService", "GetTaskLogs")
GET_TASK_GPUS = method_name("HostService", "GetTaskGpus")


def host_pb(view: HostView) -> host_pb2.Host:
    r = view.record
    return host_pb2.Host(
        hostname=r.hostname,
        agent_id=r.agent_id,
        state=r.state.value,
        total=r.total.to_proto(),
        used=view.used.to_proto(),
        free=view.free.to_proto(),
        attributes=dict(r.attributes),
        address=r.address,
        updated_at=timestamp(r.updated_at),
    )


def _hostname(value: str) -> str:
    if not value:
        raise InvalidArgument("hostname", "is required")
    return value


class HostService(host_pb2_grpc.HostServiceServicer):
    """Thin servicer over the host registry (and the host manager for sandboxes)."""

    def __init__(
        self,
        hosts: HostRegistry,
        jobs: JobManager,
        authz: Authorizer,
        hostmgr: HostManager | None = None,
    ) -> None:
        self._hosts = hosts
        self._jobs = jobs
        self._authz = authz
        self._hostmgr = hostmgr

    def ListHosts(
        self, request: host_pb2.ListHostsRequest, context: grpc.ServicerContext
    ) -> host_pb2.ListHostsResponse:
        self._authz.check(LIST_HOSTS)
        known = {s.value for s in HostState}
        for i, state in enumerate(request.states):
            if state not in known:
                raise InvalidArgument(
                    f"states[{i}]", f"unknown host state {state!r}; one of {sorted(known)}"
                )
        wanted = set(request.states)
        views = [v for v in self._hosts.list() if not wanted or v.record.state.value in wanted]
        return host_pb2.ListHostsResponse(hosts=[host_pb(v) for v in views])

    def GetHost(
        self, request: host_pb2.GetHostRequest, context: grpc.ServicerContext
    ) -> host_pb2.GetHostResponse:
        self._authz.check(GET_HOST)
        return host_pb2.GetHostResponse(host=host_pb(self._hosts.get(_hostname(request.hostname))))

    def DrainHost(
        self, request: host_pb2.DrainHostRequest, context: grpc.ServicerContext
    ) -> host_pb2.DrainHostResponse:
        self._authz.check(DRAIN_HOST)
        view = self._hosts.set_draining(_hostname(request.hostname), True)
        return host_pb2.DrainHostResponse(host=host_pb(view))

    def UndrainHost(
        self, request: host_pb2.UndrainHostRequest, context: grpc.ServicerContext
    ) -> host_pb2.UndrainHostResponse:
        self._authz.check(UNDRAIN_HOST)
        view = self._hosts.set_draining(_hostname(request.hostname), False)
        return host_pb2.UndrainHostResponse(host=host_pb(view))

    def GetTaskLogs(
        self, request: host_pb2.GetTaskLogsRequest, context: grpc.ServicerContext
    ) -> host_pb2.GetTaskLogsResponse:
        if not request.job_id:
            raise InvalidArgument("job_id", "is required")
        if request.offset < 0:
            raise InvalidArgument("offset", f"must be >= 0 (got {request.offset})")
        if request.length > MAX_LOG_BYTES:
            raise InvalidArgument("length", f"at most {MAX_LOG_BYTES} (got {request.length})")
        if request.previous and request.attempt:
            raise InvalidArgument("previous", "cannot be combined with attempt: give one of them")
        self._authz.check_job_id(GET_TASK_LOGS, request.job_id, self._jobs.get_job)
        task, events = self._jobs.get_task(request.job_id, request.instance_id)
        chosen = pick_attempt(task, events, request.attempt, request.previous)
        address, framework_id, executor_id = self._sandbox(chosen)
        ended = _ended(task, chosen)
        name = "stderr" if request.stderr else "stdout"
        try:
            data, offset = read_file(
                address,
                sandbox_path(framework_id, executor_id, chosen.id, name),
                request.offset,
                request.length or DEFAULT_LOG_BYTES,
            )
        except NotFound:
            if not ended:
                raise  # a task just launched whose executor has not made its sandbox yet
            raise NotFound(
                f"the sandbox of attempt {chosen.attempt} ({chosen.id}) is no longer on its "
                f"agent {chosen.host} ({address}): the agent garbage-collected it"
            ) from None
        return host_pb2.GetTaskLogsResponse(
            data=data, offset=offset, ended=ended, task_id=chosen.id, attempt=chosen.attempt
        )

    def GetTaskGpus(
        self, request: host_pb2.GetTaskGpusRequest, context: grpc.ServicerContext
    ) -> host_pb2.GetTaskGpusResponse:
        if not request.job_id:
            raise InvalidArgument("job_id", "is required")
        # Read first (NOT_FOUND for an unknown job): a job's spec never changes once created,
        # so it is what every attempt was launched with.
        job = self._jobs.get_job(request.job_id)
        self._authz.check_job(GET_TASK_GPUS, job)
        task, events = self._jobs.get_task(request.job_id, request.instance_id)
        chosen = pick_attempt(task, events, request.attempt, previous=False)
        spec = job.spec.task
        answer = host_pb2.GetTaskGpusResponse(
            task_id=chosen.id, attempt=chosen.attempt, requested=int(spec.resources.gpu)
        )
        if not answer.requested:
            answer.reported = True  # no GPU to report: the agent need not be asked
            return answer
        container = container_launch(spec)
        if container is not None and not runs_in_shell(container):
            answer.reason = (
                f"its container's entrypoint is {container.entrypoint!r}: only a command that "
                "runs through a shell reports its GPUs"
            )
            return answer
        address, framework_id, executor_id = self._sandbox(chosen)
        path = sandbox_path(framework_id, executor_id, chosen.id, GPU_REPORT)
        try:
            data, _ = read_file(address, path, 0, MAX_GPU_REPORT_BYTES)
        except NotFound:
            data = b""
        text = data.decode("utf-8", errors="replace")
        # The line ends the report: a file without it is still being written.
        if not text.endswith("\n"):
            answer.reason = (
                f"attempt {chosen.attempt} left no report of its GPUs in its sandbox: its agent "
                "garbage-collected the sandbox, or it ended before its command started"
                if _ended(task, chosen)
                else f"attempt {chosen.attempt} has not reported its GPUs yet: its command "
                "reports them as it starts"
            )
            return answer
        indices = gpu_indices(text)
        if indices is None:
            seen = text.strip()
            if len(seen) > QUOTED_REPORT_CHARS:
                seen = seen[:QUOTED_REPORT_CHARS] + "..."
            answer.reason = (
                f"the task sees its GPUs as {seen!r}, not by host index (CUDA_VISIBLE_DEVICES "
                "names them by UUID or MIG device)"
            )
            return answer
        answer.reported = True
        answer.gpu_indices.extend(indices)
        return answer

    def _sandbox(self, attempt: AttemptRecord) -> tuple[str, str, str]:
        """(agent address, framework id, executor id) of an attempt's sandbox."""
        if self._hostmgr is None:
            raise FailedPrecondition("no Mesos master is configured (server --mesos-master)")
        return self._hostmgr.sandbox(attempt)


def _ended(task: TaskRecord, attempt: AttemptRecord) -> bool:
    """Whether the attempt has ended: an earlier one, or the current one in a terminal state."""
    return attempt is not task.current or attempt.state in TASK_TERMINAL


def gpu_indices(report: str) -> list[int] | None:
    """The host GPU indices of a task's report (see peloton.hostmgr.launch.gpu_report), in its
    order: "2,3" is [2, 3], an empty line none; None if it names something else."""
    line = report.strip()
    if not line:
        return []
    parts = [p.strip() for p in line.split(",")]
    if not all(p.isascii() and p.isdigit() and int(p) < 2**32 for p in parts):
        return None
    return [int(p) for p in parts]


def pick_attempt(
    task: TaskRecord, events: Sequence[EventRecord], number: int, previous: bool
) -> AttemptRecord:
    """The attempt whose sandbox GetTaskLogs and GetTaskGpus read: attempt ``number`` (1, 2,
    ...), the latest one before the current one that reached a host (``previous``), or else the
    latest one that reached a host (a task waiting to restart shows the run that ended, as
    kubectl does)."""
    launched = {e.attempt_id for e in events if e.to_state in TASK_ACTIVE}

    def reached_host(a: AttemptRecord) -> bool:
        if a is task.current:
            return a.state not in TASK_UNLAUNCHED
        # An ended attempt's state says nothing of where it got: its events (or start) do.
        return a.id in launched or a.started_at is not None

    where = f"task {task.instance_id} of job {task.job_id}"
    if number:
        return _numbered(task, number, where, reached_host)
    earlier = task.history if previous else (*task.history, task.current)
    ran = [a for a in earlier if reached_host(a)]
    if ran:
        return ran[-1]
    if not previous:
        raise FailedPrecondition(
            f"task {task.instance_id} is {task.current.state}: it has not been launched"
        )
    if not task.history:
        raise FailedPrecondition(
            f"previous: {where} has only one attempt ({task.current.attempt}); "
            "no earlier one to show"
        )
    raise FailedPrecondition(
        f"previous: no attempt of {where} before attempt {task.current.attempt} reached a host"
    )


def _numbered(
    task: TaskRecord, number: int, where: str, reached_host: Callable[[AttemptRecord], bool]
) -> AttemptRecord:
    """Attempt ``number`` of the task, if it exists and reached a host."""
    attempts = (*task.history, task.current)
    found = next((a for a in attempts if a.attempt == number), None)
    if found is None:
        first, last = attempts[0].attempt, attempts[-1].attempt
        which = f"only attempt is {first}" if first == last else f"attempts are {first} to {last}"
        raise NotFound(f"attempt: {where} has no attempt {number}; its {which}")
    if reached_host(found):
        return found
    if found is task.current:
        raise FailedPrecondition(
            f"attempt {number} of {where} is {found.state}: it has not reached a host yet"
        )
    raise FailedPrecondition(
        f"attempt {number} of {where} ended {found.state} before it reached a host"
    )
