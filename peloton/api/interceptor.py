"""One server interceptor for every RPC: maps domain errors to status codes, counts and times.

Servicers raise :mod:`peloton.errors` exceptions; this is the only place that knows gRPC codes,
so every RPC reports bad input the same way (INVALID_ARGUMENT naming the field and the reason).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from sqlalchemy.exc import OperationalError

from peloton import errors
from peloton.metrics import Metrics

log = logging.getLogger(__name__)

CODES: dict[type[errors.PelotonError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Conflict: grpc.StatusCode.ABORTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
}


def _status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    for kind, code in CODES.items():
        if isinstance(exc, kind):
            return code, str(exc)
    if isinstance(exc, OperationalError):
        return grpc.StatusCode.UNAVAILABLE, "database unavailable; retry later"
    return grpc.StatusCode.INTERNAL, "internal error; see the server log"


class ServiceInterceptor(grpc.ServerInterceptor):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: Any
    ) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _finish(self, method: str, code: grpc.StatusCode, started: float) -> None:
        self._metrics.grpc_requests.labels(method, code.name).inc()
        self._metrics.grpc_seconds.labels(method).observe(time.perf_counter() - started)

    def _fail(
        self, method: str, exc: Exception, context: grpc.ServicerContext, started: float
    ) -> None:
        """Count the failure and end the RPC with its status (context.abort raises)."""
        code, message = _status(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.error("rpc failed", exc_info=exc, extra={"method": method})
        else:
            log.info("rpc rejected", extra={"method": method, "code": code.name, "error": message})
        self._finish(method, code, started)
        context.abort(code, message)

    def _unary(self, method: str, behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                response = behavior(request, context)
            except Exception as exc:
                self._fail(method, exc, context, started)
            self._finish(method, grpc.StatusCode.OK, started)
            return response

        return run

    def _stream(
        self, method: str, behavior: Callable[[Any, Any], Iterator[Any]]
    ) -> Callable[[Any, Any], Iterator[Any]]:
        def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            started = time.perf_counter()
            try:
                yield from behavior(request, context)
            except GeneratorExit:
                # The client went away (or the server is stopping) mid-stream.
                self._finish(method, grpc.StatusCode.CANCELLED, started)
                raise
            except Exception as exc:
                self._fail(method, exc, context, started)
            code = grpc.StatusCode.OK if context.is_active() else grpc.StatusCode.CANCELLED
            self._finish(method, code, started)

        return run
