"""``peloton.report(step=..., **metrics)``: a trial's worker sends its metrics to the daemon.

The trial's job carries where and how (:mod:`peloton.sweep.trialjob`): the daemon's address
(``SWEEP_SERVER``) and the trial's report token (``SWEEP_TOKEN``), with the
task's job and attempt (``PELOTON_JOB_ID``, ``PELOTON_ATTEMPT_ID``). To a daemon that serves
TLS (``SWEEP_SERVER_TLS=1``) it connects over TLS, verifying the daemon's certificate with the
CA in ``SWEEP_CA_FILE`` if set (a path on the agents), else the system's roots. On a daemon
with authentication the task also needs a caller's credential: a bearer token in
``PELOTON_TOKEN`` (README "Sweeps").
Only rank 0 (``PELOTON_RANK``; an elastic gang's instance 0) reports unless ``all_ranks`` is
set: the ranks of a data-parallel gang see the same model. Outside a sweep, reporting does
nothing, so a trainer runs alone unchanged.

A report the daemon cannot take now (it restarts, a new leader is elected) is retried for up
to ``RETRY_SECONDS``; a step reported twice is stored once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import grpc

from peloton.core import gangenv
from peloton.sweep.trialjob import SWEEP_SERVER, SWEEP_SERVER_TLS, SWEEP_TOKEN
from peloton.v1 import sweep_pb2, sweep_pb2_grpc

RETRY_SECONDS = 120.0
RPC_TIMEOUT_SECONDS = 10.0
_RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

# The CA a trial's tasks verify a TLS daemon's certificate with (else the system's roots).
CA_FILE = "SWEEP_CA_FILE"

_lock = threading.Lock()
_channels: dict[tuple[str, bool, str], grpc.Channel] = {}


def _stub(address: str, tls: bool, ca_file: str) -> sweep_pb2_grpc.SweepServiceStub:
    """A stub on one channel per (address, TLS, CA) for the process's reports."""
    key = (address, tls, ca_file)
    with _lock:
        channel = _channels.get(key)
        if channel is None:
            if tls:
                roots = Path(ca_file).read_bytes() if ca_file else None
                credentials = grpc.ssl_channel_credentials(root_certificates=roots)
                channel = grpc.secure_channel(address, credentials)
            else:
                channel = grpc.insecure_channel(address)
            _channels[key] = channel
    return sweep_pb2_grpc.SweepServiceStub(channel)


def _rank(env: Mapping[str, str]) -> str:
    """The task's rank: ``PELOTON_RANK``, or for an elastic gang, whose ranks come from its
    rendezvous and change as it grows, its instance (instance 0 is never shrunk away)."""
    if env.get(gangenv.RENDEZVOUS):
        return env.get(gangenv.INSTANCE_ID, "0")
    return env.get(gangenv.RANK, "0")


def report(
    step: int,
    metrics: Mapping[str, float],
    *,
    all_ranks: bool = False,
    env: Mapping[str, str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Report ``metrics`` (name: value) at ``step``; True when the trial should stop (it was
    stopped early, or its sweep ended): the worker may exit at once. Raises grpc.RpcError
    when the daemon refuses the report, or stays unreachable past ``RETRY_SECONDS``."""
    env = os.environ if env is None else env
    address = env.get(SWEEP_SERVER)
    if not address:
        return False
    if not all_ranks and _rank(env) != "0":
        return False
    request = sweep_pb2.ReportMetricsRequest(
        job_id=env.get(gangenv.JOB_ID, ""),
        attempt_id=env.get(gangenv.ATTEMPT_ID, ""),
        token=env.get(SWEEP_TOKEN, ""),
        step=step,
        metrics={k: float(v) for k, v in metrics.items()},
    )
    token = env.get("PELOTON_TOKEN")
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    deadline = time.monotonic() + RETRY_SECONDS
    pause = 0.2
    while True:
        try:
            stub = _stub(address, env.get(SWEEP_SERVER_TLS) == "1", env.get(CA_FILE, ""))
            answer = stub.ReportMetrics(request, timeout=RPC_TIMEOUT_SECONDS, metadata=metadata)
            return bool(answer.stop)
        except grpc.RpcError as exc:
            if exc.code() not in _RETRY or time.monotonic() + pause > deadline:
                raise
        sleep(pause)
        pause = min(pause * 2, 5.0)
