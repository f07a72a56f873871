"""One server interceptor for every RPC: maps domain errors to status codes, counts and times.

Servicers raise :mod:`peloton.errors` exceptions; this is the only place that knows gRPC codes,
so every RPC reports bad input the same way (INVALID_ARGUMENT naming the field and the reason).
Every request is checked at this edge first (:mod:`peloton.api.limits`); bytes that do not parse
are answered INVALID_ARGUMENT too, and logged once per client and interval (grpc would log a
traceback for each, so any client could fill the log).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, NoReturn, cast

import grpc
from google.protobuf.message import DecodeError, Message
from sqlalchemy.exc import OperationalError

from peloton import errors
from peloton.api import limits
from peloton.api.caller import acting_as, set_caller
from peloton.api.peers import client_of
from peloton.core.access import ANONYMOUS, Caller
from peloton.metrics import Metrics
from peloton.storage.deadline import RpcScope, scoped

log = logging.getLogger(__name__)

# The server's context, whatever the request and response types.
Context = grpc.aio.ServicerContext[Any, Any]

CODES: dict[type[errors.PelotonError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Conflict: grpc.StatusCode.ABORTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
}

# Who calls an RPC: (the full method name, e.g. /peloton.v1.JobService/CreateJob, the context)
# -> the caller; raises errors.Unauthenticated. Runs on the event loop: it must not block.
Authenticate = Callable[[str, Context], Caller]


@dataclass(frozen=True)
class Outcome:
    """How one unary RPC ended: what the audit trail records."""

    method: str  # the full method name
    caller: Caller
    peer: str  # the client's address as gRPC gives it (ipv4:1.2.3.4:5678)
    request: Any  # the request message, or Malformed
    code: grpc.StatusCode
    message: str  # the status details ("" when OK)
    at: float  # when the RPC began (time.time())


# Records an Outcome; called on a worker thread, and the client's answer waits for it.
Audit = Callable[[Outcome], None]


# A client's malformed requests are logged at most once per this many seconds.
MALFORMED_LOG_INTERVAL = 60.0


@dataclass(frozen=True)
class Malformed:
    """What a request deserializer returns for bytes its message class cannot parse, so that
    the RPC, which knows its client, answers them (the deserializer cannot)."""

    message_class: type[Message] | None
    data: bytes


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserializer``, returning :class:`Malformed` where it would raise DecodeError."""
    if deserializer is None:
        return None
    # Generated stubs pass the message class's FromString: its class names the fields.
    owner = getattr(deserializer, "__self__", None)
    message_class = owner if isinstance(owner, type) and issubclass(owner, Message) else None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError:
            return Malformed(message_class, data)

    return parse


class MalformedLog:
    """Logs a client's malformed requests once per interval, with how many went unlogged."""

    def __init__(self, interval: float = MALFORMED_LOG_INTERVAL) -> None:
        self._interval = interval
        self._lock = threading.Lock()
        # client -> (when last logged, requests since)
        self._seen: dict[str, tuple[float, int]] = {}

    def record(self, peer: str, method: str, error: errors.InvalidArgument) -> None:
        client = client_of(peer)
        now = time.monotonic()
        with self._lock:
            last, unlogged = self._seen.get(client, (-self._interval, 0))
            if now - last < self._interval:
                self._seen[client] = (last, unlogged + 1)
                return
            self._seen[client] = (now, 0)
        log.warning(
            "malformed request",
            extra={"client": client, "method": method, "error": str(error), "unlogged": unlogged},
        )


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and details a call that raised ``exc`` ends with (every API edge, gRPC
    or the web console, answers an error alike)."""
    for kind, code in CODES.items():
        if isinstance(exc, kind):
            return code, str(exc)
    if isinstance(exc, OperationalError):
        return grpc.StatusCode.UNAVAILABLE, "database unavailable; retry later"
    return grpc.StatusCode.INTERNAL, "internal error; see the server log"


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every handler of the (asyncio) server. Synchronous handlers, the services' unary
    RPCs, run on ``executor`` under an :class:`RpcScope` bounded by the client's deadline, so
    that the event loop only ever waits; asynchronous ones (WatchJob, health) run on the loop."""

    def __init__(
        self,
        metrics: Metrics,
        executor: Executor,
        authenticate: Authenticate | None = None,
        audit: Audit | None = None,
    ) -> None:
        self._metrics = metrics
        self._executor = executor
        self._malformed = MalformedLog()
        self._authenticate = authenticate
        self._audit = audit

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        full = handler_call_details.method
        method = full.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(full, method, handler.unary_unary),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(full, method, handler.unary_stream),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler

    def _finish(self, method: str, code: grpc.StatusCode, started: float) -> None:
        self._metrics.grpc_requests.labels(method, code.name).inc()
        self._metrics.grpc_seconds.labels(method).observe(time.perf_counter() - started)

    async def _fail(self, method: str, exc: Exception, context: Context, started: float) -> None:
        """Count the failure and end the RPC with its status (context.abort raises)."""
        code, message = status_of(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.error("rpc failed", exc_info=exc, extra={"method": method})
        else:
            log.info("rpc rejected", extra={"method": method, "code": code.name, "error": message})
        self._finish(method, code, started)
        await context.abort(code, message)

    async def _identify(self, full: str, method: str, context: Context, started: float) -> Caller:
        """Who calls (anonymous without authentication); UNAUTHENTICATED if nobody known."""
        if self._authenticate is None:
            return ANONYMOUS
        try:
            return self._authenticate(full, context)
        except errors.Unauthenticated as exc:
            await self._fail(method, exc, context, started)
            raise  # not reached: _fail aborts

    async def _record(self, outcome: Outcome, wait: bool) -> None:
        """Hand ``outcome`` to the audit trail on a worker thread; the RPC's answer waits for
        it unless the RPC was cancelled (nobody waits for that answer)."""
        if self._audit is None:
            return
        future = asyncio.get_running_loop().run_in_executor(
            self._executor, record_audit, self._audit, outcome
        )
        if wait:
            await future

    async def _check(self, method: str, request: Any, context: Context, started: float) -> None:
        """Refuse a request the edge rejects: malformed bytes (logged by :class:`MalformedLog`
        alone) or a field out of bounds."""
        if isinstance(request, Malformed):
            error = limits.check_malformed(request.message_class, request.data)
            self._malformed.record(context.peer(), method, error)
            self._finish(method, grpc.StatusCode.INVALID_ARGUMENT, started)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        try:
            limits.check_request(request)
        except errors.InvalidArgument as exc:
            await self._fail(method, exc, context, started)

    def _aborted(self, method: str, context: Context, started: float) -> None:
        """The handler ended the RPC itself (health's NOT_FOUND): count what it answered."""
        self._finish(method, _code_of(context), started)

    @asynccontextmanager
    async def _answering(
        self, method: str, context: Context, started: float
    ) -> AsyncIterator[None]:
        """Count how the handler run in the block ends, and turn its errors into the RPC's
        status: cancelled (the client went away, or the server is stopping), aborted by the
        handler itself, a domain error, or OK."""
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):
            self._finish(method, grpc.StatusCode.CANCELLED, started)
            raise
        except grpc.aio.AbortError:
            self._aborted(method, context, started)
            raise
        except Exception as exc:
            await self._fail(method, exc, context, started)
        else:
            self._finish(method, grpc.StatusCode.OK, started)

    def _unary(
        self, full: str, method: str, behavior: Callable[[Any, Any], Any]
    ) -> Callable[[Any, Context], Awaitable[Any]]:
        asynchronous = inspect.iscoroutinefunction(behavior)

        async def run(request: Any, context: Context) -> Any:
            started = time.perf_counter()
            began = time.time()
            caller = ANONYMOUS
            peer = context.peer()
            once = _Once()  # a cancelled call's handler may still return on its thread

            async def record(code: grpc.StatusCode, message: str) -> None:
                if once.claim():
                    outcome = Outcome(full, caller, peer, request, code, message, began)
                    await self._record(outcome, wait=code != grpc.StatusCode.CANCELLED)

            def record_ok() -> None:
                # On a synchronous handler's worker thread as it returns: no second hop from
                # the event loop to a worker for the record (each waits for the interpreter).
                if once.claim() and self._audit is not None:
                    ok = Outcome(full, caller, peer, request, grpc.StatusCode.OK, "", began)
                    record_audit(self._audit, ok)

            # grpc sends an abort's status at once: the outcome is recorded before, so that a
            # refused call, like any other, is answered once the trail holds it.
            ctx = context if self._audit is None else cast(Context, _RecordedAbort(context, record))
            try:
                caller = await self._identify(full, method, ctx, started)
                await self._check(method, request, ctx, started)
                response = await self._serve(
                    method, behavior, asynchronous, caller, request, ctx, started, record_ok
                )
            except (asyncio.CancelledError, GeneratorExit):
                await record(grpc.StatusCode.CANCELLED, "cancelled")
                raise
            except Exception:
                # An abort recorded itself; anything else escaped (grpc answers UNKNOWN).
                await record(grpc.StatusCode.UNKNOWN, "unexpected error; see the server log")
                raise
            await record(grpc.StatusCode.OK, "")  # a coroutine's (a handler thread's was)
            return response

        return run

    async def _serve(
        self,
        method: str,
        behavior: Callable[[Any, Any], Any],
        asynchronous: bool,
        caller: Caller,
        request: Any,
        context: Context,
        started: float,
        returned: Callable[[], None],
    ) -> Any:
        """Run a unary handler as ``caller``: a coroutine on the loop, a synchronous one on a
        worker thread, which then calls ``returned`` if it returned."""
        # The database work is bounded by the client's deadline, and cut if the RPC ends
        # (cancelled, past its deadline: the server cancels this coroutine) before it does.
        scope = RpcScope(context.time_remaining())
        async with self._answering(method, context, started):
            try:
                if asynchronous:
                    set_caller(caller)  # each RPC is a task of its own, with its own context
                    response = await behavior(request, context)
                else:
                    call = partial(_in_scope, scope, caller, behavior, request, context, returned)
                    response = await asyncio.get_running_loop().run_in_executor(
                        self._executor, call
                    )
            finally:
                scope.end()
        return response

    def _stream(
        self, full: str, method: str, behavior: Callable[[Any, Any], AsyncIterator[Any]]
    ) -> Callable[[Any, Context], AsyncIterator[Any]]:
        if not inspect.isasyncgenfunction(behavior):
            # A synchronous stream would hold a worker thread for as long as it is open.
            raise TypeError(f"{method}: streaming handlers must be async generators")

        async def run(request: Any, context: Context) -> AsyncIterator[Any]:
            started = time.perf_counter()
            caller = await self._identify(full, method, context, started)
            await self._check(method, request, context, started)
            set_caller(caller)  # each RPC is a task of its own, with its own context
            async with self._answering(method, context, started):
                async for response in behavior(request, context):
                    yield response

        return run


_UNKNOWN = grpc.StatusCode.UNKNOWN


def _code_of(context: Context) -> grpc.StatusCode:
    code = context.code()
    return code if isinstance(code, grpc.StatusCode) else _UNKNOWN


def _in_scope(
    scope: RpcScope,
    caller: Caller,
    behavior: Callable[[Any, Any], Any],
    request: Any,
    context: Any,
    returned: Callable[[], None],
) -> Any:
    """Run a synchronous handler on a worker thread as ``caller``, its database work under
    ``scope``; then ``returned()``, if it returned."""
    with scoped(scope), acting_as(caller):
        response = behavior(request, context)
    returned()
    return response


class _Once:
    """True for the first claim only, from whichever thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claimed = False

    def claim(self) -> bool:
        with self._lock:
            claimed, self._claimed = self._claimed, True
            return not claimed


class _RecordedAbort:
    """An RPC's context whose abort() first awaits ``before(code, details)``; everything else
    is the context's own."""

    def __init__(
        self, context: Context, before: Callable[[grpc.StatusCode, str], Awaitable[None]]
    ) -> None:
        self._context = context
        self._before = before

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> NoReturn:
        await self._before(code, details)
        await self._context.abort(code, details, trailing_metadata)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def record_audit(audit: Audit, outcome: Outcome) -> None:
    """Record ``outcome``; a trail that fails is logged, never the call's failure."""
    try:
        audit(outcome)
    except Exception:
        log.exception("audit record failed", extra={"method": outcome.method})
