"""The daemon as a real process: persistence across restarts and crashes, refusing an
unmigrated database, graceful shutdown, and configuration precedence."""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from daemon import (
    DaemonProcess,
    error_line,
    free_port,
    health_status,
    run_peloton,
    wait_for,
)
from grpc_health.v1 import health_pb2
from support import make_spec

from peloton.client import PelotonClient
from peloton.jobmgr.manager import JobManager
from peloton.storage.db import Database
from peloton.v1 import job_pb2

J = job_pb2


def serve_args(db_url: str, data_dir: Path) -> list[str]:
    return [
        "--db-url",
        db_url,
        "--data-dir",
        str(data_dir),
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
    ]


def snapshot(client: PelotonClient, db_url: str) -> dict[str, Any]:
    """Everything the daemon knows about its jobs: jobs, tasks with history, task events (over
    the API) and every event row (from the database)."""
    jobs = sorted(client.iter_jobs(), key=lambda j: j.job_id)
    out: dict[str, Any] = {"jobs": [j.SerializeToString(deterministic=True) for j in jobs]}
    db = Database.from_url(db_url)
    try:
        reader = JobManager(db)
        for j in jobs:
            tasks = list(client.iter_tasks(j.job_id))
            out[f"tasks {j.job_id}"] = [t.SerializeToString(deterministic=True) for t in tasks]
            for t in tasks:
                events = client.get_task(j.job_id, t.instance_id).events
                out[f"events {j.job_id}/{t.instance_id}"] = [e.sequence for e in events]
            out[f"all events {j.job_id}"] = reader.job_events(j.job_id)
    finally:
        db.dispose()
    return out


def settle(client: PelotonClient) -> None:
    """Wait until the resource manager has said why every PENDING job waits."""

    def unexplained() -> list[str]:
        return [
            j.job_id
            for j in client.iter_jobs()
            if j.state == J.JOB_STATE_PENDING and j.reason != "no_hosts"
        ]

    def states() -> list[str]:
        return [
            f"{j.job_id} {J.JobState.Name(j.state)} {j.reason}: {j.message}"
            for j in client.iter_jobs()
        ]

    wait_for(
        lambda: not unexplained() or None, 10, "every pending job has its reason", state=states
    )


def test_jobs_tasks_and_events_survive_a_restart(db_url: str, tmp_path: Path) -> None:
    args = serve_args(db_url, tmp_path / "data")
    with DaemonProcess(tmp_path / "first", args) as first:
        first.wait_ready()
        with PelotonClient(first.address, timeout=10) as client:
            pending = client.create_job_ex(make_spec(3, name="pending"), request_id="req-1")
            assert pending.created
            killed = client.create_job(make_spec(2, name="killed")).job_id
            client.kill_job(killed, message="stop it")
            restarted = client.create_job(make_spec(2, name="restarted")).job_id
            client.kill_job(restarted)
            client.restart_job(restarted, message="again")
            settle(client)
            before = snapshot(client, db_url)
            killed_history = list(client.watch_job(killed))
        assert first.terminate() == 0

    assert len(before["jobs"]) == 3
    assert len(before[f"all events {killed}"]) == 4  # created, 2 tasks killed, job killed

    with DaemonProcess(tmp_path / "second", args) as second:
        second.wait_ready()
        with PelotonClient(second.address, timeout=10) as client:
            after = snapshot(client, db_url)
            assert after == before
            assert list(client.watch_job(killed)) == killed_history
            task = client.get_task(restarted, 1).task
            assert task.current.attempt == 2
            assert [a.state for a in task.history] == [J.TASK_STATE_KILLED]
            # The request id still finds its job, and sequences go on from where they were.
            again = client.create_job_ex(make_spec(3, name="pending"), request_id="req-1")
            assert not again.created
            assert again.job.job_id == pending.job.job_id
            new = client.create_job(make_spec(1, name="new")).job_id
            first_new = next(iter(client.watch_job(new)))
            last_old = max(e.sequence for k, v in before.items() if k.startswith("all ") for e in v)
            assert first_new.event.sequence > last_old
        assert second.terminate() == 0


def test_sigkill_loses_nothing_acknowledged(db_url: str, tmp_path: Path) -> None:
    args = serve_args(db_url, tmp_path / "data")
    acknowledged: dict[str, int] = {}
    with DaemonProcess(tmp_path / "first", args) as first:
        first.wait_ready()
        with PelotonClient(first.address, timeout=10) as client:
            for i in range(12):
                job = client.create_job(make_spec(2, name=f"job-{i}"), request_id=f"r-{i}")
                acknowledged[job.job_id] = job.state
                if i % 3 == 0:
                    acknowledged[job.job_id] = client.kill_job(job.job_id).state
            # Crash right after the last acknowledgement.
            assert first.kill() == -9

    killed_count = sum(1 for s in acknowledged.values() if s == J.JOB_STATE_KILLED)
    assert killed_count == 4

    with DaemonProcess(tmp_path / "second", args) as second:
        second.wait_ready()
        with PelotonClient(second.address, timeout=10) as client:
            found = {j.job_id: j.state for j in client.iter_jobs()}
            assert found == acknowledged
            for job_id, state in acknowledged.items():
                expected = "KILLED" if state == J.JOB_STATE_KILLED else "PENDING"
                tasks = list(client.iter_tasks(job_id))
                assert [J.TaskState.Name(t.state) for t in tasks] == [f"TASK_STATE_{expected}"] * 2
        assert second.terminate() == 0


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    return str(request.getfixturevalue("pg_empty_url"))


def test_refuses_an_unmigrated_database_until_upgraded(empty_db_url: str, tmp_path: Path) -> None:
    args = serve_args(empty_db_url, tmp_path / "data")
    with DaemonProcess(tmp_path / "refused", args) as refused:
        code = refused.wait_exit(timeout=30)
        assert code != 0
        assert not refused.port_file.exists()
        stderr = refused.stderr
        assert "Traceback" not in stderr
        lines = stderr.splitlines()
        assert len(lines) == 1, stderr
        assert lines[0].startswith("error: ")
        assert "peloton db upgrade" in lines[0]

    upgraded = run_peloton("db", "upgrade", "--db-url", empty_db_url, timeout=60)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "upgraded from empty to" in upgraded.stdout
    again = run_peloton("db", "upgrade", "--db-url", empty_db_url, timeout=60)
    assert again.returncode == 0, again.stderr
    assert "already at revision" in again.stdout

    with DaemonProcess(tmp_path / "started", args) as started:
        started.wait_ready()
        assert health_status(started.grpc_port) == health_pb2.HealthCheckResponse.SERVING
        assert started.terminate() == 0


# tgkill(2) by architecture: signals one thread of another process. os.kill signals the process
# and leaves the kernel to pick a thread, usually (not always) the main one.
TGKILL = {"x86_64": 234, "aarch64": 131}


def tgkill(pid: int, tid: int, signum: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(TGKILL[platform.machine()], pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {signum})")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_sigterm_that_lands_on_any_thread_stops_the_daemon(db_url: str, tmp_path: Path) -> None:
    """The kernel may hand a process's SIGTERM to any thread that doesn't block it; Python runs
    the handler only on the main thread, which must then not sleep through it (a daemon once
    ignored SIGTERM for more than 10 s on a loaded machine)."""
    with DaemonProcess(tmp_path / "d", serve_args(db_url, tmp_path / "data")) as d:
        d.wait_ready()
        pid = d.proc.pid
        others = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
        assert others, "the daemon runs threads besides its main one"
        tgkill(pid, others[-1], signal.SIGTERM)
        try:
            status = d.wait_exit(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the daemon still runs 30 s after SIGTERM reached its thread {others[-1]}; "
                f"its log:\n{d.stderr}"
            ) from None
        assert status == 0, d.stderr
        assert "signal received" in d.stderr


def test_a_busy_metrics_port_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        url = f"sqlite:///{tmp_path / 'p.db'}"
        assert run_peloton("db", "upgrade", "--db-url", url).returncode == 0
        args = [*serve_args(url, tmp_path / "data"), "--metrics-port", str(port)]
        with DaemonProcess(tmp_path / "d", args) as d:
            assert d.wait_exit(timeout=30) == 1
            lines = d.stderr.splitlines()
            assert lines == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use"]


def test_sigterm_with_an_open_watch_exits_cleanly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    assert run_peloton("db", "upgrade", "--db-url", url).returncode == 0
    with DaemonProcess(tmp_path / "d", serve_args(url, tmp_path / "data")) as d:
        d.wait_ready()
        with PelotonClient(d.address, timeout=10) as client:
            job_id = client.create_job(make_spec(1)).job_id
            received: list[job_pb2.WatchJobResponse] = []
            errors: list[BaseException] = []
            first = threading.Event()

            def watch() -> None:
                try:
                    for update in client.watch_job(job_id):
                        received.append(update)
                        first.set()
                except BaseException as exc:
                    errors.append(exc)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            assert first.wait(10)
            started = time.monotonic()
            code = d.terminate(timeout=10)
            elapsed = time.monotonic() - started
            watcher.join(10)
            assert not watcher.is_alive(), "the watch stream hung after SIGTERM"
        assert code == 0, d.stderr
        assert elapsed < 5, f"shutdown took {elapsed:.1f}s"
        assert [u.event.to_state for u in received] == ["PENDING"]
        # The server closed the stream itself (status OK) before it went away.
        assert errors == []
        assert '"msg": "peloton server stopped"' in d.stderr
        assert "Traceback" not in d.stderr
        # This daemon has no Mesos master: it says so at start, as a warning.
        warned = [line for line in d.stderr.splitlines() if "no Mesos master configured" in line]
        assert len(warned) == 1 and '"level": "warning"' in warned[0], d.stderr


def test_config_file_environment_and_flag_precedence(tmp_path: Path) -> None:
    """Defaults < config file < PELOTON_* environment < flags, seen in the ports the daemon
    listens on and in its log format."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    assert run_peloton("db", "upgrade", "--db-url", url).returncode == 0
    file_port, env_port, flag_port, metrics_port = (free_port() for _ in range(4))
    assert len({file_port, env_port, flag_port, metrics_port}) == 4
    config = tmp_path / "peloton.yaml"
    config.write_text(
        f"db_url: {url}\n"
        f"data_dir: {tmp_path / 'data'}\n"
        f"grpc_port: {file_port}\n"
        f"metrics_port: {metrics_port}\n"
        "log_format: text\n"
    )

    def serve(name: str, args: list[str], env: dict[str, str]) -> tuple[int, int, str]:
        with DaemonProcess(tmp_path / name, ["--config", str(config), *args], env=env) as d:
            d.wait_ready()
            assert health_status(d.grpc_port) == health_pb2.HealthCheckResponse.SERVING
            log = d.stderr
            assert d.terminate() == 0
        first_line = log.splitlines()[0]
        return d.grpc_port, d.metrics_port, "json" if first_line.startswith("{") else "text"

    assert serve("file", [], {}) == (file_port, metrics_port, "text")
    env = {"PELOTON_GRPC_PORT": str(env_port), "PELOTON_LOG_FORMAT": "json"}
    assert serve("env", [], env) == (env_port, metrics_port, "json")
    flags = ["--grpc-port", str(flag_port), "--log-format", "text"]
    assert serve("flag", flags, env) == (flag_port, metrics_port, "text")
    # The config file can also come from the environment.
    with DaemonProcess(tmp_path / "env-config", [], env={"PELOTON_CONFIG": str(config)}) as d:
        d.wait_ready()
        assert (d.grpc_port, d.metrics_port) == (file_port, metrics_port)
        assert d.terminate() == 0


def test_unknown_config_key_is_a_one_line_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("grpc_port: 0\ngrcp_host: 127.0.0.1\n")
    result = run_peloton("server", "--config", str(config), timeout=30)
    assert result.returncode == 2
    line = error_line(result)
    assert line.startswith("error: ")
    assert "grcp_host" in line
    # The daemon never started: nothing else was logged.
    assert result.stdout == ""


def test_unreachable_database_is_a_one_line_error(tmp_path: Path) -> None:
    port = free_port()
    url = f"postgresql://postgres@127.0.0.1:{port}/peloton"
    result = run_peloton("server", *serve_args(url, tmp_path / "data"), timeout=60)
    assert result.returncode != 0
    line = error_line(result)
    assert line.startswith("error: cannot use the database: ")
    assert "Connection refused" in line
