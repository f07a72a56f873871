"""The audit trail: which RPCs it records, the interceptor's hook that records them, and
AuditService, which reads them back (proto/peloton/v1/audit.proto).

Every RPC the daemon serves is classified here, once: a read (:data:`READS`) or a mutating call
(:data:`MUTATING`, with how to tell what it was about). A method in neither is recorded, so an
RPC added without classifying it is audited rather than missed (and a test fails until it is
classified). Refused and failed calls are recorded like the others: who tried what is the point.

A record keeps the request's target (a job id, pool path or hostname), never the request: a job
spec's environment may hold secrets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter

from peloton.api import convert
from peloton.api.authz import Authorizer, method_name
from peloton.api.interceptor import Malformed, Outcome
from peloton.core.spec import DEFAULT_POOL
from peloton.errors import InvalidArgument
from peloton.storage import audit as repo
from peloton.storage.db import Database
from peloton.storage.deadline import RpcScope, scoped
from peloton.v1 import audit_pb2, audit_pb2_grpc

# ListAuditRecords' page sizes.
MAX_PAGE_RECORDS = 1000
DEFAULT_PAGE_RECORDS = 100
# The most characters a record keeps of a status message (a refusal's details are short; an
# INTERNAL error's is fixed): a client's long input echoed back cannot bloat the trail.
MAX_MESSAGE = 1024
# The longest a record's write may take, the client's answer waiting meanwhile: as an RPC's
# database work, it fails at once while the health probe finds the database unreachable, and is
# cut after this long otherwise (a database that stalls costs records, not a frozen API).
WRITE_SECONDS = 5.0


def _job_id(request: Any) -> str:
    return str(request.job_id)


def _job_pool(request: Any) -> str:
    # The pool the job would run in: the spec's, or the one CreateJob defaults it to.
    return str(request.spec.pool) or DEFAULT_POOL


def _pool_path(request: Any) -> str:
    return str(request.spec.path)


def _path(request: Any) -> str:
    return str(request.path)


def _hostname(request: Any) -> str:
    return str(request.hostname)


# ---- sweeps (README "Sweeps")
def _sweep_pool(request: Any) -> str:
    # The pool the sweep's file names ("" for the default pool).
    return str(request.spec.trial.pool)


def _sweep_id(request: Any) -> str:
    return str(request.sweep_id)


# ---- end sweeps


# Every RPC that changes anything, and what its request is about (the record's target).
MUTATING: dict[str, Callable[[Any], str]] = {
    method_name("JobService", "CreateJob"): _job_pool,
    method_name("JobService", "KillJob"): _job_id,
    method_name("JobService", "RestartJob"): _job_id,
    method_name("JobService", "DeleteJob"): _job_id,
    method_name("PoolService", "CreatePool"): _pool_path,
    method_name("PoolService", "UpdatePool"): _pool_path,
    method_name("PoolService", "DeletePool"): _path,
    method_name("HostService", "DrainHost"): _hostname,
    method_name("HostService", "UndrainHost"): _hostname,
    method_name("SweepService", "SubmitSweep"): _sweep_pool,
    method_name("SweepService", "KillSweep"): _sweep_id,
}

# Every RPC that only reads: not recorded.
READS: frozenset[str] = frozenset(
    {
        *(
            method_name(service, method)
            for service, methods in (
                ("JobService", ("GetJob", "ListJobs", "GetTask", "ListTasks", "WatchJob")),
                ("PoolService", ("GetPool", "ListPools")),
                ("HostService", ("ListHosts", "GetHost", "GetTaskLogs", "GetTaskGpus")),
                ("AuditService", ("ListAuditRecords",)),
                # ReportMetrics writes a trial's metrics, but as telemetry of a running trial
                # (a call per step of every trial): recorded, it would drown the trail.
                ("SweepService", ("GetSweep", "ListSweeps", "ListTrials", "ReportMetrics")),
            )
            for method in methods
        ),
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/List",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    }
)


def is_mutating(method: str) -> bool:
    """Whether the audit trail records calls of ``method`` (a full method name): every RPC that
    is not known to only read."""
    return method not in READS


class AuditMetrics:
    """``peloton_audit_records_total{result}`` and ``peloton_audit_write_failures_total``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.records = Counter(
            "peloton_audit_records",
            "Mutating RPCs recorded in the audit trail, by result (the status code's name).",
            ["result"],
            registry=registry,
        )
        self.write_failures = Counter(
            "peloton_audit_write_failures",
            "Mutating RPCs the audit trail failed to record (each is logged).",
            registry=registry,
        )


def record_of(outcome: Outcome, daemon: str = "") -> repo.AuditRecord:
    """The record of ``outcome``: its target, never its request; every text cut to fit its
    column, NUL characters (which PostgreSQL cannot store) replaced."""
    target = ""
    describe = MUTATING.get(outcome.method)
    if describe is not None and not isinstance(outcome.request, Malformed):
        target = describe(outcome.request)
    caller = outcome.caller
    return repo.AuditRecord(
        at=datetime.fromtimestamp(outcome.at, UTC),
        user=_fit(caller.name, 255),
        groups=tuple(_fit(g, 255) for g in sorted(caller.groups)),
        via=_fit(caller.via, 32),
        method=_fit(outcome.method, 255),
        target=_fit(target, 512),
        peer=_fit(outcome.peer, 255),
        code=outcome.code.name,
        message=_fit(outcome.message, MAX_MESSAGE),
        daemon=_fit(daemon, 255),
    )


def _fit(text: str, size: int) -> str:
    text = text.replace("\x00", "\N{REPLACEMENT CHARACTER}")
    return text if len(text) <= size else text[: size - 1] + "…"


@dataclass
class _Pending:
    """A record waiting for the write that holds it."""

    record: repo.AuditRecord
    done: bool = False
    error: BaseException | None = None


class AuditTrail:
    """The interceptor's ``audit`` hook: writes one record per mutating call, on the worker
    thread the interceptor calls it on, and returns once the record is committed (the client's
    answer waits for it, so a call that was answered is in the trail). A write that fails is
    counted and raised: the interceptor logs it, and the call's answer is the call's own.

    Records are committed in groups: a thread that finds no write under way writes every record
    queued by then, in one statement that commits itself (:meth:`Database.appending`: one round
    trip on PostgreSQL, where a transaction took four), while the threads whose records came
    meanwhile wait for the next one. Many concurrent callers share writes (a write each cost a
    daemon under load round trips, each waiting for the GIL, per call)."""

    def __init__(self, db: Database, metrics: AuditMetrics, daemon: str = "") -> None:
        self._db = db
        self._metrics = metrics
        self._daemon = daemon
        self._changed = threading.Condition()
        self._queue: list[_Pending] = []
        self._writing = False

    def __call__(self, outcome: Outcome) -> None:
        if not is_mutating(outcome.method):
            return
        mine = _Pending(record_of(outcome, self._daemon))
        batch: list[_Pending] = []
        with self._changed:
            self._queue.append(mine)
            while self._writing and not mine.done:
                self._changed.wait()
            if not mine.done:  # nobody writes: write what is queued, this record included
                self._writing = True
                batch, self._queue = self._queue, []
        if batch:
            self._write(batch)
        if mine.error is not None:
            raise mine.error

    def _write(self, batch: list[_Pending]) -> None:
        """Commit ``batch`` in one transaction and tell its waiters how it went."""
        error: BaseException | None = None
        scope = RpcScope(WRITE_SECONDS)
        try:
            with scoped(scope), self._db.appending() as conn:
                repo.append(conn, *(p.record for p in batch))
        except Exception as exc:
            error = exc
        finally:
            scope.end()
            with self._changed:
                for pending in batch:
                    pending.done, pending.error = True, error
                self._writing = False
                self._changed.notify_all()
        if error is not None:
            self._metrics.write_failures.inc(len(batch))
        else:
            for pending in batch:
                self._metrics.records.labels(pending.record.code).inc()


LIST_AUDIT_RECORDS = method_name("AuditService", "ListAuditRecords")


class AuditService(audit_pb2_grpc.AuditServiceServicer):
    """Reads the audit trail, newest first, to those the authorization rules let (cluster
    admins, once callers authenticate)."""

    def __init__(self, db: Database, authz: Authorizer) -> None:
        self._db = db
        self._authz = authz

    def ListAuditRecords(
        self, request: audit_pb2.ListAuditRecordsRequest, context: grpc.ServicerContext
    ) -> audit_pb2.ListAuditRecordsResponse:
        self._authz.check(LIST_AUDIT_RECORDS)
        flt = audit_filter(request)
        size = _page_size(request.page_size)
        with self._db.reading() as session:
            records, token = repo.list_records(session, flt, size, request.page_token)
        return audit_pb2.ListAuditRecordsResponse(
            records=[record_pb(r) for r in records], next_page_token=token
        )


def audit_filter(request: audit_pb2.ListAuditRecordsRequest) -> repo.AuditFilter:
    """The request's filters, checked: INVALID_ARGUMENT names a field that is no method or
    status code, or an empty time range."""
    since = convert.request_time("since", request.since) if request.HasField("since") else None
    until = convert.request_time("until", request.until) if request.HasField("until") else None
    if since is not None and until is not None and until <= since:
        raise InvalidArgument("until", "must be after since")
    return repo.AuditFilter(
        user=request.user,
        methods=_methods(request.method),
        target=request.target,
        code=_code(request.code),
        since=since,
        until=until,
    )


def _methods(name: str) -> frozenset[str]:
    """The full method names ``name`` stands for: itself if it is one (/service/method), else
    every known RPC of that name, in any case."""
    if not name or name.startswith("/"):
        return frozenset({name} - {""})
    wanted = name.lower()
    known = (*MUTATING, *READS)
    found = frozenset(m for m in known if m.rsplit("/", 1)[-1].lower() == wanted)
    if not found:
        choices = ", ".join(sorted(m.rsplit("/", 1)[-1] for m in MUTATING))
        raise InvalidArgument(
            "method",
            f"{name!r} is no RPC: give a full method name (/peloton.v1.JobService/KillJob) "
            f"or the name of one, such as {choices}",
        )
    return found


def _code(name: str) -> str:
    if not name:
        return ""
    code = name.upper()
    if code not in grpc.StatusCode.__members__:
        choices = ", ".join(grpc.StatusCode.__members__)
        raise InvalidArgument("code", f"{name!r} is no status code: one of {choices}")
    return code


def _page_size(requested: int) -> int:
    if requested == 0:
        return DEFAULT_PAGE_RECORDS
    if requested > MAX_PAGE_RECORDS:
        raise InvalidArgument("page_size", f"must be between 1 and {MAX_PAGE_RECORDS}")
    return requested


def record_pb(record: repo.AuditRecord) -> audit_pb2.AuditRecord:
    """The API's message for ``record``."""
    return audit_pb2.AuditRecord(
        id=record.id,
        time=convert.timestamp(record.at),
        user=record.user,
        groups=record.groups,
        via=record.via,
        method=record.method,
        target=record.target,
        peer=record.peer,
        code=record.code,
        message=record.message,
        daemon=record.daemon,
    )
