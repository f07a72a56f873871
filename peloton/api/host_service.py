"""HostService: hosts (Mesos agents) and task sandbox logs (proto/peloton/v1/host.proto)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from peloton.api.convert import timestamp
from peloton.errors import FailedPrecondition, InvalidArgument
from peloton.hostmgr.hosts import HostRegistry, HostState, HostView
from peloton.hostmgr.sandbox import read_file, sandbox_path
from peloton.jobmgr.manager import JobManager
from peloton.jobmgr.states import TASK_TERMINAL, TASK_UNLAUNCHED
from peloton.v1 import host_pb2, host_pb2_grpc

if TYPE_CHECKING:  # pymesos (imported by the framework) is only loaded when Mesos is used
    from peloton.hostmgr.framework import HostManager

DEFAULT_LOG_BYTES = 64 * 1024
MAX_LOG_BYTES = 1024 * 1024


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
        self, hosts: HostRegistry, jobs: JobManager, hostmgr: HostManager | None = None
    ) -> None:
        self._hosts = hosts
        self._jobs = jobs
        self._hostmgr = hostmgr

    def ListHosts(
        self, request: host_pb2.ListHostsRequest, context: grpc.ServicerContext
    ) -> host_pb2.ListHostsResponse:
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
        return host_pb2.GetHostResponse(host=host_pb(self._hosts.get(_hostname(request.hostname))))

    def DrainHost(
        self, request: host_pb2.DrainHostRequest, context: grpc.ServicerContext
    ) -> host_pb2.DrainHostResponse:
        view = self._hosts.set_draining(_hostname(request.hostname), True)
        return host_pb2.DrainHostResponse(host=host_pb(view))

    def UndrainHost(
        self, request: host_pb2.UndrainHostRequest, context: grpc.ServicerContext
    ) -> host_pb2.UndrainHostResponse:
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
        task, _ = self._jobs.get_task(request.job_id, request.instance_id)
        current = task.current
        if current.state in TASK_UNLAUNCHED:
            raise FailedPrecondition(
                f"task {request.instance_id} is {current.state}: it has not been launched"
            )
        if self._hostmgr is None:
            raise FailedPrecondition("no Mesos master is configured (server --mesos-master)")
        address, framework_id, executor_id = self._hostmgr.sandbox(current.id, current.host)
        name = "stderr" if request.stderr else "stdout"
        data, offset = read_file(
            address,
            sandbox_path(framework_id, executor_id, current.id, name),
            request.offset,
            request.length or DEFAULT_LOG_BYTES,
        )
        return host_pb2.GetTaskLogsResponse(
            data=data, offset=offset, ended=current.state in TASK_TERMINAL, task_id=current.id
        )
