"""README's "Using it" runs as written: its shell blocks, read from README.md, typed in order into
one bash (as a user would, background jobs and shell variables carrying over) in a checkout
without the virtualenv on PATH, with a fresh HOME, on SQLite and the examples' minicluster.

Between blocks the test waits for what the README's text says to wait for (the hosts known, the
sweep RUNNING, the sweep KILLED). The fixed ports the README uses are replaced by ports the kernel
picked: the master's (``5050`` in the text) and the daemon's, given as ``PELOTON_GRPC_PORT``,
``PELOTON_METRICS_PORT``, ``PELOTON_CONSOLE_PORT`` and ``PELOTON_SERVER`` (the README leaves them
at their defaults). The PostgreSQL block names another host and is not run here (``make test``
covers PostgreSQL).
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from daemon import ROOT, free_port, wait_for
from test_examples import FINAL_LOSS, RACK, SWEEP_RATES, agents, wait_for_log

from peloton.client import ClientError, PelotonClient
from peloton.v1 import job_pb2

BLOCK_TIMEOUT = 120.0
MASTER_PORT = "5050"  # the README's master port, replaced by a free one


def section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]


def blocks() -> list[str]:
    """The text of every ``sh`` block of the section, in order."""
    found = re.findall(r"^```(\w*)\n(.*?)^```$", section(), flags=re.S | re.M)
    assert {lang for lang, _ in found} == {"sh"}, found
    return [text for _, text in found]


# What each block does, in order; the PostgreSQL one (last) is for another host.
BLOCKS = ("activate", "start", "job", "sweep", "borrow", "stop", "postgresql")


def test_every_block_is_run_here_but_postgresql() -> None:
    texts = blocks()
    assert len(texts) == len(BLOCKS), texts
    assert texts[0].strip() == ". .venv/bin/activate"
    assert "db.example" in texts[-1] and "another host" in section().split(texts[-2])[1]


class Shell:
    """One bash reading commands from a pipe, its output and its jobs' merged into one stream."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the background jobs too: stopped as one group at the end
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.output = b""
        self.blocks = 0
        # Every command must succeed (the README never shows one that fails).
        self.send("set -e\n")

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def run(self, block: str, state: Callable[[], object]) -> str:
        """Type ``block``, then wait for its commands to have run; returns what they printed
        (the background jobs' lines included). ``state()`` is shown on a timeout."""
        self.blocks += 1
        marker = f"@@ block {self.blocks} done"
        start = len(self.output)
        self.send(f"{block}echo '{marker}'\n")
        deadline = time.monotonic() + BLOCK_TIMEOUT
        while marker.encode() not in self.output[start:]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"block {self.blocks} did not finish in {BLOCK_TIMEOUT:g}s:\n{block}\n"
                    f"printed:\n{self.output[start:].decode(errors='replace')}\n"
                    f"the state then: {state()}"
                )
            if not self.selector.select(timeout=min(left, 0.5)):
                continue
            assert self.proc.stdout is not None
            piece = os.read(self.proc.stdout.fileno(), 65536)
            if not piece:
                raise AssertionError(
                    f"the shell exited ({self.proc.wait()}) in block {self.blocks}:\n{block}\n"
                    f"printed:\n{self.output[start:].decode(errors='replace')}"
                )
            self.output += piece
        return self.output[start:].decode(errors="replace").replace(marker + "\n", "")

    def close(self) -> None:
        """End the shell; whatever it left running gets SIGTERM (the minicluster then kills its
        tasks), then SIGKILL."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=20)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc.wait()
        self.selector.close()


@pytest.fixture
def shell_env(tmp_path: Path) -> tuple[Path, dict[str, str], int]:
    """A checkout (its examples and virtualenv), the environment of a user who has not activated
    the virtualenv, with a fresh HOME, and the daemon's gRPC port."""
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "examples").symlink_to(ROOT / "examples")
    (clone / ".venv").symlink_to(sys.prefix)
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PELOTON_", "VIRTUAL_ENV"))}
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if p and p != venv_bin)
    for name in ("home", "tmp"):
        (tmp_path / name).mkdir()
    env.update(HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path / "tmp"))
    env.pop("XDG_DATA_HOME", None)
    grpc = free_port()
    env.update(
        PELOTON_GRPC_PORT=str(grpc),
        PELOTON_METRICS_PORT=str(free_port()),
        PELOTON_CONSOLE_PORT="0",
        PELOTON_SERVER=f"127.0.0.1:{grpc}",
    )
    return clone, env, grpc


def jobs_summary(client: PelotonClient) -> str:
    """Every job's name, state and reason: what a block that timed out shows."""
    try:
        return "; ".join(
            f"{j.spec.name} {job_pb2.JobState.Name(j.state)} {j.reason} {j.message}"
            for j in client.iter_jobs()
        )
    except ClientError as exc:
        return f"the daemon does not answer: {exc}"


def wait_for_hosts(client: PelotonClient, state: Callable[[], object]) -> None:
    """Until the daemon knows every host of the examples' cluster (``state`` on timeout)."""

    def known() -> bool:
        try:
            return len(client.list_hosts()) == len(agents())
        except ClientError:
            return False  # not serving yet

    wait_for(known, 30, "the daemon to know the five hosts", 0.1, state)


def job_named(client: PelotonClient, name: str) -> job_pb2.Job:
    (job,) = [j for j in client.iter_jobs() if j.spec.name == name]
    return job


def test_using_it_runs_as_written(shell_env: tuple[Path, dict[str, str], int]) -> None:
    clone, env, grpc = shell_env
    texts = dict(zip(BLOCKS, blocks(), strict=True))
    master = str(free_port())
    start = texts["start"]
    assert f"--port {MASTER_PORT} " in start and f"--mesos-master 127.0.0.1:{MASTER_PORT} " in start
    assert start.count(MASTER_PORT) == 2, start
    texts["start"] = start.replace(MASTER_PORT, master)
    client = PelotonClient(f"127.0.0.1:{grpc}", timeout=10)
    shell = Shell(clone, env)

    def jobs() -> str:
        return jobs_summary(client)

    try:
        shell.run(texts["activate"], jobs)
        out = shell.run(texts["start"], jobs)
        db = Path(env["HOME"]) / ".local/share/peloton/peloton.db"
        assert f"sqlite:///{db}: upgraded from empty to " in out, out

        # "Once `peloton host list` shows the five hosts"
        wait_for_hosts(client, jobs)

        out = shell.run(texts["job"], jobs)
        job = job_named(client, "logreg-4gpu")
        assert job.state == job_pb2.JOB_STATE_SUCCEEDED, jobs()
        assert re.search(rf"^{job.job_id}\s+logreg-4gpu\s", out, re.M), out  # job list
        assert re.search(rf"^Job:\s+{job.job_id}$", out, re.M), out  # job get
        assert re.search(r"^\S+ \S+\s+job\s+RUNNING -> SUCCEEDED$", out, re.M), out  # watch
        tasks = client.list_tasks(job.job_id).tasks
        (host,) = {t.current.host for t in tasks}
        assert RACK[host] == "r1" and len(tasks) == 4, tasks
        for i in range(4):  # task list
            assert re.search(rf"^{i}\s+SUCCEEDED\s+1\s+{host}\s", out, re.M), out
        assert re.search(rf"^rank 0/4 step 300 loss {FINAL_LOSS}", out, re.M), out
        assert f"rank 0 done: final loss {FINAL_LOSS}" in out, out

        shell.run(texts["sweep"], jobs)
        sweep = job_named(client, "logreg-sweep")

        # "Once its tasks are RUNNING and have logged their first step"
        def running() -> bool:
            states = {t.state for t in client.list_tasks(sweep.job_id).tasks}
            return states == {job_pb2.TASK_STATE_RUNNING}

        wait_for(running, 60, "every trial of the sweep RUNNING", 0.1, jobs)
        for i, rate in enumerate(SWEEP_RATES):
            wait_for_log(client, sweep.job_id, i, f"trial {i} lr {rate} step 0 loss")
        out = shell.run(texts["borrow"], jobs)
        assert re.search(r"^├─ llm .*▽ lends 8 *$", out, re.M), out
        assert re.search(r"^   └─ vision +gpu +4 +\S+ +8 .*▲ borrows 4 *$", out, re.M), out
        assert "trial 3 lr 0.3 step 0 loss 0.693147" in out, out

        # "When it is KILLED"
        wait_for(
            lambda: client.get_job(sweep.job_id).state == job_pb2.JOB_STATE_KILLED,
            30,
            "the sweep KILLED",
            0.1,
            jobs,
        )
        out = shell.run(texts["stop"], jobs)
        # Both exited 0 (`wait` would have ended the shell otherwise), the server first.
        assert out.rstrip().endswith("minicluster stopped"), out
        everything = shell.output.decode(errors="replace")
        assert f"minicluster master at 127.0.0.1:{master} with 5 agents" in everything, everything
        with pytest.raises(ClientError):
            client.list_hosts()  # the daemon is gone
    finally:
        client.close()
        shell.close()
