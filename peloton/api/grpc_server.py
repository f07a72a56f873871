"""The daemon's gRPC server: asyncio, on an event loop thread of its own.

The loop only ever waits: unary RPCs run on a pool of worker threads (``workers``), and the
long-lived streams (WatchJob, health Watch) are coroutines on the loop, so open streams cost no
worker and cannot starve the unary API. The rest of the daemon is threads; this class is where
they meet the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeAlias, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from peloton.api.interceptor import Audit, Authenticate, ServiceInterceptor
from peloton.api.watches import WatchHub, WatchMetrics, WatchQuotas
from peloton.errors import Unavailable
from peloton.metrics import Metrics

T = TypeVar("T")

ServingStatus: TypeAlias = health_pb2.HealthCheckResponse.ServingStatus.ValueType


class GrpcServer:
    """bind() listens, start() serves; stop() ends the streams, drains and stops the loop."""

    def __init__(
        self,
        metrics: Metrics,
        workers: int,
        quotas: WatchQuotas,
        changed_after: Callable[[int], Mapping[str, int]],
        newest: Callable[[], int],
        authenticate: Authenticate | None = None,
        audit: Audit | None = None,
    ) -> None:
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc")
        self._metrics = metrics
        self._authenticate = authenticate
        self._audit = audit
        self._loop = asyncio.new_event_loop()
        # Held by stop() while it begins and by set_health(), so that nothing waits on a loop
        # that has stopped.
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._run_loop, name="grpc-loop", daemon=True)
        self._thread.start()
        # Created on the loop: asyncio objects belong to the loop they are made on.
        self._server: grpc.aio.Server = self.call(self._make_server())
        self._health = health.aio.HealthServicer()
        self.watches = WatchHub(
            self.executor,
            quotas,
            changed_after,
            newest,
            read_slots=max(1, workers // 4),
            metrics=WatchMetrics(metrics.registry),
        )

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _make_server(self) -> grpc.aio.Server:
        return grpc.aio.server(
            interceptors=[
                ServiceInterceptor(self._metrics, self.executor, self._authenticate, self._audit)
            ],
            options=[("grpc.so_reuseport", 0)],
        )

    @property
    def server(self) -> grpc.aio.Server:
        """Where services are added (before start)."""
        return self._server

    def bind(
        self,
        address: str,
        service_names: tuple[str, ...],
        credentials: grpc.ServerCredentials | None = None,
        serve_reflection: bool = True,
    ) -> int:
        """Listen on ``address`` (port 0: any free) once the services were added, with health
        and (unless ``serve_reflection`` is false) reflection, over TLS with ``credentials``,
        else plaintext; returns the port. Nothing is served before start()."""
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        if serve_reflection:
            reflection.enable_server_reflection(
                (*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
            )
        try:
            if credentials is None:
                port = self._server.add_insecure_port(address)
            else:
                port = self._server.add_secure_port(address, credentials)
        except RuntimeError as exc:
            raise Unavailable(f"cannot listen on {address}: {exc}") from exc
        return port

    def start(self) -> None:
        self.call(self._start())

    async def _start(self) -> None:
        await self.watches.start()
        await self._server.start()

    def set_health(self, names: tuple[str, ...], status: ServingStatus) -> None:
        """Set the health of ``names`` (from any thread; ignored once stopping began, when the
        loop may no longer run it)."""

        async def set_all() -> None:
            for name in names:
                await self._health.set(name, status)

        with self._lock:
            if not self._stopping:
                self.call(set_all())

    def stop(self, grace: float) -> None:
        """NOT_SERVING, end the watches, let unary RPCs finish within ``grace`` seconds (then
        cancel them, cutting their queries), stop the loop."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        self.call(self._stop(grace))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        # Workers still blocked (the database is bounded apart) must not hold up the caller.
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _stop(self, grace: float) -> None:
        await self._health.enter_graceful_shutdown()
        await self.watches.close()
        await self._server.stop(grace)
        # What the streams left (a shared read nobody waits for) ends with the loop.
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
