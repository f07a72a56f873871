"""Hostile requests against a real server on loopback, on SQLite and on PostgreSQL: strings with
NUL or invalid UTF-8, fields over their limits and bytes that are no protobuf are refused with
INVALID_ARGUMENT naming the field, never INTERNAL, and log no traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from daemon import address, in_process_server
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import make_spec

from peloton.api import limits
from peloton.client import ClientError, PelotonClient
from peloton.errors import InvalidArgument
from peloton.server import Server
from peloton.v1 import audit_pb2, host_pb2, job_pb2, job_pb2_grpc, pool_pb2, sweep_pb2

# Every unary and server-streaming RPC of the public API: (path, request class, streaming).
RPCS = [
    (f"/{service.full_name}/{method.name}", method.input_type, method.server_streaming)
    for module in (job_pb2, pool_pb2, host_pb2, audit_pb2, sweep_pb2)
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    with in_process_server(db_url, tmp_path / "data") as s:
        yield s


@pytest.fixture
def channel(server: Server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(address(server.grpc_port)) as c:
        yield c


@pytest.fixture
def job_id(client: PelotonClient) -> str:
    """A pending job of two tasks."""
    return client.create_job(make_spec(2)).job_id


@pytest.fixture
def client(server: Server) -> Iterator[PelotonClient]:
    with PelotonClient(address(server.grpc_port), timeout=60) as c:
        yield c


def call_raw(
    channel: grpc.Channel, path: str, data: bytes, streaming: bool = False
) -> grpc.StatusCode:
    """Send ``data`` as the request of ``path``; the status the server answers."""
    try:
        if streaming:
            for _ in channel.unary_stream(path)(data, timeout=10):
                pass
        else:
            channel.unary_unary(path)(data, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def refused(channel: grpc.Channel, path: str, data: bytes, streaming: bool = False) -> str:
    """The details of the INVALID_ARGUMENT the server answers ``data`` with."""
    with pytest.raises(grpc.RpcError) as info:
        if streaming:
            list(channel.unary_stream(path)(data, timeout=10))
        else:
            channel.unary_unary(path)(data, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    details: str = info.value.details()
    return details


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [r.getMessage() for r in errors]


# ---------------------------------------------------------------------------- limits


def test_a_kill_message_over_the_limit_is_refused(client: PelotonClient) -> None:
    job = client.create_job(make_spec(2))
    for message in ("x" * (1024 * 1024), "é" * 513):
        with pytest.raises(ClientError) as info:
            client.kill_job(job.job_id, message)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details.startswith("message: is longer than 1024 bytes"), info.value
    assert client.get_job(job.job_id).state == job_pb2.JOB_STATE_PENDING
    killed = client.kill_job(job.job_id, "é" * 512)
    assert killed.message == "é" * 512


def test_a_job_of_10000_tasks_killed_with_the_longest_message_stays_readable(
    client: PelotonClient, channel: grpc.Channel
) -> None:
    job = client.create_job(make_spec(10_000, gpu=0))
    longest = "é" * (limits.MAX_MESSAGE // 2)
    client.kill_job(job.job_id, longest)
    # A default client (PelotonClient accepts more): at most 4 MiB per response.
    stub = job_pb2_grpc.JobServiceStub(channel)
    assert stub.GetJob(job_pb2.GetJobRequest(job_id=job.job_id)).job.message == longest
    for page_size in (0, 10_000):
        seen, token = [], ""
        while True:
            page = stub.ListTasks(
                job_pb2.ListTasksRequest(job_id=job.job_id, page_size=page_size, page_token=token)
            )
            seen += [t.instance_id for t in page.tasks]
            assert all(t.current.message == longest for t in page.tasks)
            token = page.next_page_token
            if not token:
                break
        assert seen == list(range(10_000))


def test_more_label_filters_than_the_limit_are_refused(client: PelotonClient) -> None:
    labels = {f"k{i}": "v" for i in range(limits.MAX_LABEL_FILTERS + 1)}
    with pytest.raises(ClientError) as info:
        client.list_jobs(labels=labels)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details == "labels: has more than 16 items (got 17)"


# ---------------------------------------------------------------------------- NUL, UTF-8

JOB = "/peloton.v1.JobService/"
POOL = "/peloton.v1.PoolService/"
HOST = "/peloton.v1.HostService/"
# One request of each kind of string: (RPC, request with a NUL, the field the error names).
NUL_CASES = [
    (JOB + "GetJob", job_pb2.GetJobRequest(job_id="a\x00b"), "job_id"),
    (
        JOB + "CreateJob",
        job_pb2.CreateJobRequest(spec=make_spec(1), request_id="r\x00"),
        "request_id",
    ),
    (JOB + "CreateJob", job_pb2.CreateJobRequest(spec=make_spec(1, pool="/a\x00")), "spec.pool"),
    (
        JOB + "CreateJob",
        job_pb2.CreateJobRequest(spec=make_spec(1, labels={"team": "v\x00"})),
        "spec.labels['team']",
    ),
    (JOB + "ListJobs", job_pb2.ListJobsRequest(labels={"t\x00": "v"}), "labels (a key)"),
    (JOB + "ListJobs", job_pb2.ListJobsRequest(pool="/\x00"), "pool"),
    (JOB + "ListJobs", job_pb2.ListJobsRequest(page_token="\x00"), "page_token"),
    (JOB + "KillJob", job_pb2.KillJobRequest(job_id="j", message="m\x00"), "message"),
    (POOL + "GetPool", pool_pb2.GetPoolRequest(path="/\x00"), "path"),
    (
        POOL + "CreatePool",
        pool_pb2.CreatePoolRequest(spec=pool_pb2.PoolSpec(path="/p", owner="o\x00")),
        "spec.owner",
    ),
    (HOST + "GetHost", host_pb2.GetHostRequest(hostname="h\x00"), "hostname"),
    (HOST + "ListHosts", host_pb2.ListHostsRequest(states=["UP\x00"]), "states[0]"),
]


def invalid_utf8(request: Any, marker: str) -> bytes:
    """``request``'s bytes with the string ``marker`` made invalid UTF-8."""
    data: bytes = request.SerializeToString()
    assert data.count(marker.encode()) == 1
    return data.replace(marker.encode(), b"\xff" * len(marker.encode()))


UTF8_CASES = [
    (JOB + "GetJob", job_pb2.GetJobRequest(job_id="MARK"), "job_id"),
    (
        JOB + "CreateJob",
        job_pb2.CreateJobRequest(spec=make_spec(1), request_id="MARK"),
        "request_id",
    ),
    (
        JOB + "CreateJob",
        job_pb2.CreateJobRequest(spec=make_spec(1, labels={"team": "MARK"})),
        "spec.labels[0].value",
    ),
    (JOB + "ListJobs", job_pb2.ListJobsRequest(labels={"MARK": "v"}), "labels[0].key"),
    (JOB + "KillJob", job_pb2.KillJobRequest(job_id="j", message="MARK"), "message"),
    (POOL + "DeletePool", pool_pb2.DeletePoolRequest(path="MARK"), "path"),
    (HOST + "DrainHost", host_pb2.DrainHostRequest(hostname="MARK"), "hostname"),
]


BAD_STRING_CASES = [
    *(
        pytest.param(path, r.SerializeToString(), f"{field}: contains a NUL character", id=field)
        for path, r, field in NUL_CASES
    ),
    *(
        pytest.param(path, invalid_utf8(r, "MARK"), f"{field}: is not valid UTF-8", id=field)
        for path, r, field in UTF8_CASES
    ),
]


@pytest.mark.parametrize(("path", "data", "expected"), BAD_STRING_CASES)
def test_a_nul_or_invalid_utf8_in_a_string_is_refused_naming_the_field(
    channel: grpc.Channel, caplog: pytest.LogCaptureFixture, path: str, data: bytes, expected: str
) -> None:
    assert refused(channel, path, data) == expected
    no_traceback(caplog)


def test_malformed_requests_are_logged_once_per_client_without_traceback(
    channel: grpc.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for _ in range(20):
        details = refused(channel, JOB + "GetJob", b"\xff\xff\xff")
        assert details == "request: is not a valid protobuf message for this method"
    refused(channel, JOB + "WatchJob", b"\x0a\x05ab", streaming=True)
    malformed = [r for r in caplog.records if r.getMessage() == "malformed request"]
    assert len(malformed) == 1
    assert not [r for r in caplog.records if "deserializ" in r.getMessage()]
    no_traceback(caplog)


# ---------------------------------------------------------------------------- fuzz


def string_paths(descriptor: Any, depth: int = 0) -> list[tuple[Any, ...]]:
    """Paths (field descriptors) from ``descriptor`` to each of its bytes fields, which are the
    strings of the request's twin (see peloton.api.limits), nesting at most 3 deep."""
    paths: list[tuple[Any, ...]] = []
    for field in descriptor.fields:
        if field.type == field.TYPE_BYTES:
            paths.append((field,))
        elif field.type == field.TYPE_MESSAGE and depth < 3:
            paths += [(field, *rest) for rest in string_paths(field.message_type, depth + 1)]
    return paths


def with_bytes(twin: Any, path: tuple[Any, ...], value: bytes) -> None:
    """Set the field at ``path`` of ``twin`` (adding repeated items on the way) to ``value``."""
    *parents, last = path
    for field in parents:
        twin = getattr(twin, field.name).add() if field.is_repeated else getattr(twin, field.name)
    if last.is_repeated:
        getattr(twin, last.name).append(value)
    else:
        setattr(twin, last.name, value)


HOSTILE = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=16).map(lambda s: (s + "\x00" + s).encode()),
    st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"a" * 70_000]),
    st.text(max_size=64).map(str.encode),
)


@st.composite
def hostile_requests(draw: st.DrawFn) -> tuple[str, bytes, bool]:
    with_strings = [r for r in RPCS if string_paths(limits._bytes_twin(r[1]).DESCRIPTOR)]
    path, descriptor, streaming = draw(st.sampled_from(with_strings))
    twin = limits._bytes_twin(descriptor)()
    for field_path in draw(st.lists(st.sampled_from(string_paths(twin.DESCRIPTOR)), max_size=3)):
        with_bytes(twin, field_path, draw(HOSTILE))
    return path, twin.SerializeToString(), streaming


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request=hostile_requests())
def test_fuzzed_strings_never_cause_an_internal_error(
    channel: grpc.Channel, request: tuple[str, bytes, bool]
) -> None:
    path, data, streaming = request
    code = call_raw(channel, path, data, streaming)
    assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), request


# Values a field may take: the edges of its type, not only the plausible ones.
INTS = {
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "uint32": st.integers(0, 2**32 - 1),
    "uint64": st.integers(0, 2**64 - 1),
}
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([0.0, -1.0, 1e300])
)
TEXT = st.one_of(st.text(max_size=12), st.text(max_size=4).map(lambda s: s + "\x00"))
# Names of objects that exist, so that fuzzed requests also reach existing jobs and pools, not
# only NOT_FOUND ("<job>" stands for the job the test creates).
KNOWN: dict[str, list[str]] = {
    "job_id": ["<job>"],
    "path": ["/", "/research"],
    "pool": ["/research"],
}


def field_values(field: Any, depth: int) -> st.SearchStrategy[Any] | None:
    """Values for one (non-repeated) field; None: leave it unset (a message too deep)."""
    t = field.type
    if t == field.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1) if depth < 3 else None
    if t == field.TYPE_STRING:
        known = KNOWN.get(field.name, [])
        return st.one_of(TEXT, st.sampled_from(known)) if known else TEXT
    if t == field.TYPE_BYTES:
        return st.binary(max_size=8)
    if t == field.TYPE_BOOL:
        return st.booleans()
    if t in (field.TYPE_FLOAT, field.TYPE_DOUBLE):
        return FLOATS
    if t == field.TYPE_ENUM:
        # Unknown numbers included: a newer client may send them.
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), INTS["int32"])
    kind = {
        field.TYPE_INT32: "int32",
        field.TYPE_SINT32: "int32",
        field.TYPE_SFIXED32: "int32",
        field.TYPE_INT64: "int64",
        field.TYPE_SINT64: "int64",
        field.TYPE_SFIXED64: "int64",
        field.TYPE_UINT32: "uint32",
        field.TYPE_FIXED32: "uint32",
    }.get(t, "uint64")
    return INTS[kind]


def messages(descriptor: Any, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Every field of ``descriptor`` set or not, to values of its whole range (as a dict that
    ``json_format.ParseDict``-like filling below turns into the message)."""
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            keys, values = field_values(key, depth), field_values(value, depth)
            if keys is not None and values is not None:
                parts[field.name] = st.dictionaries(keys, values, max_size=3)
            continue
        values = field_values(field, depth)
        if values is None:
            continue
        parts[field.name] = st.lists(values, max_size=3) if field.is_repeated else values
    return st.fixed_dictionaries({}, optional=parts)


def fill(message: Any, values: dict[str, Any], job_id: str) -> None:
    """Set ``values`` (from :func:`messages`) on ``message``, "<job>" made ``job_id``."""
    for name, value in values.items():
        field = message.DESCRIPTOR.fields_by_name[name]
        target = getattr(message, name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            for k, v in value.items():
                if field.message_type.fields_by_name["value"].message_type is not None:
                    fill(target[k], v, job_id)
                else:
                    target[k] = v
        elif field.is_repeated:
            for item in value:
                if field.message_type is not None:
                    fill(target.add(), item, job_id)
                else:
                    target.append(item)
        elif field.message_type is not None:
            target.SetInParent()
            fill(target, value, job_id)
        else:
            setattr(message, name, job_id if value == "<job>" else value)


@st.composite
def any_requests(draw: st.DrawFn) -> tuple[str, Any, dict[str, Any], bool]:
    path, descriptor, streaming = draw(st.sampled_from(RPCS))
    return path, descriptor, draw(messages(descriptor)), streaming


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request=any_requests())
def test_fuzzed_requests_of_every_rpc_and_field_never_cause_an_internal_error(
    job_id: str, channel: grpc.Channel, request: tuple[str, Any, dict[str, Any], bool]
) -> None:
    path, descriptor, values, streaming = request
    message = message_factory.GetMessageClass(descriptor)()
    fill(message, values, job_id)
    data = message.SerializeToString()
    try:
        if streaming:
            # A watch of a live job runs until the job ends: its first answers are enough.
            for _ in channel.unary_stream(path)(data, timeout=0.5):
                pass
        else:
            channel.unary_unary(path)(data, timeout=10)
    except grpc.RpcError as exc:
        code = exc.code()
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (request, exc)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            assert streaming, (request, exc)


def test_an_unsigned_number_past_what_the_database_stores_is_refused_naming_the_field() -> None:
    """A WatchJob after 2^63 failed INTERNAL (the database's integers are signed 64-bit); the
    largest that fits is taken."""
    with pytest.raises(InvalidArgument) as err:
        limits.check_request(job_pb2.WatchJobRequest(job_id="j", after_sequence=2**63))
    assert (err.value.field, err.value.reason) == (
        "after_sequence",
        f"is more than {2**63 - 1}",
    )
    limits.check_request(job_pb2.WatchJobRequest(job_id="j", after_sequence=2**63 - 1))


def test_a_time_that_is_no_time_is_refused_naming_the_field(channel: grpc.Channel) -> None:
    # Found by the fuzz test above: a Timestamp's nanos out of range failed INTERNAL.
    request = audit_pb2.ListAuditRecordsRequest()
    request.until.nanos = -1
    path = "/peloton.v1.AuditService/ListAuditRecords"
    with pytest.raises(grpc.RpcError) as refused:
        channel.unary_unary(path)(request.SerializeToString(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("until: is not a valid time"), refused.value.details()
