"""A typed Python client for the peloton gRPC API.

Example::

    from peloton.client import PelotonClient
    from peloton.core.spec import load_job_spec_yaml

    with PelotonClient("127.0.0.1:5392") as client:
        job = client.create_job(load_job_spec_yaml(open("job.yaml").read()))
        for update in client.watch_job(job.job_id):
            print(update.event.to_state)

Every method raises :class:`ClientError` (with the gRPC status code) when the server refuses.

Several daemons (README "Several daemons"): give their addresses separated by commas
(``"h1:5392,h2:5392"``). A call that fails UNAVAILABLE (the daemon is down or cannot be reached)
or DEADLINE_EXCEEDED (it did not answer within ``timeout``: frozen) is sent to the next address,
each address at most once per call, and the client stays with the one that answered; any other
status is raised as it is. ``create_job`` then sends a request id
(one it makes up when the caller gave none), so a retry after a lost reply returns the job the
first attempt created; ``restart_job``, which is not idempotent, moves on only when the daemon
could not be connected to at all; ``watch_job`` resumes on the next daemon after the last event it
passed on.

Transport security (README "Security"): ``tls=Tls.from_files(ca_file, cert_file, key_file)``
connects over TLS, verifying the daemon's certificate with that CA, and shows a client
certificate where the daemon asks for one (mutual TLS); ``token=`` sends ``authorization: Bearer
<token>`` metadata with every call. A token goes only over TLS or to a loopback address: the
client refuses to send one in clear text across the network.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import grpc

from peloton.errors import InvalidArgument
from peloton.security.loopback import is_loopback
from peloton.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    host_pb2,
    host_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    pool_pb2,
    pool_pb2_grpc,
    sweep_pb2,
    sweep_pb2_grpc,
)

R = TypeVar("R")
DEFAULT_PORT = 5392
DEFAULT_SERVER = f"127.0.0.1:{DEFAULT_PORT}"
# Large pages of tasks with long attempt histories exceed gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def default_server() -> str:
    return os.environ.get("PELOTON_SERVER", DEFAULT_SERVER)


# Target forms gRPC reads itself (one target, whatever commas it holds: ipv4:a,b is a list too).
_GRPC_SCHEMES = ("unix:", "unix-abstract:", "ipv4:", "ipv6:")
_TERMINAL = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_KILLED)


def server_addresses(server: str) -> list[str]:
    """The gRPC targets for ``ADDRESS[,ADDRESS...]``, each read by :func:`server_address`: the
    daemons a client fails over between, in the order given. A target with a gRPC scheme is one
    target, commas and all. Raises ValueError for an empty entry or a bad address."""
    text = server.strip()
    if "://" in text or text.startswith(_GRPC_SCHEMES):
        return [text]
    parts = text.split(",")
    if len(parts) > 1 and not all(part.strip() for part in parts):
        raise ValueError(f"{server!r} has an empty address (ADDRESS,ADDRESS...)")
    return [server_address(part) for part in parts]


def server_address(server: str) -> str:
    """The gRPC target for ``HOST[:PORT]``: a HOST alone means port 5392 (gRPC would dial 443).

    IPv6 hosts are written in brackets (``[::1]:5392``; a bare ``::1`` is taken as a host).
    Targets with a gRPC scheme (``dns:///host:port``, ``unix:/path``) are used as they are.
    Raises ValueError for an empty host or a port that is not 1..65535.
    """
    text = server.strip()
    if "://" in text or text.startswith(_GRPC_SCHEMES):
        return text
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[: end + 1], text[end + 1 :]
        if end < 2 or (rest and not rest.startswith(":")):
            raise ValueError(f"{server!r} is not [IPV6]:PORT")
        port = rest[1:] if rest else str(DEFAULT_PORT)
    elif text.count(":") > 1:
        host, port = f"[{text}]", str(DEFAULT_PORT)
    else:
        host, sep, port = text.partition(":")
        if not sep:
            port = str(DEFAULT_PORT)
        if not host:
            raise ValueError(f"{server!r} has no host (HOST or HOST:PORT)")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{server!r}: the port must be a number from 1 to 65535")
    return f"{host}:{int(port)}"


class ClientError(Exception):
    """The server answered with an error status (or could not be reached)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


def _error(exc: grpc.RpcError) -> ClientError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return ClientError(code, details or code.name)


def _read(option: str, path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(option, f"cannot read {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class Tls:
    """TLS to the daemons: the CA (PEM) their certificates are verified with (None: the
    system's roots), and for mutual TLS this client's certificate and key (PEM)."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InvalidArgument(
                "cert_file", "a client certificate needs its key, and a key its certificate"
            )

    @classmethod
    def from_files(
        cls,
        ca_file: str | Path | None = None,
        cert_file: str | Path | None = None,
        key_file: str | Path | None = None,
    ) -> Tls:
        """Read the PEM files; one that cannot be read is an InvalidArgument naming it."""
        return cls(
            _read("ca_file", ca_file) if ca_file else None,
            _read("cert_file", cert_file) if cert_file else None,
            _read("key_file", key_file) if key_file else None,
        )

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)


def _hosts_of(target: str) -> list[str]:
    """The hosts a gRPC target dials (a Unix socket is ``localhost``)."""
    if target.startswith(("unix:", "unix-abstract:")):
        return ["localhost"]
    if "://" in target:  # dns:///host:port, dns://resolver/host:port
        target = target.split("://", 1)[1].rsplit("/", 1)[-1]
    hosts = []
    for part in target.removeprefix("ipv4:").removeprefix("ipv6:").split(","):
        if part.startswith("["):
            hosts.append(part[1 : part.find("]")])
        else:
            hosts.append(part.rpartition(":")[0] if ":" in part else part)
    return hosts


def _token_metadata(
    address: str, tls: Tls | None, token: str | None
) -> tuple[tuple[str, str], ...]:
    """The metadata that carries ``token`` to ``address``: refused without TLS unless the
    address is loopback. Sent with each call rather than as call credentials, which gRPC allows
    over TLS only: one way for both."""
    if not token:
        return ()
    if tls is None and not all(is_loopback(h) for h in _hosts_of(address)):
        raise InvalidArgument(
            "token",
            f"a bearer token is sent only over TLS or to a loopback address, and {address} is "
            "neither: give the daemon's CA (--ca-file, PELOTON_CA_FILE)",
        )
    return (("authorization", f"Bearer {token}"),)


@dataclass(frozen=True)
class _Daemon:
    """One daemon's channel, stubs and the metadata every call sends it."""

    address: str
    channel: grpc.Channel
    metadata: tuple[tuple[str, str], ...]
    jobs: job_pb2_grpc.JobServiceStub
    pools: pool_pb2_grpc.PoolServiceStub
    hosts: host_pb2_grpc.HostServiceStub
    audit: audit_pb2_grpc.AuditServiceStub
    sweeps: sweep_pb2_grpc.SweepServiceStub

    @classmethod
    def open(cls, address: str, tls: Tls | None, token: str | None) -> _Daemon:
        metadata = _token_metadata(address, tls, token)
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        if tls is None:
            channel = grpc.insecure_channel(address, options=options)
        else:
            channel = grpc.secure_channel(address, tls.credentials(), options=options)
        return cls(
            address,
            channel,
            metadata,
            job_pb2_grpc.JobServiceStub(channel),
            pool_pb2_grpc.PoolServiceStub(channel),
            host_pb2_grpc.HostServiceStub(channel),
            audit_pb2_grpc.AuditServiceStub(channel),
            sweep_pb2_grpc.SweepServiceStub(channel),
        )


# A daemon that is gone (UNAVAILABLE) or does not answer within the call's timeout (frozen: a
# stopped process, a stalled machine) is left for the next one.
_FAILOVER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def _unsent(error: ClientError) -> bool:
    """Whether an UNAVAILABLE call never reached a daemon: gRPC could not connect (as opposed to
    a connection lost with the request sent, whose reply may be all that was lost)."""
    return error.details.startswith("failed to connect to all addresses")


class PelotonClient:
    """Typed methods for every RPC; ``timeout`` (seconds) bounds each unary call (each attempt,
    when one fails over). ``server`` is ``HOST[:PORT]`` (port 5392 by default) or several of them
    separated by commas, else PELOTON_SERVER, else 127.0.0.1:5392. ``tls``: connect over TLS
    (see :class:`Tls`); ``token``: a bearer token sent with every call (over TLS or to a loopback
    address only: InvalidArgument otherwise)."""

    def __init__(
        self,
        server: str | None = None,
        *,
        timeout: float = 30.0,
        tls: Tls | None = None,
        token: str | None = None,
    ) -> None:
        self.addresses = server_addresses(server or default_server())
        self.server = ",".join(self.addresses)
        self.timeout = timeout
        self._daemons = [_Daemon.open(address, tls, token) for address in self.addresses]
        self._current = 0  # the daemon that answered last: calls start there

    @property
    def current(self) -> str:
        """The address calls go to first now (the one that answered last)."""
        return self._daemons[self._current].address

    def close(self) -> None:
        for daemon in self._daemons:
            daemon.channel.close()

    def __enter__(self) -> PelotonClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ jobs

    def create_job(self, spec: job_pb2.JobSpec, request_id: str = "") -> job_pb2.Job:
        return self.create_job_ex(spec, request_id).job

    def create_job_ex(
        self, spec: job_pb2.JobSpec, request_id: str = ""
    ) -> job_pb2.CreateJobResponse:
        """CreateJob with the full response (``created`` tells a retry from a new job).

        With several addresses and no ``request_id``, the client makes one up for this call, so
        that a retry on the next daemon after a lost reply finds the job instead of making a
        second; a job found under it was made by this call, so ``created`` is then true."""
        made_up = not request_id and len(self._daemons) > 1
        if made_up:
            request_id = f"client-{uuid.uuid4().hex}"
        request = job_pb2.CreateJobRequest(spec=spec, request_id=request_id)
        response = self._call(lambda d: d.jobs.CreateJob, request)
        if made_up:
            response.created = True
        return response

    def get_job(self, job_id: str) -> job_pb2.Job:
        return self._call(lambda d: d.jobs.GetJob, job_pb2.GetJobRequest(job_id=job_id)).job

    def list_jobs(
        self,
        *,
        states: Sequence[job_pb2.JobState.ValueType] = (),
        pool: str = "",
        name_prefix: str = "",
        labels: Mapping[str, str] | None = None,
        page_size: int = 0,
        page_token: str = "",
    ) -> job_pb2.ListJobsResponse:
        """One page of jobs, newest first; pass ``next_page_token`` back for the next one."""
        request = job_pb2.ListJobsRequest(
            states=states,
            pool=pool,
            name_prefix=name_prefix,
            labels=labels or {},
            page_size=page_size,
            page_token=page_token,
        )
        return self._call(lambda d: d.jobs.ListJobs, request)

    def iter_jobs(self, **filters: object) -> Iterator[job_pb2.Job]:
        """Every job matching the filters of :meth:`list_jobs`, across pages."""
        token = ""
        while True:
            page = self.list_jobs(page_token=token, **filters)  # type: ignore[arg-type]
            yield from page.jobs
            token = page.next_page_token
            if not token:
                return

    def kill_job(self, job_id: str, message: str = "") -> job_pb2.Job:
        request = job_pb2.KillJobRequest(job_id=job_id, message=message)
        return self._call(lambda d: d.jobs.KillJob, request).job

    def restart_job(self, job_id: str, message: str = "") -> job_pb2.Job:
        """Restart the job. Not idempotent (a second restart would start the new attempts over):
        with several addresses it fails over only when the daemon could not be reached at all."""
        request = job_pb2.RestartJobRequest(job_id=job_id, message=message)
        return self._call(lambda d: d.jobs.RestartJob, request, resend=False).job

    def delete_job(self, job_id: str) -> None:
        self._call(lambda d: d.jobs.DeleteJob, job_pb2.DeleteJobRequest(job_id=job_id))

    def watch_job(self, job_id: str, after_sequence: int = 0) -> Iterator[job_pb2.WatchJobResponse]:
        """The job's events as they happen, ending when the job is terminal.

        With several addresses, a stream that fails UNAVAILABLE or ends before the job did (its
        daemon died or stopped) resumes on the next daemon after the last event passed on; each
        address is tried at most once between two events."""
        last = after_sequence
        index = self._current
        tried = 0  # daemons tried since the last event
        while True:
            daemon = self._daemons[index]
            stream = daemon.jobs.WatchJob(
                job_pb2.WatchJobRequest(job_id=job_id, after_sequence=last),
                metadata=daemon.metadata,
            )
            terminal = False
            try:
                for update in stream:
                    self._current, tried = index, 0
                    last = update.event.sequence
                    terminal = update.job_state in _TERMINAL
                    yield update
            except grpc.RpcError as exc:
                error = _error(exc)
                tried += 1
                if error.code != grpc.StatusCode.UNAVAILABLE or tried >= len(self._daemons):
                    raise error from None
            else:
                tried += 1
                if terminal or tried >= len(self._daemons):
                    return
            finally:
                stream.cancel()
            index = (index + 1) % len(self._daemons)

    # ------------------------------------------------------------------ tasks

    def get_task(self, job_id: str, instance_id: int) -> job_pb2.GetTaskResponse:
        request = job_pb2.GetTaskRequest(job_id=job_id, instance_id=instance_id)
        return self._call(lambda d: d.jobs.GetTask, request)

    def list_tasks(
        self,
        job_id: str,
        *,
        states: Sequence[job_pb2.TaskState.ValueType] = (),
        page_size: int = 0,
        page_token: str = "",
    ) -> job_pb2.ListTasksResponse:
        request = job_pb2.ListTasksRequest(
            job_id=job_id, states=states, page_size=page_size, page_token=page_token
        )
        return self._call(lambda d: d.jobs.ListTasks, request)

    def iter_tasks(
        self, job_id: str, *, states: Sequence[job_pb2.TaskState.ValueType] = ()
    ) -> Iterator[job_pb2.Task]:
        token = ""
        while True:
            page = self.list_tasks(job_id, states=states, page_token=token)
            yield from page.tasks
            token = page.next_page_token
            if not token:
                return

    # ------------------------------------------------------------------ pools

    def create_pool(self, spec: pool_pb2.PoolSpec) -> pool_pb2.Pool:
        return self._call(lambda d: d.pools.CreatePool, pool_pb2.CreatePoolRequest(spec=spec)).pool

    def update_pool(self, spec: pool_pb2.PoolSpec) -> pool_pb2.Pool:
        """Replace a pool's spec (kinds left out go back to their defaults)."""
        return self._call(lambda d: d.pools.UpdatePool, pool_pb2.UpdatePoolRequest(spec=spec)).pool

    def delete_pool(self, path: str) -> None:
        self._call(lambda d: d.pools.DeletePool, pool_pb2.DeletePoolRequest(path=path))

    def get_pool(self, path: str) -> pool_pb2.Pool:
        return self._call(lambda d: d.pools.GetPool, pool_pb2.GetPoolRequest(path=path)).pool

    def list_pools(self) -> list[pool_pb2.Pool]:
        """The whole pool tree, parents before children, starting with the root ``/``."""
        return list(self._call(lambda d: d.pools.ListPools, pool_pb2.ListPoolsRequest()).pools)

    # ------------------------------------------------------------------ hosts

    def list_hosts(self, states: Sequence[str] = ()) -> list[host_pb2.Host]:
        request = host_pb2.ListHostsRequest(states=list(states))
        return list(self._call(lambda d: d.hosts.ListHosts, request).hosts)

    def get_host(self, hostname: str) -> host_pb2.Host:
        request = host_pb2.GetHostRequest(hostname=hostname)
        return self._call(lambda d: d.hosts.GetHost, request).host

    def drain_host(self, hostname: str) -> host_pb2.Host:
        request = host_pb2.DrainHostRequest(hostname=hostname)
        return self._call(lambda d: d.hosts.DrainHost, request).host

    def undrain_host(self, hostname: str) -> host_pb2.Host:
        request = host_pb2.UndrainHostRequest(hostname=hostname)
        return self._call(lambda d: d.hosts.UndrainHost, request).host

    def get_task_logs(
        self,
        job_id: str,
        instance_id: int,
        *,
        stderr: bool = False,
        offset: int = 0,
        attempt: int = 0,
        previous: bool = False,
    ) -> host_pb2.GetTaskLogsResponse:
        """A piece of a task's stdout (or stderr) from ``offset``, read from its agent: of
        ``attempt`` (1, 2, ...), of the attempt before the current one (``previous``), or of the
        latest attempt that reached a host."""
        request = host_pb2.GetTaskLogsRequest(
            job_id=job_id,
            instance_id=instance_id,
            stderr=stderr,
            offset=offset,
            attempt=attempt,
            previous=previous,
        )
        return self._call(lambda d: d.hosts.GetTaskLogs, request)

    def get_task_gpus(
        self, job_id: str, instance_id: int, *, attempt: int = 0
    ) -> host_pb2.GetTaskGpusResponse:
        """The host indices of the GPUs a task sees, as it reported them into its sandbox (read
        from its agent): of ``attempt`` (1, 2, ...), or of the latest attempt that reached a
        host. ``reported`` false: ``reason`` says why they are not known."""
        request = host_pb2.GetTaskGpusRequest(
            job_id=job_id, instance_id=instance_id, attempt=attempt
        )
        return self._call(lambda d: d.hosts.GetTaskGpus, request)

    # ------------------------------------------------------------------ sweeps

    def submit_sweep(self, spec: sweep_pb2.SweepSpec) -> sweep_pb2.Sweep:
        request = sweep_pb2.SubmitSweepRequest(spec=spec)
        # Not idempotent: sent again only where it never reached a daemon.
        return self._call(lambda d: d.sweeps.SubmitSweep, request, resend=False).sweep

    def get_sweep(self, sweep_id: str) -> sweep_pb2.Sweep:
        request = sweep_pb2.GetSweepRequest(sweep_id=sweep_id)
        return self._call(lambda d: d.sweeps.GetSweep, request).sweep

    def list_sweeps(self) -> list[sweep_pb2.Sweep]:
        request = sweep_pb2.ListSweepsRequest()
        return list(self._call(lambda d: d.sweeps.ListSweeps, request).sweeps)

    def list_trials(self, sweep_id: str) -> list[sweep_pb2.Trial]:
        """The sweep's trials, best first."""
        request = sweep_pb2.ListTrialsRequest(sweep_id=sweep_id)
        return list(self._call(lambda d: d.sweeps.ListTrials, request).trials)

    def kill_sweep(self, sweep_id: str, message: str = "") -> sweep_pb2.Sweep:
        request = sweep_pb2.KillSweepRequest(sweep_id=sweep_id, message=message)
        return self._call(lambda d: d.sweeps.KillSweep, request).sweep

    # ------------------------------------------------------------------ audit

    def list_audit_records(
        self,
        *,
        user: str = "",
        method: str = "",
        target: str = "",
        code: str = "",
        since: datetime | None = None,
        until: datetime | None = None,
        page_size: int = 0,
        page_token: str = "",
    ) -> audit_pb2.ListAuditRecordsResponse:
        """One page of the audit trail's records, newest first; pass ``next_page_token`` back
        for the next one. ``method`` is a full method name or an RPC's name (KillJob), ``code``
        a status code's name; ``since`` (inclusive) and ``until`` (exclusive) are aware
        datetimes."""
        request = audit_pb2.ListAuditRecordsRequest(
            user=user,
            method=method,
            target=target,
            code=code,
            page_size=page_size,
            page_token=page_token,
        )
        if since is not None:
            request.since.FromDatetime(since)
        if until is not None:
            request.until.FromDatetime(until)
        return self._call(lambda d: d.audit.ListAuditRecords, request)

    # ------------------------------------------------------------------ plumbing

    def _call(
        self,
        method: Callable[[_Daemon], Callable[..., R]],
        request: object,
        *,
        resend: bool = True,
    ) -> R:
        """``method`` of the daemon that answered last, then of the next ones in turn while the
        call fails UNAVAILABLE or DEADLINE_EXCEEDED (each daemon once); the last error is
        raised. ``resend`` false: only while the daemon could not be connected to (the request
        never left)."""
        count = len(self._daemons)
        start = self._current
        for attempt in range(count):
            index = (start + attempt) % count
            try:
                daemon = self._daemons[index]
                result = method(daemon)(request, timeout=self.timeout, metadata=daemon.metadata)
            except grpc.RpcError as exc:
                error = _error(exc)
                retry = (resend and error.code in _FAILOVER) or (
                    error.code == grpc.StatusCode.UNAVAILABLE and _unsent(error)
                )
                if not retry or attempt == count - 1:
                    raise error from None
                continue
            self._current = index
            return result
        raise AssertionError("unreachable: a client has at least one address")
