"""CreateJob callers that run in their own processes, so they never hold the daemon's GIL.

Kept apart from :mod:`bench.bench_jobs` so that a spawned worker imports only gRPC and the
generated messages, not SQLAlchemy and the storage layer.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import grpc

from peloton.v1 import common_pb2, job_pb2, job_pb2_grpc

RPC_TIMEOUT_S = 60.0


def job_spec(name: str, *, instances: int = 1, team: int = 0, pool: str = "/bench/create") -> Any:
    """A realistic one-GPU training job spec (defaults are filled in by the server)."""
    return job_pb2.JobSpec(
        name=name,
        pool=pool,
        priority=10,
        labels={"team": f"team-{team % 10}", "bench": "create"},
        instances=instances,
        task=job_pb2.TaskSpec(
            command="python train.py --epochs 10",
            env={"NCCL_DEBUG": "WARN"},
            resources=common_pb2.Resources(cpu=4.0, mem_mb=16_384.0, gpu=1.0),
        ),
    )


@dataclass
class ThreadResult:
    start: float
    end: float
    latencies: list[float]
    error: str = ""


def _call_loop(stub: Any, prefix: str, count: int) -> ThreadResult:
    latencies: list[float] = []
    start = time.perf_counter()
    try:
        for i in range(count):
            request = job_pb2.CreateJobRequest(spec=job_spec(f"{prefix}-{i}", team=i))
            t0 = time.perf_counter()
            response = stub.CreateJob(request, timeout=RPC_TIMEOUT_S)
            latencies.append(time.perf_counter() - t0)
            if not response.created:
                raise RuntimeError(f"job {response.job.job_id} was not created")
    except Exception:
        return ThreadResult(start, time.perf_counter(), latencies, traceback.format_exc())
    return ThreadResult(start, time.perf_counter(), latencies)


def _run_threads(stub: Any, prefix: str, threads: int, count: int) -> list[ThreadResult]:
    results: list[ThreadResult | None] = [None] * threads

    def run(t: int) -> None:
        results[t] = _call_loop(stub, f"{prefix}-t{t}", count)

    pool = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return [r for r in results if r is not None]


def create_worker(
    target: str,
    worker: int,
    threads: int,
    warmup: int,
    count: int,
    tag: str,
    go: Event,
    queue: Queue[Any],
) -> None:
    """Warm up, report ``("ready", worker, None)``, wait for ``go``, then make
    ``threads x count`` CreateJob calls and report ``("ok", worker, (runs, cpu_seconds))`` with
    one ``(start, end, latencies)`` per thread and the CPU this process used meanwhile; any
    failure is reported as ``("error", worker, traceback)``.
    """
    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = job_pb2_grpc.JobServiceStub(channel)
        for r in _run_threads(stub, f"warm-{tag}-w{worker}", threads, warmup):
            if r.error:
                raise RuntimeError(f"warm-up failed:\n{r.error}")
        queue.put(("ready", worker, None))
        if not go.wait(timeout=600):
            raise RuntimeError("no go from the coordinator within 600 s")
        cpu = time.process_time()
        results = _run_threads(stub, f"bench-{tag}-w{worker}", threads, count)
        cpu = time.process_time() - cpu
        errors = [r.error for r in results if r.error]
        if errors:
            queue.put(("error", worker, errors[0]))
        else:
            runs = [(r.start, r.end, r.latencies) for r in results]
            queue.put(("ok", worker, (runs, cpu)))
    except BaseException:
        queue.put(("error", worker, traceback.format_exc()))
    finally:
        channel.close()
