"""The audit trail, on SQLite and PostgreSQL: every mutating RPC a real daemon serves is a record
(refused and failed ones too, never a read, never a request body), the trail is append-only in
the database itself, AuditService filters and pages it, and ``peloton audit`` (a subprocess)
shows it as a table or JSON.

The daemon is the real one on loopback; to have callers with names, its gRPC server gets a
test ``authenticate`` hook: metadata ``x-user`` (and ``x-groups``) name the caller, no metadata
is the anonymous caller, and the user ``intruder`` is refused UNAUTHENTICATED.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from alembic import command
from alembic.script import ScriptDirectory
from daemon import (
    address,
    error_line,
    in_process_server,
    run_peloton,
    scrape_metrics,
    wait_for,
)
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine, event, inspect, text
from sqlalchemy.exc import DBAPIError
from support import make_spec

import peloton.v1
from peloton import server as server_module
from peloton.api.audit import (
    MAX_MESSAGE,
    MUTATING,
    READS,
    AuditMetrics,
    AuditTrail,
    is_mutating,
    record_of,
)
from peloton.api.grpc_server import GrpcServer
from peloton.api.interceptor import Context, Malformed, Outcome
from peloton.api.watches import WatchQuotas
from peloton.client import ClientError, PelotonClient
from peloton.core.access import ANONYMOUS, Caller
from peloton.errors import InvalidArgument, Unauthenticated, Unavailable
from peloton.metrics import Metrics
from peloton.server import Server
from peloton.storage import audit as repo
from peloton.storage import migrate
from peloton.storage.db import Database, make_engine
from peloton.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    host_pb2,
    host_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    pool_pb2,
    pool_pb2_grpc,
)

SECRET = "hunter2-do-not-log"
V1 = "/peloton.v1."


# ---------------------------------------------------------------------------- classification


def served_rpcs() -> set[str]:
    """Every RPC of every service in peloton.v1 (each generated module, so a new proto file is
    included), and the health and reflection services the daemon also serves."""
    folder = Path(peloton.v1.__file__).parent
    modules = [importlib.import_module(f"peloton.v1.{p.stem}") for p in folder.glob("*_pb2.py")]
    modules += [health_pb2, reflection_pb2]
    return {
        f"/{service.full_name}/{method.name}"
        for module in modules
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_every_rpc_is_classified_as_a_read_or_a_mutation_exactly_once() -> None:
    rpcs = served_rpcs()
    assert not set(MUTATING) & READS
    unclassified = rpcs - set(MUTATING) - READS
    assert not unclassified, f"classify in peloton/api/audit.py (MUTATING or READS): {unclassified}"
    assert not (set(MUTATING) | READS) - rpcs, "names of RPCs that no longer exist"


def test_the_mutating_rpcs_are_those_that_change_something() -> None:
    assert {m.rsplit("/", 1)[-1] for m in MUTATING} >= {
        "CreateJob",
        "KillJob",
        "RestartJob",
        "DeleteJob",
        "CreatePool",
        "UpdatePool",
        "DeletePool",
        "DrainHost",
        "UndrainHost",
    }
    assert all(is_mutating(m) for m in MUTATING)
    assert not any(is_mutating(m) for m in READS)
    # An RPC nobody classified is recorded rather than missed.
    assert is_mutating("/peloton.v1.JobService/SomethingNew")


def test_every_mutating_rpc_names_its_target_from_an_empty_request() -> None:
    pool = descriptor_pool.Default()
    for method in MUTATING:
        service, name = method.strip("/").split("/")
        descriptor = pool.FindServiceByName(service).FindMethodByName(name)
        request = message_factory.GetMessageClass(descriptor.input_type)()
        outcome = Outcome(method, ANONYMOUS, "ipv4:1.2.3.4:5", request, grpc.StatusCode.OK, "", 0)
        expected = "/default" if name == "CreateJob" else ""
        assert record_of(outcome).target == expected, method


# ---------------------------------------------------------------------------- records


def outcome(method: str, request: Any, **kw: Any) -> Outcome:
    values: dict[str, Any] = {
        "caller": Caller("alice", frozenset({"ml", "ops"}), "token"),
        "peer": "ipv4:10.0.0.5:51234",
        "code": grpc.StatusCode.OK,
        "message": "",
        "at": 1_790_000_000.25,
    }
    values.update(kw)
    return Outcome(method, request=request, **values)


def test_a_record_keeps_the_target_and_never_the_request() -> None:
    spec = make_spec(2, pool="/research/vision")
    spec.task.env["API_TOKEN"] = SECRET
    request = job_pb2.CreateJobRequest(spec=spec, request_id="r-1")
    record = record_of(outcome(f"{V1}JobService/CreateJob", request), daemon="d1")
    assert record == repo.AuditRecord(
        at=datetime(2026, 9, 21, 14, 13, 20, 250000, tzinfo=UTC),
        user="alice",
        groups=("ml", "ops"),
        via="token",
        method=f"{V1}JobService/CreateJob",
        target="/research/vision",
        peer="ipv4:10.0.0.5:51234",
        code="OK",
        message="",
        daemon="d1",
    )
    kill = job_pb2.KillJobRequest(job_id="j-1", message="because " + SECRET)
    assert record_of(outcome(f"{V1}JobService/KillJob", kill)).target == "j-1"
    drain = host_pb2.DrainHostRequest(hostname="gpu-7")
    assert record_of(outcome(f"{V1}HostService/DrainHost", drain)).target == "gpu-7"
    delete = pool_pb2.DeletePoolRequest(path="/a/b")
    assert record_of(outcome(f"{V1}PoolService/DeletePool", delete)).target == "/a/b"


def test_a_request_that_did_not_parse_has_no_target() -> None:
    malformed = Malformed(job_pb2.KillJobRequest, b"\xff\xff")
    record = record_of(
        outcome(
            f"{V1}JobService/KillJob",
            malformed,
            code=grpc.StatusCode.INVALID_ARGUMENT,
            message="request: is not a valid protobuf message for this method",
        )
    )
    assert record.target == ""
    assert record.code == "INVALID_ARGUMENT"


@given(st.text(), st.text(), st.text(), st.text())
def test_every_text_fits_its_column_and_holds_no_nul(
    target: str, user: str, peer: str, message: str
) -> None:
    record = record_of(
        outcome(
            f"{V1}JobService/DeleteJob",
            job_pb2.DeleteJobRequest(job_id=target.replace("\x00", "")),
            caller=Caller(user, frozenset({user}), "jwt"),
            peer=peer,
            message=message,
        )
    )
    for value, size in (
        (record.target, 512),
        (record.user, 255),
        (record.peer, 255),
        (record.message, MAX_MESSAGE),
        *((g, 255) for g in record.groups),
    ):
        assert len(value) <= size
        assert "\x00" not in value
    if len(message) <= MAX_MESSAGE and "\x00" not in message:
        assert record.message == message


# ---------------------------------------------------------------------------- the repository


def some_record(at: datetime, **kw: Any) -> repo.AuditRecord:
    values: dict[str, Any] = {
        "user": "alice",
        "groups": ("ml",),
        "via": "token",
        "method": f"{V1}JobService/KillJob",
        "target": "j-1",
        "peer": "ipv4:127.0.0.1:1",
        "code": "OK",
        "message": "",
    }
    values.update(kw)
    return repo.AuditRecord(at=at, **values)


T0 = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


def test_pages_are_newest_first_whole_and_without_repeats(db: Database) -> None:
    # 25 records over 10 instants: ties on the time are ordered (and paged) by id.
    with db.writing() as session:
        for i in range(25):
            user = "alice" if i % 2 else "bob"
            repo.append(
                session, some_record(T0 + timedelta(seconds=i % 10), user=user, target=str(i))
            )
    everything, token = page_of(db, repo.AuditFilter(), 100)
    assert token == ""
    assert len(everything) == 25
    keys = [(r.at, r.id) for r in everything]
    assert keys == sorted(keys, reverse=True)

    for flt in (repo.AuditFilter(), repo.AuditFilter(user="alice")):
        whole, _ = page_of(db, flt, 100)
        paged: list[repo.AuditRecord] = []
        token = ""
        while True:
            page, token = page_of(db, flt, 7, token)
            assert len(page) <= 7
            paged.extend(page)
            if not token:
                break
        assert paged == whole
    alice, _ = page_of(db, repo.AuditFilter(user="alice"), 100)
    assert len(alice) == 12 and {r.user for r in alice} == {"alice"}
    window = repo.AuditFilter(since=T0 + timedelta(seconds=3), until=T0 + timedelta(seconds=5))
    within, _ = page_of(db, window, 100)
    assert {r.at for r in within} == {T0 + timedelta(seconds=3), T0 + timedelta(seconds=4)}
    assert len(within) == 6


def page_of(
    db: Database, flt: repo.AuditFilter, size: int, token: str = ""
) -> tuple[list[repo.AuditRecord], str]:
    with db.reading() as session:
        return repo.list_records(session, flt, size, token)


@pytest.mark.parametrize(
    "token", ["nope", "WyJ4Il0=", "WyIyMDI2LTAxLTAxVDAwOjAwOjAwIiwgMV0="]
)  # not base64 JSON; one value; a naive time
def test_a_token_not_made_here_is_refused_naming_the_field(db: Database, token: str) -> None:
    with pytest.raises(InvalidArgument) as info, db.reading() as session:
        repo.list_records(session, repo.AuditFilter(), 10, token)
    assert str(info.value).startswith("page_token: ")


def test_the_database_refuses_to_change_or_remove_a_record(db: Database) -> None:
    with db.writing() as session:
        repo.append(session, some_record(T0))
    statements = [
        "UPDATE audit_records SET code = 'OK', user_name = 'x'",
        "DELETE FROM audit_records",
    ]
    if db.dialect == "postgresql":
        statements.append("TRUNCATE audit_records")
    for statement in statements:
        with pytest.raises(DBAPIError) as info, db.engine.begin() as conn:
            conn.execute(text(statement))
        assert "audit_records is append-only" in str(info.value), statement
    with db.reading() as session:
        records, _ = repo.list_records(session, repo.AuditFilter(), 10, "")
    assert [(r.user, r.code) for r in records] == [("alice", "OK")]


def test_the_migration_goes_down_and_up_again(empty_url: str) -> None:
    engine = make_engine(empty_url)
    try:
        migrate.upgrade(engine)
        cfg = migrate.alembic_config()
        below = ScriptDirectory.from_config(cfg).get_revision("0012").down_revision
        assert isinstance(below, str)
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, below)
        assert "audit_records" not in inspect(engine).get_table_names()
        if engine.dialect.name == "postgresql":
            with engine.connect() as conn:
                left = conn.execute(
                    text("SELECT count(*) FROM pg_proc WHERE proname = 'peloton_audit_append_only'")
                )
                assert left.scalar() == 0
        migrate.upgrade(engine)
        db = Database(engine)
        with db.writing() as session:
            repo.append(session, some_record(T0))
        with pytest.raises(DBAPIError), engine.begin() as conn:
            conn.execute(text("DELETE FROM audit_records"))
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    return str(request.getfixturevalue("pg_empty_url"))


def test_a_write_that_fails_is_counted_and_raised_for_the_interceptor_to_log(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine, "0011")  # no audit_records table
    metrics = Metrics()
    trail = AuditTrail(Database(engine), AuditMetrics(metrics.registry))
    try:
        with pytest.raises(Exception, match="audit_records"):
            trail(outcome(f"{V1}JobService/DeleteJob", job_pb2.DeleteJobRequest(job_id="j")))
        # A read is not written at all, so it cannot fail.
        trail(outcome(f"{V1}JobService/GetJob", job_pb2.GetJobRequest(job_id="j")))
    finally:
        engine.dispose()
    assert metrics.registry.get_sample_value("peloton_audit_write_failures_total") == 1
    assert (
        metrics.registry.get_sample_value("peloton_audit_records_total", {"result": "OK"}) is None
    )


def test_a_write_fails_at_once_while_the_database_is_unreachable(db: Database) -> None:
    # As an RPC's own database work does: the client's answer is not held up meanwhile.
    metrics = Metrics()
    trail = AuditTrail(db, AuditMetrics(metrics.registry))
    kill = outcome(f"{V1}JobService/KillJob", job_pb2.KillJobRequest(job_id="j"))
    db.set_unreachable("no answer to SELECT 1")
    with pytest.raises(Unavailable, match="database unreachable"):
        trail(kill)
    db.set_unreachable("")
    trail(kill)
    assert metrics.registry.get_sample_value("peloton_audit_write_failures_total") == 1
    assert metrics.registry.get_sample_value("peloton_audit_records_total", {"result": "OK"}) == 1
    records, _ = page_of(db, repo.AuditFilter(), 10)
    assert [r.target for r in records] == ["j"]


def test_a_record_is_one_statement_that_commits_itself_on_postgresql(db: Database) -> None:
    """Appended in autocommit on PostgreSQL, on connections that stay in it: the INSERT alone,
    no BEGIN, no SET LOCAL of the write's deadline, no COMMIT, no isolation level switched
    (a transaction's round trips were most of what the trail cost a call); on SQLite in a
    write transaction, as every write there."""
    statements: list[str] = []
    commits: list[object] = []

    def executed(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement.split()[0].upper())

    def committed(conn: Any) -> None:
        commits.append(conn)

    trail = AuditTrail(db, AuditMetrics(Metrics().registry))
    kill = outcome(f"{V1}JobService/KillJob", job_pb2.KillJobRequest(job_id="j"))
    trail(kill)  # the appending engine's first connection is made
    # Every engine's: the records go to one of their own.
    event.listen(Engine, "before_cursor_execute", executed)
    event.listen(Engine, "commit", committed)
    try:
        trail(kill)
    finally:
        event.remove(Engine, "before_cursor_execute", executed)
        event.remove(Engine, "commit", committed)
    if db.dialect == "postgresql":
        assert (statements, commits) == (["INSERT"], [])
    else:
        assert "INSERT" in statements and len(commits) == 1
    records, _ = page_of(db, repo.AuditFilter(), 10)
    assert [r.target for r in records] == ["j", "j"]


class _HeldWrites:
    """``db.appending`` that counts its writes and holds the first, begun, until
    ``release``."""

    def __init__(self, db: Database) -> None:
        self.transactions = 0
        self.first_began = threading.Event()
        self.release = threading.Event()
        self._appending = db.appending

    @contextlib.contextmanager
    def __call__(self) -> Iterator[Any]:
        self.transactions += 1
        with self._appending() as conn:
            if self.transactions == 1:
                self.first_began.set()
                assert self.release.wait(30), "the first write was never released"
            yield conn


def test_concurrent_records_share_transactions_and_each_waits_for_its_own(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = Metrics()
    trail = AuditTrail(db, AuditMetrics(metrics.registry))
    held = _HeldWrites(db)
    monkeypatch.setattr(db, "appending", held)
    done: list[str] = []

    def kill(job: str) -> None:
        trail(outcome(f"{V1}JobService/KillJob", job_pb2.KillJobRequest(job_id=job)))
        done.append(job)

    first = threading.Thread(target=kill, args=("j0",))
    first.start()
    assert held.first_began.wait(10), "the first record's write did not begin"
    # Ten more calls while the first write is held: they queue, and none returns meanwhile.
    rest = [threading.Thread(target=kill, args=(f"j{i}",)) for i in range(1, 11)]
    for thread in rest:
        thread.start()
    wait_for(lambda: len(trail._queue) == 10, 10, "ten records queued", state=lambda: trail._queue)
    assert done == []
    held.release.set()
    for thread in (first, *rest):
        thread.join(30)
    assert sorted(done) == sorted(f"j{i}" for i in range(11))
    # The first write, then one for the ten that came while it ran.
    assert held.transactions == 2
    records, _ = page_of(db, repo.AuditFilter(), 20)
    assert sorted(r.target for r in records) == sorted(done)
    assert metrics.registry.get_sample_value("peloton_audit_records_total", {"result": "OK"}) == 11


def test_a_shared_write_that_fails_fails_every_call_in_it(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = Metrics()
    trail = AuditTrail(db, AuditMetrics(metrics.registry))
    held = _HeldWrites(db)
    monkeypatch.setattr(db, "appending", held)
    errors: list[BaseException] = []

    def kill(job: str) -> None:
        try:
            trail(outcome(f"{V1}JobService/KillJob", job_pb2.KillJobRequest(job_id=job)))
        except Exception as exc:
            errors.append(exc)

    first = threading.Thread(target=kill, args=("ok",))
    first.start()
    assert held.first_began.wait(10), "the first record's write did not begin"
    rest = [threading.Thread(target=kill, args=(f"lost{i}",)) for i in range(3)]
    for thread in rest:
        thread.start()
    wait_for(lambda: len(trail._queue) == 3, 10, "three records queued", state=lambda: trail._queue)
    db.set_unreachable("no answer to SELECT 1")  # the second write fails at once
    held.release.set()
    first.join(30)
    for thread in rest:
        thread.join(30)
    assert len(errors) == 3 and all(isinstance(e, Unavailable) for e in errors), errors
    assert metrics.registry.get_sample_value("peloton_audit_write_failures_total") == 3
    db.set_unreachable("")
    records, _ = page_of(db, repo.AuditFilter(), 20)
    assert [r.target for r in records] == ["ok"]


# ---------------------------------------------------------------------------- the hook


@pytest.mark.parametrize(
    ("user", "service", "code"),
    [
        ("intruder", "", "UNAUTHENTICATED"),  # the interceptor's own refusal
        ("alice", "no.such.Service", "NOT_FOUND"),  # the handler's abort (health)
        ("alice", "", "OK"),
        ("bug", "", "UNKNOWN"),  # an exception that escaped the interceptor
    ],
)
def test_a_call_is_answered_only_once_its_outcome_is_recorded(
    user: str, service: str, code: str
) -> None:
    # grpc sends an abort's status at once; the interceptor records the outcome before it.
    seen: list[Outcome] = []
    release = threading.Event()

    def audit(o: Outcome) -> None:
        seen.append(o)
        assert release.wait(30), "the test never released the audit hook"

    grpc_server = GrpcServer(
        Metrics(), 4, WatchQuotas(10, 10), lambda _after: {}, lambda: 0, authenticate, audit
    )
    port = grpc_server.bind("127.0.0.1:0", ())
    grpc_server.start()
    try:
        with (
            grpc.insecure_channel(address(port)) as channel,
            ThreadPoolExecutor(1) as pool,
        ):
            check = health_pb2_grpc.HealthStub(channel).Check
            request = health_pb2.HealthCheckRequest(service=service)
            answer = pool.submit(Calls.code, check, request, user)
            with pytest.raises(FutureTimeout):
                answer.result(timeout=0.5)  # held while the hook is
            assert [(o.method, o.code.name) for o in seen] == [
                ("/grpc.health.v1.Health/Check", code)
            ]
            release.set()
            assert answer.result(timeout=30) == code
    finally:
        release.set()
        grpc_server.stop(1.0)
    [o] = seen
    assert o.caller == (
        Caller("alice", frozenset({"ml", "ops"}), "token") if user == "alice" else ANONYMOUS
    )
    messages = {
        "UNAUTHENTICATED": "unknown credentials",
        "UNKNOWN": "unexpected error; see the server log",
    }
    assert o.message == messages.get(code, "")


# ---------------------------------------------------------------------------- a real daemon


def authenticate(full_method: str, context: Context) -> Caller:
    metadata = dict(context.invocation_metadata() or ())
    user = metadata.get("x-user")
    if user is None:
        return ANONYMOUS
    if user == "intruder":
        raise Unauthenticated("unknown credentials")
    if user == "bug":
        raise RuntimeError("a bug in authentication")
    groups = frozenset(str(metadata.get("x-groups", "")).split(",")) - {""}
    return Caller(str(user), groups, "token")


@contextmanager
def audited_server(db_url: str, data_dir: Path, **options: Any) -> Iterator[Server]:
    """A real daemon whose gRPC server authenticates with :func:`authenticate`; alice is its
    cluster admin (allowed everything), bob has no grant (refused all but reads)."""

    def grpc_server(*args: Any, **kwargs: Any) -> GrpcServer:
        kwargs["authenticate"] = authenticate
        return GrpcServer(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(server_module, "GrpcServer", grpc_server)
        with in_process_server(db_url, data_dir, admins="user:alice", **options) as server:
            yield server


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    with audited_server(db_url, tmp_path / "data") as s:
        yield s


class Calls:
    """Raw stubs that call as a named user (or anonymously)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.jobs = job_pb2_grpc.JobServiceStub(channel)
        self.pools = pool_pb2_grpc.PoolServiceStub(channel)
        self.hosts = host_pb2_grpc.HostServiceStub(channel)

    @staticmethod
    def code(call: Callable[..., Any], request: Any, user: str | None = "alice") -> str:
        """The status code's name the call ended with."""
        metadata = [] if user is None else [("x-user", user), ("x-groups", "ml,ops")]
        try:
            call(request, metadata=metadata, timeout=30)
        except grpc.RpcError as exc:
            return str(exc.code().name)
        return "OK"


def expected_and_made(server: Server) -> list[tuple[str, str, str, str]]:
    """Make mutating calls (accepted, refused, failed) and reads; the (method, target, code,
    user) of each mutating call in order."""
    made: list[tuple[str, str, str, str]] = []
    with grpc.insecure_channel(address(server.grpc_port)) as channel:
        c = Calls(channel)
        spec = make_spec(2, pool="/research/vision")
        spec.task.env["API_TOKEN"] = SECRET

        def mutate(
            method: str, call: Callable[..., Any], request: Any, target: str, **kw: Any
        ) -> None:
            user = kw.get("user", "alice")
            code = c.code(call, request, **kw)
            made.append((method, target, code, user or ""))

        mutate(
            "JobService/CreateJob",
            c.jobs.CreateJob,
            job_pb2.CreateJobRequest(spec=spec),
            "/research/vision",
        )
        listed = c.jobs.ListJobs(job_pb2.ListJobsRequest(), metadata=(("x-user", "alice"),))
        job_id = listed.jobs[0].job_id
        bad = make_spec(2, pool="/research/vision")
        bad.instances = 0
        mutate(
            "JobService/CreateJob",
            c.jobs.CreateJob,
            job_pb2.CreateJobRequest(spec=bad),
            "/research/vision",
        )
        mutate(
            "JobService/KillJob",
            c.jobs.KillJob,
            job_pb2.KillJobRequest(job_id="no-such-job"),
            "no-such-job",
        )
        mutate(
            "JobService/DeleteJob",
            c.jobs.DeleteJob,
            job_pb2.DeleteJobRequest(job_id=job_id),
            job_id,
            user=None,
        )
        mutate(
            "JobService/KillJob",
            c.jobs.KillJob,
            job_pb2.KillJobRequest(job_id=job_id, message=SECRET),
            job_id,
            user="bob",
        )
        mutate(
            "JobService/KillJob",
            c.jobs.KillJob,
            job_pb2.KillJobRequest(job_id=job_id, message=SECRET),
            job_id,
        )
        mutate(
            "JobService/RestartJob",
            c.jobs.RestartJob,
            job_pb2.RestartJobRequest(job_id=job_id),
            job_id,
        )
        mutate(
            "PoolService/CreatePool",
            c.pools.CreatePool,
            pool_pb2.CreatePoolRequest(spec=pool_pb2.PoolSpec(path="/audit")),
            "/audit",
        )
        mutate(
            "PoolService/UpdatePool",
            c.pools.UpdatePool,
            pool_pb2.UpdatePoolRequest(spec=pool_pb2.PoolSpec(path="/audit", owner="ops")),
            "/audit",
        )
        mutate(
            "PoolService/DeletePool",
            c.pools.DeletePool,
            pool_pb2.DeletePoolRequest(path="/audit"),
            "/audit",
        )
        mutate(
            "HostService/DrainHost",
            c.hosts.DrainHost,
            host_pb2.DrainHostRequest(hostname="gpu-9"),
            "gpu-9",
        )
        mutate(
            "HostService/UndrainHost",
            c.hosts.UndrainHost,
            host_pb2.UndrainHostRequest(hostname="gpu-9"),
            "gpu-9",
            user="intruder",
        )
        # Reads, which are not recorded.
        for call, request in (
            (c.jobs.GetJob, job_pb2.GetJobRequest(job_id=job_id)),
            (c.jobs.GetJob, job_pb2.GetJobRequest(job_id="no-such-job")),
            (c.jobs.ListTasks, job_pb2.ListTasksRequest(job_id=job_id)),
            (c.pools.ListPools, pool_pb2.ListPoolsRequest()),
            (c.hosts.ListHosts, host_pb2.ListHostsRequest()),
        ):
            c.code(call, request)
    # The intruder was refused before anyone knew who called.
    return [(V1 + m, t, code, "" if u == "intruder" else u) for m, t, code, u in made]


def test_every_mutating_call_is_recorded_with_its_caller_and_result_and_no_read_is(
    server: Server,
) -> None:
    made = expected_and_made(server)
    codes = [code for _, _, code, _ in made]
    assert codes == [
        "OK",  # CreateJob
        "INVALID_ARGUMENT",  # CreateJob of a bad spec
        "NOT_FOUND",  # KillJob of no job
        "FAILED_PRECONDITION",  # DeleteJob of a job that has not ended
        "PERMISSION_DENIED",  # KillJob by bob
        "OK",  # KillJob by alice
        "OK",  # RestartJob of the killed job: its tasks start over
        "OK",  # CreatePool
        "OK",  # UpdatePool
        "OK",  # DeletePool
        "NOT_FOUND",  # DrainHost of no host
        "UNAUTHENTICATED",  # UndrainHost by whom nobody knows
    ]
    with PelotonClient(address(server.grpc_port), timeout=10) as client:
        page = client.list_audit_records(page_size=1000)
    assert page.next_page_token == ""
    records = list(reversed(page.records))
    assert [(r.method, r.target, r.code, r.user) for r in records] == made
    for r in records:
        assert r.peer.startswith(("ipv4:127.0.0.1:", "ipv6:")), r.peer
        assert r.daemon == ""
        assert SECRET not in str(r)
        if r.user:
            assert (list(r.groups), r.via) == (["ml", "ops"], "token")
        else:
            assert (list(r.groups), r.via) == ([], "none")
    assert "instances" in records[1].message  # the refusal's reason is kept
    assert records[2].message == "job no-such-job not found"
    # Records are in the table by the time each call was answered, and counted.
    samples = scrape_metrics(server.metrics_port)
    for code in set(codes):
        key = ("peloton_audit_records_total", (("result", code),))
        assert samples[key] == codes.count(code), code
    assert samples[("peloton_audit_write_failures_total", ())] == 0


def test_records_are_filtered_and_paged_by_the_service(server: Server) -> None:
    made = expected_and_made(server)
    with PelotonClient(address(server.grpc_port), timeout=10) as client:

        def targets(**filters: Any) -> list[str]:
            records: list[audit_pb2.AuditRecord] = []
            token = ""
            while True:
                page = client.list_audit_records(page_size=3, page_token=token, **filters)
                assert len(page.records) <= 3
                records.extend(page.records)
                token = page.next_page_token
                if not token:
                    return [f"{r.method.rsplit('/', 1)[-1]} {r.target} {r.code}" for r in records]

        everything = targets()
        assert everything == [f"{m.rsplit('/', 1)[-1]} {t} {c}" for m, t, c, _ in reversed(made)]
        [(_, job_id, _, _)] = [m for m in made if m[3] == "bob"]
        assert targets(user="bob") == [f"KillJob {job_id} PERMISSION_DENIED"]
        assert targets(method="killjob") == [e for e in everything if e.startswith("KillJob ")]
        assert targets(method=f"{V1}HostService/DrainHost") == ["DrainHost gpu-9 NOT_FOUND"]
        assert targets(target="/audit") == [e for e in everything if " /audit " in e]
        assert targets(code="not_found") == [e for e in everything if e.endswith(" NOT_FOUND")]
        assert targets(since=datetime.now(UTC) + timedelta(hours=1)) == []
        assert targets(until=datetime.now(UTC) - timedelta(hours=1)) == []
        assert targets(since=datetime.now(UTC) - timedelta(hours=1)) == everything

        for filters, field in (
            ({"method": "Frobnicate"}, "method"),
            ({"code": "NOPE"}, "code"),
            ({"since": T0, "until": T0}, "until"),
            ({"page_size": 1001}, "page_size"),
            ({"page_token": "nope"}, "page_token"),
        ):
            with pytest.raises(ClientError) as info:
                client.list_audit_records(**filters)
            assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details.startswith(f"{field}: "), info.value.details


def test_several_daemons_write_their_own_calls_to_one_trail(
    pg_empty_url: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_empty_url)
    migrate.upgrade(engine)
    engine.dispose()
    db_url = pg_empty_url
    with (
        audited_server(db_url, tmp_path / "a", daemon_id="a") as a,
        audited_server(db_url, tmp_path / "b", daemon_id="b", pools=()) as b,
    ):
        for daemon in (a, b):
            with grpc.insecure_channel(address(daemon.grpc_port)) as channel:
                code = Calls.code(
                    job_pb2_grpc.JobServiceStub(channel).KillJob,
                    job_pb2.KillJobRequest(job_id=f"gone-{daemon.config.daemon_id}"),
                )
                assert code == "NOT_FOUND"
        for daemon in (a, b):
            with PelotonClient(address(daemon.grpc_port), timeout=10) as client:
                records = client.list_audit_records(method="KillJob").records
            assert [(r.daemon, r.target) for r in records] == [("b", "gone-b"), ("a", "gone-a")]


# ---------------------------------------------------------------------------- peloton audit


def test_the_cli_lists_and_filters_the_trail(server: Server) -> None:
    made = expected_and_made(server)
    where = address(server.grpc_port)

    def ok(*args: str) -> str:
        result = run_peloton("audit", *args, server=where)
        assert result.returncode == 0, result.stderr
        return result.stdout

    table = ok().splitlines()
    assert table[0].split() == ["TIME", "USER", "METHOD", "TARGET", "RESULT", "FROM", "MESSAGE"]
    # TIME is two words (date, time of day); FROM one; MESSAGE the rest ("-" when none).
    rows = [line.split() for line in table[2:]]
    assert [r[2:6] for r in rows] == [
        [user or "anonymous", method.rsplit("/", 1)[-1], target, code]
        for method, target, code, user in reversed(made)
    ]
    assert all(r[6].startswith("ipv4:127.0.0.1:") for r in rows), rows
    assert rows[0][7:] == ["unknown", "credentials"]
    assert rows[1][7:] == ["host", "gpu-9", "not", "found"]
    assert rows[-1][7:] == ["-"]  # the first CreateJob, answered OK
    assert SECRET not in "\n".join(table)

    data = json.loads(ok("--user", "bob", "-o", "json"))
    assert data["next_page_token"] == ""
    [bob] = data["records"]
    assert set(bob) == {
        "id",
        "time",
        "user",
        "groups",
        "via",
        "method",
        "target",
        "peer",
        "code",
        "message",
        "daemon",
    }
    assert (bob["user"], bob["method"], bob["code"]) == (
        "bob",
        f"{V1}JobService/KillJob",
        "PERMISSION_DENIED",
    )
    assert bob["groups"] == ["ml", "ops"]

    found = json.loads(ok("--method", "KillJob", "--result", "not_found", "-o", "json"))
    assert [r["target"] for r in found["records"]] == ["no-such-job"]
    assert json.loads(ok("--target", "/audit", "--since", "1h", "-o", "json"))["records"]
    assert json.loads(ok("--until", "2000-01-01", "-o", "json"))["records"] == []

    limited = run_peloton("audit", "--limit", "2", server=where)
    assert limited.returncode == 0
    assert len(limited.stdout.splitlines()) == 4  # header, rule, two rows
    assert limited.stderr == "(more records: raise --limit, now 2)\n"


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (("--since", "yesterday-ish"), 2, "is not a time"),
        (("--result", "MAYBE"), 2, "is not one of"),
        (("--limit", "0"), 2, "--limit"),
        (("--method", "Frobnicate"), 2, "invalid: method: "),
    ],
)
def test_the_cli_refuses_bad_input_in_one_line(
    server: Server, args: tuple[str, ...], code: int, says: str
) -> None:
    result = run_peloton("audit", *args, server=address(server.grpc_port))
    assert result.returncode == code, result.stderr
    line = error_line(result)
    assert line.startswith("error: ") and says in line, line
    assert result.stdout == ""


def test_only_cluster_admins_read_the_trail_and_reading_is_not_recorded(
    server: Server,
) -> None:
    with grpc.insecure_channel(address(server.grpc_port)) as channel:
        read = audit_pb2_grpc.AuditServiceStub(channel).ListAuditRecords
        request = audit_pb2.ListAuditRecordsRequest()
        assert Calls.code(read, request, "bob") == "PERMISSION_DENIED"
        assert Calls.code(read, request, "alice") == "OK"
        # Without metadata the test hook serves the anonymous caller, who may do everything.
        assert Calls.code(read, request, None) == "OK"
        assert list(read(request, timeout=10).records) == []
