"""PoolService over real gRPC, ``peloton pool``, persistence, metrics and pending reasons."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from daemon import address, error_line, in_process_server, run_peloton
from support import make_spec

from peloton.client import ClientError, PelotonClient
from peloton.core.resources import Resources
from peloton.server import Server
from peloton.v1 import job_pb2, pool_pb2

P = pool_pb2
VISION = """\
path: /research/vision
owner: vision-team
resources:
  gpu:    {reservation: 4, limit: 32, share: 2}
  cpu:    {reservation: 32, limit: 256}
queue_policy: fifo
"""


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    with in_process_server(db_url, tmp_path / "data", pools=()) as s:
        yield s


@pytest.fixture
def client(server: Server) -> Iterator[PelotonClient]:
    with PelotonClient(address(server.grpc_port), timeout=10) as c:
        yield c


def spec(path: str, **gpu: float) -> pool_pb2.PoolSpec:
    s = P.PoolSpec(path=path, owner="team")
    if gpu:
        s.resources["gpu"].CopyFrom(P.ResourceConfig(**gpu))  # type: ignore[arg-type]
    return s


def preemptible(job: job_pb2.JobSpec) -> job_pb2.JobSpec:
    """Non-preemptible jobs run only within reservations; these may borrow."""
    job.preemption.preemptible = True
    return job


def code_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(ClientError) as info:
        call()  # type: ignore[operator]
    return info.value.code, info.value.details


def test_create_get_update_delete(client: PelotonClient) -> None:
    created = client.create_pool(spec("/research", reservation=8, limit=64))
    assert created.spec.path == "/research"
    assert created.status["gpu"].reservation == 8 and created.status["gpu"].limit == 64
    client.create_pool(spec("/research/vision", reservation=4, limit=32, share=2))
    got = client.get_pool("/research")
    assert list(got.children) == ["/research/vision"]
    assert not got.status["cpu"].HasField("limit")  # unlimited

    updated = client.update_pool(spec("/research/vision", reservation=6, limit=16))
    assert updated.status["gpu"].reservation == 6
    assert updated.spec.resources["gpu"].share == 1  # left out: back to the default

    tree = client.list_pools()
    assert [p.spec.path for p in tree] == ["/", "/default", "/research", "/research/vision"]
    client.delete_pool("/research/vision")
    assert [p.spec.path for p in client.list_pools()][-1] == "/research"


@pytest.mark.parametrize(
    ("make", "code", "text"),
    [
        (lambda c: c.create_pool(spec("/a", reservation=8, limit=4)), "INVALID_ARGUMENT",
         "resources.gpu.reservation: 8 is more than the limit 4"),
        (lambda c: c.create_pool(P.PoolSpec(path="/a", resources={"tpu": P.ResourceConfig()})),
         "INVALID_ARGUMENT", "resources.tpu: unknown resource kind"),
        (lambda c: c.create_pool(spec("no-slash")), "INVALID_ARGUMENT", "path: 'no-slash'"),
        (lambda c: c.create_pool(spec("/x/y")), "NOT_FOUND", "parent pool /x of /x/y"),
        (lambda c: c.create_pool(spec("/default")), "ALREADY_EXISTS", "pool /default"),
        (lambda c: c.update_pool(spec("/nope")), "NOT_FOUND", "pool /nope not found"),
        (lambda c: c.get_pool("/nope"), "NOT_FOUND", "pool /nope not found"),
        (lambda c: c.get_pool(""), "INVALID_ARGUMENT", "path: is required"),
        (lambda c: c.delete_pool("/"), "FAILED_PRECONDITION", "cannot be deleted"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field_and_reason(
    client: PelotonClient, make: object, code: str, text: str
) -> None:
    got_code, details = code_of(lambda: make(client))  # type: ignore[operator]
    assert got_code.name == code
    assert text in details


def test_pool_with_jobs_cannot_be_deleted_and_jobs_need_a_leaf(client: PelotonClient) -> None:
    client.create_pool(spec("/org"))
    client.create_pool(spec("/org/team"))
    job = client.create_job(make_spec(1, pool="/org/team"))
    code, details = code_of(lambda: client.delete_pool("/org/team"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "1 unfinished jobs" in details
    code, details = code_of(lambda: client.create_job(make_spec(1, pool="/org")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == "pool: pool /org has child pools; jobs run only in leaf pools"
    code, _ = code_of(lambda: client.create_pool(spec("/org/team/sub")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    client.kill_job(job.job_id)
    client.delete_pool("/org/team")


def test_pools_survive_a_restart(db_url: str, tmp_path: Path) -> None:
    with (
        in_process_server(db_url, tmp_path / "one", pools=()) as one,
        PelotonClient(address(one.grpc_port)) as c,
    ):
        c.create_pool(spec("/keep", reservation=2, limit=10, share=3))
    with (
        in_process_server(db_url, tmp_path / "two", pools=()) as two,
        PelotonClient(address(two.grpc_port)) as c,
    ):
        kept = c.get_pool("/keep")
        assert (kept.spec.resources["gpu"].reservation, kept.status["gpu"].limit) == (2, 10)
        assert kept.spec.resources["gpu"].share == 3
        assert [p.spec.path for p in c.list_pools()] == ["/", "/default", "/keep"]


def test_metrics_and_pending_reason_follow_the_cluster(
    server: Server, client: PelotonClient
) -> None:
    client.create_pool(spec("/vision", reservation=4))
    first = client.create_job(preemptible(make_spec(2, pool="/vision", gpu=2)))
    job = client.create_job(preemptible(make_spec(3, pool="/vision", gpu=2)))
    assert server.resmgr is not None
    server.resmgr.run_cycle()
    # This daemon has no Mesos master: the reason says so.
    assert client.get_job(job.job_id).message == (
        "no hosts known yet: no Mesos master is configured (--mesos-master), nothing launches"
    )

    server.resmgr.set_capacity(Resources(cpu=64, mem_mb=65536, disk_mb=1e6, gpu=8))
    server.resmgr.run_cycle()
    assert client.get_job(first.job_id).reason == "admitted"
    pending = client.get_job(job.job_id)
    assert pending.reason == "pool_entitlement"
    assert pending.message == "pool /vision: gpu entitlement 8, allocated 4, gang needs 6"

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
            return str(r.read().decode())

    text = scrape()
    assert 'peloton_pool_entitlement{kind="gpu",pool="/vision"} 8.0' in text
    assert 'peloton_pool_reservation{kind="gpu",pool="/vision"} 4.0' in text
    assert 'peloton_pool_allocation{kind="gpu",pool="/vision"} 4.0' in text
    assert 'peloton_pool_demand{kind="gpu",pool="/vision"} 10.0' in text
    assert 'peloton_pool_queue_gangs{pool="/vision"} 1.0' in text
    assert 'peloton_pool_limit{kind="gpu",pool="/vision"} +Inf' in text
    assert 'peloton_gang_admission_seconds_count{pool="/vision"} 1.0' in text

    server.resmgr.set_capacity(Resources(cpu=64, mem_mb=65536, disk_mb=1e6, gpu=16))
    server.resmgr.run_cycle()
    assert client.get_job(job.job_id).reason == "admitted"
    text = scrape()
    assert 'peloton_pool_allocation{kind="gpu",pool="/vision"} 10.0' in text
    assert 'peloton_gang_admission_seconds_count{pool="/vision"} 2.0' in text


# ---------------------------------------------------------------------------- the CLI


def test_cli_pool_commands(server: Server, tmp_path: Path) -> None:
    addr = address(server.grpc_port)
    (tmp_path / "research.yaml").write_text(
        "path: /research\nresources: {gpu: {reservation: 8}, cpu: {reservation: 64}}"
    )
    (tmp_path / "vision.yaml").write_text(VISION)

    def ok(*args: str) -> str:
        result = run_peloton(*args, server=addr, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert ok("pool", "create", "research.yaml") == "pool /research created\n"
    assert ok("pool", "create", "vision.yaml") == "pool /research/vision created\n"
    doc = json.loads(ok("pool", "get", "/research/vision", "-o", "json"))
    assert doc["spec"]["queue_policy"] == "QUEUE_POLICY_FIFO"
    assert doc["status"]["gpu"]["reservation"] == 4
    table = ok("pool", "get", "/research/vision")
    assert "vision-team" in table and "FIFO" in table
    tree = ok("pool", "tree")
    assert "└─ vision" in tree and "├─ default" in tree
    # /research/vision reserves 4 GPUs it does not use, but this daemon has no cluster: what a
    # reservation guarantees (and so lends) is capped by what exists.
    assert "lends" not in tree
    listed = yaml.safe_load(ok("pool", "tree", "-o", "yaml"))
    assert [p["spec"]["path"] for p in listed] == ["/", "/default", "/research", "/research/vision"]

    (tmp_path / "vision.yaml").write_text(VISION.replace("reservation: 4,", "reservation: 2,"))
    assert ok("pool", "update", "vision.yaml") == "pool /research/vision updated\n"
    assert ok("pool", "delete", "/research/vision") == "pool /research/vision deleted\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("path: /a\nresources: {gpu: {reservation: 4, limit: 2}}",
         "error: invalid: resources.gpu.reservation: 4 is more than the limit 2"),
        ("path: /a\nowners: x", "error: invalid: owners: unknown key (did you mean owner?)"),
        ("path: /a\nresources: {gpu: {policy: sometimes}}", "error: invalid: resources"),
        ("path: [", "error: invalid: spec: not valid YAML"),
        ("path: /nope/a", "error: not found: parent pool /nope of /nope/a does not exist"),
    ],
)  # fmt: skip
def test_cli_bad_pool_files_are_one_line_errors(
    server: Server, tmp_path: Path, content: str, expected: str
) -> None:
    (tmp_path / "bad.yaml").write_text(content)
    result = run_peloton("pool", "create", "bad.yaml", server=address(server.grpc_port),
                         cwd=tmp_path)  # fmt: skip
    assert result.returncode in (1, 2)
    assert error_line(result).startswith(expected)


def test_cli_pending_reason_in_job_get(server: Server, tmp_path: Path) -> None:
    assert server.resmgr is not None
    server.resmgr.set_capacity(Resources(cpu=16, mem_mb=8192, disk_mb=1e6, gpu=8))
    with PelotonClient(address(server.grpc_port)) as c:
        c.create_job(make_spec(6, gpu=1))
        job = c.create_job(make_spec(4, gpu=1))
    server.resmgr.run_cycle()
    result = run_peloton("job", "get", job.job_id, server=address(server.grpc_port))
    assert result.returncode == 0, result.stderr
    assert "pool_entitlement - pool /default: gpu entitlement 8, allocated 6, gang needs 4" in (
        result.stdout
    )


@pytest.mark.parametrize("policy", [pool_pb2.QUEUE_POLICY_BACKFILL, pool_pb2.QUEUE_POLICY_LAS])
def test_the_placement_aware_queue_policies_are_kept(client: PelotonClient, policy: int) -> None:
    s = spec("/planned", reservation=4)
    s.queue_policy = policy  # type: ignore[assignment]
    client.create_pool(s)
    assert client.get_pool("/planned").spec.queue_policy == policy
