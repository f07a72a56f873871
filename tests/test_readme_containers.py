"""README's "Task containers" runs as written: its shell blocks, read from README.md, typed in
order into one bash in the checkout (``make images`` needs it) with the virtualenv active, a
fresh HOME, on SQLite and the examples' minicluster with an image store, as test_readme_using
does for "Using it". The master's port is replaced by a free one, the daemon's ports are given
in the environment."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from daemon import ROOT, free_port
from images_support import build_lock
from test_readme_using import MASTER_PORT, Shell, job_named, jobs_summary, wait_for_hosts

from peloton.client import PelotonClient
from peloton.v1 import job_pb2

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="task containers need root")


def blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Task containers\n", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"^```(\w*)\n(.*?)^```$", section, flags=re.S | re.M)
    assert [lang for lang, _ in found] == ["sh", "sh", "sh"], found
    return [text for _, text in found]


def test_task_containers_run_as_written(tmp_path: Path) -> None:
    start, job, stop = blocks()
    assert start.count(MASTER_PORT) == 2, start
    master = str(free_port())
    grpc = free_port()
    venv_bin = str(ROOT / ".venv" / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PELOTON_", "VIRTUAL_ENV"))}
    env.pop("XDG_DATA_HOME", None)
    (tmp_path / "home").mkdir()
    env.update(
        HOME=str(tmp_path / "home"),
        PATH=f"{venv_bin}:{env.get('PATH', '')}",  # the virtualenv active
        PELOTON_GRPC_PORT=str(grpc),
        PELOTON_METRICS_PORT=str(free_port()),
        PELOTON_CONSOLE_PORT="0",
        PELOTON_SERVER=f"127.0.0.1:{grpc}",
    )
    client = PelotonClient(f"127.0.0.1:{grpc}", timeout=10)
    shell = Shell(ROOT, env)

    def jobs() -> str:
        return jobs_summary(client)

    try:
        with build_lock():  # `make images` builds the runtime bundle in build/
            out = shell.run(start.replace(MASTER_PORT, master), jobs)
        assert "build/images/example:1.tar" in out, out

        # "Once `peloton host list` shows the five hosts"
        wait_for_hosts(client, jobs)
        out = shell.run(job, jobs)
        ran = job_named(client, "container-allreduce")
        assert ran.state == job_pb2.JOB_STATE_SUCCEEDED, jobs()
        assert re.search(r"^\S+ \S+\s+job\s+RUNNING -> SUCCEEDED$", out, re.M), out
        assert re.search(
            r"^Image:\s+example:1 \(entrypoint shell, /dev/shm 256 MiB, runtime peloton at "
            r"/opt/peloton\)$",
            out,
            re.M,
        ), out
        assert re.search(r"^Volume:\s+/scratch <- /tmp \(rw\)$", out, re.M), out
        # Rank 0's log: its own GPU, the host's shared /dev/shm (4 ranks x 256 MiB), the gang.
        assert re.search(r"^rank 0: GPU [0-3], /dev/shm tmpfs\s+1024\s", out, re.M), out
        assert re.search(
            r"^gang rank=0 size=4 local_rank=0 local_size=4 .*local=shm cross=none result=ok$",
            out,
            re.M,
        ), out
        out = shell.run(stop, jobs)
        # Both exited 0 (`wait` would have ended the shell otherwise), the server first.
        assert out.rstrip().endswith("minicluster stopped"), out
    finally:
        client.close()
        shell.close()
