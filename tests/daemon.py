"""Helpers for the API, daemon and CLI tests: a real server in-process or as a process.

Everything here that starts something also stops it: :func:`in_process_server` stops the server
when its ``with`` block ends, and :class:`DaemonProcess` kills its process on ``__exit__`` (and on
:meth:`DaemonProcess.close`) whatever state the test left it in.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from support import make_spec

from peloton.client import PelotonClient
from peloton.config import ServerConfig
from peloton.core.pools import PoolConfig
from peloton.core.records import TaskUpdate
from peloton.core.states import TaskState
from peloton.minicluster import AgentSpec, Minicluster
from peloton.server import Server
from peloton.storage import migrate
from peloton.storage.db import make_engine
from peloton.v1 import job_pb2

ROOT = Path(__file__).resolve().parents[1]
# The console script of the virtualenv running the tests.
PELOTON = str(Path(sys.executable).parent / "peloton")
START_TIMEOUT = 30.0
T = TypeVar("T")

# ---------------------------------------------------------------------------- waiting


def wait_for(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.02,
    state: Callable[[], object] | None = None,
) -> T:
    """Poll ``check`` until it returns something other than None/False, or fail at the deadline
    (with what ``state()`` says then, if given)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            seen = f"; the state then: {state()}" if state is not None else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{seen}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------- specs and databases


def migrated_sqlite_url(directory: Path) -> str:
    """A fresh SQLite database at the newest schema, in ``directory``."""
    url = f"sqlite:///{directory / 'peloton.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    return url


# ---------------------------------------------------------------------------- in-process server


# Leaf pools the API and CLI tests put jobs in (besides /default), parents first.
TEST_POOLS = ("/research", "/research/vision", "/research/nlp", "/vision", "/nlp")


@contextmanager
def in_process_server(
    db_url: str, data_dir: Path, pools: Sequence[str] = TEST_POOLS, **options: Any
) -> Iterator[Server]:
    """A started daemon on loopback (ports picked by the OS) with ``pools`` (no reservations)
    and config ``options``, stopped when the block ends."""
    ports = {"grpc_port": 0, "metrics_port": 0, "console_port": 0}
    config = ServerConfig(db_url=db_url, data_dir=data_dir, **(ports | options))
    server = Server(config)
    server.start()
    try:
        assert server.resmgr is not None
        for path in pools:
            server.resmgr.create_pool(PoolConfig(path))
        yield server
    finally:
        server.stop(grace=1.0)


def drive(
    server: Server,
    job_id: str,
    instances: Sequence[int],
    states: Sequence[TaskState],
    *,
    attempt: int = 1,
) -> None:
    """Move the given tasks of a job through ``states``, one update per state for all of them,
    through the job manager (the interface the host manager uses)."""
    assert server.jobs is not None
    for state in states:
        server.jobs.update_tasks(
            job_id,
            [TaskUpdate(i, attempt, state, host=f"host-{i}") for i in instances],
        )


def address(port: int) -> str:
    return f"127.0.0.1:{port}"


def health_status(port: int, service: str = "", timeout: float = 5.0) -> int:
    with grpc.insecure_channel(address(port)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return int(response.status)


# ---------------------------------------------------------------------------- daemon as a process


class DaemonProcess:
    """``peloton server`` as a child process, with its ports read from a --port-file."""

    def __init__(
        self,
        workdir: Path,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        port_file: bool = True,
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port_file = workdir / "ports"
        self.port_file.unlink(missing_ok=True)
        self.stdout_path = workdir / "stdout.log"
        self.stderr_path = workdir / "stderr.log"
        cmd = [PELOTON, "server", *args]
        if port_file:
            cmd += ["--port-file", str(self.port_file)]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PELOTON_")}
        # The console on a port of the kernel's too (a flag or ``env`` may say otherwise).
        full_env["PELOTON_CONSOLE_PORT"] = "0"
        full_env.update(env or {})
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=full_env, cwd=workdir)
        self.grpc_port = 0
        self.metrics_port = 0
        self.console_port = 0

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    @property
    def address(self) -> str:
        return address(self.grpc_port)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> DaemonProcess:
        """Wait for the port file (written once both ports listen); fail if the process exits.
        A daemon that is not ready in time is killed (the caller may not have kept it to close)."""

        def ready() -> bool:
            if self.port_file.exists():
                return True
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the daemon exited with {self.proc.returncode} before listening:\n"
                    f"{self.stderr}"
                )
            return False

        try:
            wait_for(ready, timeout, "the daemon's port file")
            grpc_port, metrics_port, console_port = self.port_file.read_text().split()
        except BaseException:
            self.close()
            raise
        self.grpc_port, self.metrics_port = int(grpc_port), int(metrics_port)
        self.console_port = int(console_port)
        return self

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait for the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> int:
        """SIGKILL and wait for the exit status."""
        self.proc.kill()
        return self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def run_peloton(
    *args: str,
    server: str | None = None,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the ``peloton`` command to completion (``server`` becomes --server)."""
    cmd = [PELOTON]
    if server is not None:
        cmd += ["--server", server]
    cmd += list(args)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PELOTON_")}
    # Nor the client config file of whoever runs the tests (~/.config/peloton/client.yaml).
    full_env["XDG_CONFIG_HOME"] = "/nonexistent"
    full_env.update(env or {})
    return subprocess.run(
        cmd,
        input=input_text,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd or ROOT,
        check=False,
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed on stderr (asserts it is exactly one, no trace)."""
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{result.stderr}"
    return lines[0]


def start_minicluster(
    agents: Sequence[AgentSpec], work_dir: Path, docker_registry: Path | None = None
) -> Minicluster:
    """A started minicluster on a free port, quick to offer and to re-send updates, whose agents
    offer ports the kernel picked and held for them (no other program on the machine has them);
    with ``docker_registry``, its tasks may run in that registry's images."""
    mc = Minicluster(
        agents,
        port=0,
        work_dir=work_dir,
        allocation_interval=0.1,
        update_retry_interval=1.0,
        free_ports=True,
        docker_registry=docker_registry,
    )
    mc.start()
    return mc


# Metric samples by (name, sorted labels).
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape_metrics(port: int) -> Samples:
    """Every sample a daemon's /metrics endpoint serves now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


DONE = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_KILLED)


class Peloton:
    """A daemon process against the cluster, restartable on the same database.

    ``cluster``: a minicluster or a master's host:port; ``extra_args``: more ``peloton server``
    flags (e.g. ``--mesos-role``)."""

    def __init__(
        self,
        db_url: str,
        cluster: Minicluster | str,
        workdir: Path,
        extra_args: Sequence[str] = (),
    ) -> None:
        master = cluster if isinstance(cluster, str) else cluster.address
        self.args = [
            "--db-url",
            db_url,
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--mesos-master",
            master,
            "--reconcile-interval-seconds",
            "5",
            "--offer-refuse-seconds",
            "1",
            "--log-format",
            "text",
            *extra_args,
        ]
        self.workdir = workdir
        self.runs = 0
        self.proc = self.start()

    def start(self) -> DaemonProcess:
        self.runs += 1
        proc = DaemonProcess(self.workdir / f"run{self.runs}", self.args).wait_ready()
        self.client = PelotonClient(proc.address, timeout=10)
        return proc

    def restart_after_sigkill(self) -> None:
        self.proc.proc.send_signal(signal.SIGKILL)
        self.proc.wait_exit(10)
        self.client.close()
        self.proc = self.start()

    def submit(self, command: str, instances: int, gpu: float = 1, **spec: Any) -> str:
        """Submit a gang (``spec``: more :func:`make_spec` arguments); returns its job id."""
        return self.client.create_job(make_spec(instances, command=command, gpu=gpu, **spec)).job_id

    def wait_running(self, job_id: str, timeout: float = 30) -> None:
        """Until every task of the job is RUNNING (the states shown on timeout)."""
        wait_for(
            lambda: set(task_states(self, job_id).values()) == {"TASK_STATE_RUNNING"},
            timeout,
            "every task RUNNING",
            interval=0.1,
            state=lambda: self.describe(job_id),
        )

    def wait_done(self, job_id: str, timeout: float = 60) -> job_pb2.Job:
        """Until the job ended (the states shown on timeout)."""

        def done() -> job_pb2.Job | None:
            job = self.client.get_job(job_id)
            return job if job.state in DONE else None

        return wait_for(
            done, timeout, f"job {job_id} to end", interval=0.2, state=lambda: self.describe(job_id)
        )

    def describe(self, job_id: str) -> str:
        """The job's state and reason, and each task's state, attempt, host and reason."""
        job = self.client.get_job(job_id)
        tasks = [
            f"{t.instance_id}: {job_pb2.TaskState.Name(t.current.state)} attempt "
            f"{t.current.attempt} on {t.current.host or '-'} {t.current.reason} "
            f"{t.current.message}".rstrip()
            for t in self.client.list_tasks(job_id).tasks
        ]
        return f"job {job_pb2.JobState.Name(job.state)} {job.reason} {job.message}; tasks {tasks}"

    def close(self) -> None:
        self.client.close()
        self.proc.close()


def task_states(p: Peloton, job_id: str) -> dict[int, str]:
    tasks = p.client.list_tasks(job_id).tasks
    return {t.instance_id: job_pb2.TaskState.Name(t.state) for t in tasks}
