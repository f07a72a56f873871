"""HostService over real gRPC (no Mesos master configured): hosts, drain, and log errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from daemon import address, error_line, in_process_server, migrated_sqlite_url, run_peloton
from support import make_spec

from peloton.core.resources import Resources
from peloton.server import Server
from peloton.v1 import host_pb2, host_pb2_grpc

HOST = Resources(cpu=8, mem_mb=32768, disk_mb=100000, gpu=4)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with in_process_server(migrated_sqlite_url(tmp_path), tmp_path / "data") as s:
        yield s


@pytest.fixture
def stub(server: Server) -> Iterator[host_pb2_grpc.HostServiceStub]:
    with grpc.insecure_channel(address(server.grpc_port)) as channel:
        yield host_pb2_grpc.HostServiceStub(channel)


def error(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return info.value


def test_hosts_list_get_drain_undrain(server: Server, stub: host_pb2_grpc.HostServiceStub) -> None:
    assert server.hosts is not None
    server.hosts.observe("h2", "a2", HOST, {"rack": "r2"}, "127.0.0.1:5052")
    server.hosts.observe("h1", "a1", HOST, {"rack": "r1", "gpu_model": "A100"}, "127.0.0.1:5051")
    hosts = stub.ListHosts(host_pb2.ListHostsRequest()).hosts
    assert [h.hostname for h in hosts] == ["h1", "h2"]
    h1 = stub.GetHost(host_pb2.GetHostRequest(hostname="h1")).host
    assert (h1.state, h1.total.gpu, h1.free.gpu, h1.attributes["gpu_model"]) == (
        "UP",
        4,
        4,
        "A100",
    )
    assert stub.DrainHost(host_pb2.DrainHostRequest(hostname="h1")).host.state == "DRAINING"
    assert server.hosts.draining() == {"a1"}
    listed = stub.ListHosts(host_pb2.ListHostsRequest(states=["DRAINING"])).hosts
    assert [h.hostname for h in listed] == ["h1"]
    assert stub.UndrainHost(host_pb2.UndrainHostRequest(hostname="h1")).host.state == "UP"


def test_agents_that_share_a_hostname_are_named_by_agent_id(
    server: Server, stub: host_pb2_grpc.HostServiceStub
) -> None:
    assert server.hosts is not None
    for agent in ("a1", "a2"):
        server.hosts.observe("node-a", agent, HOST, {"rack": "r1"}, "127.0.0.1:5051")
    hosts = stub.ListHosts(host_pb2.ListHostsRequest()).hosts
    assert [(h.hostname, h.agent_id) for h in hosts] == [("node-a", "a1"), ("node-a", "a2")]
    e = error(lambda: stub.DrainHost(host_pb2.DrainHostRequest(hostname="node-a")))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "node-a names 2 agents (a1, a2)" in str(e.details())
    assert stub.DrainHost(host_pb2.DrainHostRequest(hostname="a2")).host.state == "DRAINING"
    assert stub.GetHost(host_pb2.GetHostRequest(hostname="a1")).host.state == "UP"
    at = address(server.grpc_port)
    table = run_peloton("host", "list", server=at)
    assert table.returncode == 0, table.stderr
    assert "a1" in table.stdout and "a2" in table.stdout
    ambiguous = run_peloton("host", "get", "node-a", server=at)
    assert ambiguous.returncode != 0
    assert "give its agent id" in error_line(ambiguous)


def test_bad_requests_name_the_field(stub: host_pb2_grpc.HostServiceStub) -> None:
    e = error(lambda: stub.GetHost(host_pb2.GetHostRequest()))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "hostname" in str(e.details())
    e = error(lambda: stub.GetHost(host_pb2.GetHostRequest(hostname="nope")))
    assert e.code() == grpc.StatusCode.NOT_FOUND and "nope" in str(e.details())
    e = error(lambda: stub.ListHosts(host_pb2.ListHostsRequest(states=["BUSY"])))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "states[0]" in str(e.details())
    e = error(lambda: stub.GetTaskLogs(host_pb2.GetTaskLogsRequest()))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "job_id" in str(e.details())


def test_logs_of_an_unlaunched_task_fail_precondition(
    server: Server, stub: host_pb2_grpc.HostServiceStub
) -> None:
    assert server.jobs is not None
    job, _ = server.jobs.create_job(make_spec(1))
    e = error(lambda: stub.GetTaskLogs(host_pb2.GetTaskLogsRequest(job_id=job.id)))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not been launched" in str(e.details())
    e = error(lambda: stub.GetTaskLogs(host_pb2.GetTaskLogsRequest(job_id=job.id, instance_id=9)))
    assert e.code() == grpc.StatusCode.NOT_FOUND


def test_logs_of_an_attempt_name_the_field_and_the_attempts_that_exist(
    server: Server, stub: host_pb2_grpc.HostServiceStub
) -> None:
    assert server.jobs is not None
    job, _ = server.jobs.create_job(make_spec(1))

    def logs(attempt: int = 0, previous: bool = False) -> grpc.RpcError:
        request = host_pb2.GetTaskLogsRequest(job_id=job.id, attempt=attempt, previous=previous)
        return error(lambda: stub.GetTaskLogs(request))

    e = logs(attempt=1, previous=True)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "previous" in str(e.details())
    e = logs(attempt=2)
    assert e.code() == grpc.StatusCode.NOT_FOUND
    assert str(e.details()).startswith("attempt: ") and "only attempt is 1" in str(e.details())
    e = logs(attempt=1)
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "attempt 1" in str(e.details()) and "not reached a host" in str(e.details())
    e = logs(previous=True)
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "only one attempt" in str(e.details())


def test_task_gpus_name_the_field_the_task_and_the_attempts_that_exist(
    server: Server, stub: host_pb2_grpc.HostServiceStub
) -> None:
    assert server.jobs is not None
    job, _ = server.jobs.create_job(make_spec(1))

    def gpus(**fields: object) -> grpc.RpcError:
        request = host_pb2.GetTaskGpusRequest(**fields)  # type: ignore[arg-type]
        return error(lambda: stub.GetTaskGpus(request))

    e = gpus()
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "job_id" in str(e.details())
    e = gpus(job_id="nope")
    assert e.code() == grpc.StatusCode.NOT_FOUND and "nope" in str(e.details())
    e = gpus(job_id=job.id, instance_id=9)
    assert e.code() == grpc.StatusCode.NOT_FOUND and "no instance 9" in str(e.details())
    e = gpus(job_id=job.id, attempt=2)
    assert e.code() == grpc.StatusCode.NOT_FOUND
    assert str(e.details()).startswith("attempt: ") and "only attempt is 1" in str(e.details())
    e = gpus(job_id=job.id)
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not been launched" in str(e.details())


def test_cli_host_commands(server: Server) -> None:
    assert server.hosts is not None
    server.hosts.observe("h1", "a1", HOST, {"rack": "r1"}, "127.0.0.1:5051")
    at = address(server.grpc_port)
    listed = run_peloton("host", "list", "-o", "json", server=at)
    assert listed.returncode == 0, listed.stderr
    (h1,) = json.loads(listed.stdout)
    assert (h1["hostname"], h1["state"], h1["total"]["gpu"]) == ("h1", "UP", 4)
    drained = run_peloton("host", "drain", "h1", server=at)
    assert drained.stdout.strip() == "host h1 is DRAINING"
    assert "DRAINING" in run_peloton("host", "get", "h1", server=at).stdout
    missing = run_peloton("host", "undrain", "nope", server=at)
    assert missing.returncode != 0
    assert "nope" in error_line(missing)
