"""The console's JSON API (docs/console-api.md): each request answered as its caller, with the
gRPC API's permissions; the actions call the RPCs' own servicers and are recorded in the audit
trail as those RPCs are."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import Message

import peloton
from peloton.api.audit import AuditTrail
from peloton.api.authz import Authorizer
from peloton.api.caller import acting_as
from peloton.api.host_service import (
    DRAIN_HOST,
    MAX_LOG_BYTES,
    UNDRAIN_HOST,
    HostService,
)
from peloton.api.interceptor import Outcome, record_audit, status_of
from peloton.api.job_service import GET_JOB, KILL_JOB, LIST_JOBS, RESTART_JOB, JobService
from peloton.console import params, views
from peloton.console.auth import (
    Credentials,
    cleared_cookie,
    identify,
    session_cookie,
)
from peloton.console.cache import AnswerCache, Encoded
from peloton.console.metrics import ConsoleMetrics
from peloton.console.sources import NO_CONTEXT, Sources
from peloton.core.access import ANONYMOUS, Caller
from peloton.core.records import JobFilter
from peloton.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from peloton.jobmgr.manager import MAX_PAGE_JOBS, MAX_PAGE_TASKS
from peloton.security.failure import AuthFailure
from peloton.security.identity import Authenticator
from peloton.v1 import host_pb2, job_pb2

log = logging.getLogger(__name__)

Json = views.Json

# The header every POST and DELETE must carry: a cross-site form cannot set it.
CSRF_HEADER = "X-Peloton-Console"
DEFAULT_JOBS = 500
# The most events the job page's timeline shows (the job's first ones).
TIMELINE_EVENTS = 1000
NOT_LEADER = "this daemon does not lead: open the leader's console"

HTTP_STATUS: Mapping[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}


@dataclass(frozen=True)
class Request:
    """One HTTP request, as the server read it."""

    method: str
    path: str
    query: params.Query = field(default_factory=dict)
    body: bytes = b""
    credentials: Credentials = field(default_factory=Credentials)
    client: str = ""  # the client's address
    csrf: bool = False  # it carried the CSRF header
    secure: bool = False  # over HTTPS


@dataclass
class Response:
    """An answer: ``body``, or the answer ``encoded`` already (a shared one); ``code`` is its
    status as the gRPC API would answer it (what metrics and the audit trail record)."""

    status: int
    body: Json
    headers: list[tuple[str, str]] = field(default_factory=list)
    encoded: Encoded | None = None
    code: grpc.StatusCode = grpc.StatusCode.OK


@dataclass(frozen=True)
class Call:
    """What a route's handler gets: the request, the path's parts and the caller."""

    request: Request
    parts: tuple[str, ...]
    caller: Caller
    message: Any = None  # an action's request message


Handler = Callable[[Call], Json | Response]


@dataclass(frozen=True)
class Route:
    """A method and path pattern; ``rpc``: the RPC an action is (audited as it), and how its
    request message is made from the path's parts."""

    name: str
    method: str
    pattern: re.Pattern[str]
    handler: Handler
    rpc: str = ""
    message: Callable[[tuple[str, ...]], Message] | None = None
    authenticate: bool = True


def error_body(code: grpc.StatusCode, message: str) -> Json:
    """An error answer's JSON: the message, and the gRPC code's name."""
    return {"error": message, "code": code.name}


class Api:
    """Answers the console's JSON routes (the event stream is :mod:`peloton.console.web`'s)."""

    def __init__(
        self,
        sources: Sources,
        *,
        authz: Authorizer,
        jobs: JobService,
        hosts: HostService,
        authenticator: Authenticator | None,
        audit: AuditTrail | None,
        metrics: ConsoleMetrics,
        leads: Callable[[], bool],
        generation: Callable[[], int],
        changed: Callable[[Iterable[str]], None],
        daemon_id: str = "",
    ) -> None:
        """``generation``: a count that moves whenever something the pages show changed
        (answers built before are not reused); ``changed(topics)`` tells the event streams
        (and moves it) after an action changed what no job event announces."""
        self._sources = sources
        self._authz = authz
        self._jobs = jobs
        self._hosts = hosts
        self._authenticator = authenticator
        self._audit = audit
        self.metrics = metrics
        self._leads = leads
        self._daemon_id = daemon_id
        self._cache = AnswerCache(generation)
        self._changed = changed
        self._routes = self._table()

    def _table(self) -> list[Route]:
        job = r"(?P<job>[^/]+)"
        return [
            Route("session", "POST", _path("session"), self._login, authenticate=False),
            Route("session", "DELETE", _path("session"), self._logout, authenticate=False),
            Route("session", "GET", _path("session"), self._session),
            Route("cluster", "GET", _path("cluster"), self._cluster),
            Route("pools", "GET", _path("pools"), self._pools),
            Route("queue", "GET", _path("queue"), self._queue),
            Route("jobs", "GET", _path("jobs"), self._job_list),
            Route("job", "GET", _path(f"jobs/{job}"), self._job_page),
            Route("logs", "GET", _path(f"jobs/{job}/tasks/(?P<task>[^/]+)/logs"), self._logs),
            Route(
                "kill",
                "POST",
                _path(f"jobs/{job}/kill"),
                self._kill,
                rpc=KILL_JOB,
                message=lambda p: job_pb2.KillJobRequest(
                    job_id=p[0], message="killed from the web console"
                ),
            ),
            Route(
                "restart",
                "POST",
                _path(f"jobs/{job}/restart"),
                self._restart,
                rpc=RESTART_JOB,
                message=lambda p: job_pb2.RestartJobRequest(
                    job_id=p[0], message="restarted from the web console"
                ),
            ),
            Route(
                "drain",
                "POST",
                _path("hosts/(?P<host>[^/]+)/drain"),
                self._drain,
                rpc=DRAIN_HOST,
                message=lambda p: host_pb2.DrainHostRequest(hostname=p[0]),
            ),
            Route(
                "undrain",
                "POST",
                _path("hosts/(?P<host>[^/]+)/undrain"),
                self._drain,
                rpc=UNDRAIN_HOST,
                message=lambda p: host_pb2.UndrainHostRequest(hostname=p[0]),
            ),
        ]

    # ---------------------------------------------------------------- dispatch

    def route(self, method: str, path: str) -> tuple[Route, tuple[str, ...]] | None:
        """The route of a request and the parts its path names; None: no such route."""
        allowed = None
        for route in self._routes:
            found = route.pattern.fullmatch(path)
            if found is None:
                continue
            if route.method == method:
                return route, tuple(found.groups())
            allowed = route
        if allowed is not None:
            raise InvalidArgument("method", f"{method} is not allowed on {path}")
        return None

    def handle(self, request: Request) -> Response:
        """Answer ``request``: JSON, or an error naming the field and the reason."""
        route_name = "unknown"
        began = time.time()
        caller = ANONYMOUS
        audited: tuple[Route, Message] | None = None
        try:
            found = self.route(request.method, request.path)
            if found is None:
                raise NotFound(f"path: no such route {request.path}")
            route, parts = found
            route_name = route.name
            if request.method in ("POST", "DELETE") and not request.csrf:
                raise PermissionDenied(
                    f"{CSRF_HEADER}: header required on {request.method} (the console sends it)"
                )
            if route.message is not None:
                audited = (route, route.message(parts))
            if route.authenticate:
                caller = self.caller(request)
            with acting_as(caller):
                message = audited[1] if audited is not None else None
                answer = route.handler(Call(request, parts, caller, message))
        except Exception as exc:
            response = self._failed(route_name, request, exc)
        else:
            response = answer if isinstance(answer, Response) else Response(200, answer)
        code = response.code
        if audited is not None and self._audit is not None:
            route, message = audited
            details = "" if code == grpc.StatusCode.OK else str(response.body.get("error", ""))
            peer = f"console:{request.client}"
            record_audit(
                self._audit, Outcome(route.rpc, caller, peer, message, code, details, began)
            )
        self.metrics.requests.labels(route_name, code.name).inc()
        return response

    def caller(self, request: Request) -> Caller:
        """Who sent ``request``; UNAUTHENTICATED (logged) when nobody the daemon knows."""
        try:
            return identify(self._authenticator, request.credentials)
        except AuthFailure as exc:
            log.info(
                "console login refused",
                extra={"client": request.client, "reason": exc.reason, "error": str(exc)},
            )
            raise

    def refuse(self, route: str, request: Request, exc: Exception) -> Response:
        """The answer to a request refused outside :meth:`handle` (an event stream's), counted."""
        response = self._failed(route, request, exc)
        self.metrics.requests.labels(route, response.code.name).inc()
        return response

    def _failed(self, route: str, request: Request, exc: Exception) -> Response:
        code, message = status_of(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.error("console request failed", exc_info=exc, extra={"route": route})
        else:
            log.info(
                "console request refused",
                extra={
                    "route": route,
                    "path": request.path,
                    "client": request.client,
                    "code": code.name,
                    "error": message,
                },
            )
        return Response(HTTP_STATUS.get(code, 500), error_body(code, message), code=code)

    # ---------------------------------------------------------------- who may see what

    def may_view(self) -> Callable[[str], bool]:
        """Whether the caller may view a pool's jobs."""
        pools = self._authz.viewable_pools()
        return lambda pool: pools is None or pool in pools

    def visible_jobs(self, caller: Caller, job_ids: Iterable[str]) -> list[str]:
        """Those of ``job_ids`` whose jobs ``caller`` may view (what an event stream names)."""
        ids = sorted(job_ids)
        if caller.anonymous or not ids:
            return ids
        with acting_as(caller):
            may_view = self.may_view()
        jobs = self._sources.jobs.get_jobs(ids)
        return sorted(j.id for j in jobs if may_view(j.spec.pool))

    def _require_leader(self) -> None:
        if not self._leads():
            raise FailedPrecondition(NOT_LEADER)

    # ---------------------------------------------------------------- session

    def _session_body(self, caller: Caller) -> Json:
        with acting_as(caller):
            # A cluster admin: may drain and undrain hosts (the page offers it only then). The
            # anonymous caller of a daemon without authentication may do everything; after a
            # logout from one with authentication, nothing.
            admin = self._authz.may(DRAIN_HOST) and (
                not caller.anonymous or self._authenticator is None
            )
        return {
            "caller": caller.name,
            "anonymous": caller.anonymous,
            "admin": admin,
            "via": caller.via,
            "daemon_id": self._daemon_id,
            "leads": self._leads(),
            "version": peloton.__version__,
        }

    def _session(self, call: Call) -> Json:
        return self._session_body(call.caller)

    def _login(self, call: Call) -> Response:
        token = params.json_object(call.request.body).get("token")
        if not isinstance(token, str) or not token.strip():
            raise InvalidArgument("token", "is required: a bearer token of this daemon")
        token = token.strip()
        credentials = Credentials(authorization=f"Bearer {token}")
        caller = self.caller(Request("POST", call.request.path, credentials=credentials))
        cookie = session_cookie(token, call.request.secure)
        return Response(200, self._session_body(caller), [("Set-Cookie", cookie)])

    def _logout(self, call: Call) -> Response:
        cookie = cleared_cookie(call.request.secure)
        return Response(200, self._session_body(ANONYMOUS), [("Set-Cookie", cookie)])

    # ---------------------------------------------------------------- reads

    def _shared(self, key: Hashable, build: Callable[[], Json]) -> Response:
        """The answer for ``key``, built once per change for every caller who asks (the key
        says what they may view)."""
        return Response(200, {}, encoded=self._cache.get(key, build))

    def _cluster(self, call: Call) -> Response:
        params.known(call.request.query, ())
        viewable = self._authz.viewable_pools()
        return self._shared(("cluster", viewable), self._cluster_json)

    def _cluster_json(self) -> Json:
        snap = self._sources.cluster()
        return views.cluster_json(snap.hosts, snap.holdings, snap.holders, self.may_view())

    def _pools(self, call: Call) -> Response:
        params.known(call.request.query, ())
        self._require_leader()
        return self._shared(
            ("pools",),
            lambda: views.pools_json(self._sources.pool_tree(), self._sources.statuses()),
        )

    def _queue(self, call: Call) -> Response:
        query = params.known(call.request.query, ("pool",))
        self._require_leader()
        pool = params.one(query, "pool")
        if pool and pool not in self._sources.pool_tree():
            raise NotFound(f"pool: no pool {pool}")
        viewable = self._authz.viewable_pools()
        return self._shared(("queue", pool, viewable), lambda: self._queue_json(pool))

    def _queue_json(self, pool: str) -> Json:
        tree = self._sources.pool_tree()
        waiting, jobs = self._sources.queue()
        prefix = pool.rstrip("/") + "/"
        # Every leaf pool, waiting gangs or not: the ``pool`` given and those below it.
        queues = {
            p: waiting.get(p, [])
            for p in tree.leaves()
            if not pool or p == pool or p.startswith(prefix)
        }
        may_view = self.may_view()
        queued = {g.job_id for gangs in queues.values() for g in gangs}
        shown = [j for j in queued if j in jobs and may_view(jobs[j].spec.pool)]
        return views.queue_json(queues, jobs, self._sources.pending(shown), may_view)

    def _job_list(self, call: Call) -> Json:
        query = params.known(
            call.request.query, ("state", "pool", "label", "owner", "name", "limit")
        )
        limit = params.integer(query, "limit", DEFAULT_JOBS, 1, MAX_PAGE_JOBS)
        flt = JobFilter(
            states=frozenset(params.job_state(s) for s in query.get("state", ())),
            pool=params.one(query, "pool"),
            name_prefix=params.one(query, "name"),
            labels=dict(params.label(x) for x in query.get("label", ())),
            # Only the jobs the caller may view, as ListJobs lists them.
            pools=self._authz.viewable_pools(),
        )
        if flt.pool:
            self._authz.check(LIST_JOBS, pool=flt.pool)
        owner = params.one(query, "owner")
        jobs, token = self._sources.jobs.list_jobs(flt, limit)
        rows = [views.job_json(j) for j in jobs if not owner or j.owner == owner]
        return {"jobs": rows, "truncated": bool(token)}

    def _job_page(self, call: Call) -> Json:
        params.known(call.request.query, ())
        job = self._sources.jobs.get_job(call.parts[0])
        self._authz.check_job(GET_JOB, job)
        tasks, _ = self._sources.jobs.list_tasks(job.id, page_size=MAX_PAGE_TASKS)
        events = self._sources.jobs.job_events(job.id, limit=TIMELINE_EVENTS)
        gpus = job.spec.task.resources.gpu
        reports = self._sources.reports
        return {
            "job": views.job_json(job),
            "tasks": [views.task_json(t, gpus, reports.known(t.current.id) or ()) for t in tasks],
            "hosts": views.job_hosts(tasks, views.racks_of(self._sources.hosts())),
            "events": [views.event_json(e) for e in events],
            "actions": {
                name: self._authz.may(method, pool=job.spec.pool, owner=job.owner)
                for name, method in (("kill", KILL_JOB), ("restart", RESTART_JOB))
            },
        }

    def _logs(self, call: Call) -> Json:
        query = params.known(call.request.query, ("stream", "offset", "attempt", "length"))
        job_id, task = call.parts
        instance = params.number("instance", task, 0, 2**32 - 1)
        stream = params.one(query, "stream") or "stdout"
        if stream not in ("stdout", "stderr"):
            raise InvalidArgument("stream", f"{stream!r}: one of stdout, stderr")
        request = host_pb2.GetTaskLogsRequest(
            job_id=job_id,
            instance_id=instance,
            stderr=stream == "stderr",
            offset=params.integer(query, "offset", 0, 0, 2**63 - 1),
            attempt=params.integer(query, "attempt", 0, 0, 2**32 - 1),
            length=params.integer(query, "length", 64 * 1024, 1, MAX_LOG_BYTES),
        )
        # GetTaskLogs checks the caller's permission first (NOT_FOUND for an unknown job).
        piece = self._hosts.GetTaskLogs(request, NO_CONTEXT)
        task_record, _ = self._sources.jobs.get_task(job_id, instance)
        return {
            "data": piece.data.decode("utf-8", errors="replace"),
            "offset": piece.offset,
            "next_offset": piece.offset + len(piece.data),
            "ended": piece.ended,
            "attempt": piece.attempt,
            "attempts": [a.attempt for a in (*task_record.history, task_record.current)],
        }

    # ---------------------------------------------------------------- actions

    def _kill(self, call: Call) -> Json:
        self._jobs.KillJob(call.message, NO_CONTEXT)
        return {"job": views.job_json(self._sources.jobs.get_job(call.message.job_id))}

    def _restart(self, call: Call) -> Json:
        self._jobs.RestartJob(call.message, NO_CONTEXT)
        return {"job": views.job_json(self._sources.jobs.get_job(call.message.job_id))}

    def _drain(self, call: Call) -> Json:
        if isinstance(call.message, host_pb2.DrainHostRequest):
            self._hosts.DrainHost(call.message, NO_CONTEXT)
        else:
            self._hosts.UndrainHost(call.message, NO_CONTEXT)
        self._changed(("cluster",))
        name = call.message.hostname
        cluster = self._cluster_json()
        for rack in cluster["racks"]:
            for host in rack["hosts"]:
                if name in (host["hostname"], host["agent_id"]):
                    return {"host": host}
        raise NotFound(f"host {name} not found")


# ---------------------------------------------------------------- routes


def _path(tail: str) -> re.Pattern[str]:
    return re.compile(f"/api/v1/{tail}")
