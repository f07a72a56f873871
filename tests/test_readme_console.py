"""README's "Web console" runs as written: its shell block, read from README.md, typed into one
bash (as in tests/test_readme_using.py: a checkout without the virtualenv on PATH, a fresh HOME)
against a ``peloton server`` process on a minicluster, with ``$JOB`` a running gang's id.

The README's console is at the default port 8392: here it is the port the kernel gave the daemon
(read from its port file), put in the block's text in place of 8392.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon import Peloton, start_minicluster, wait_for
from test_readme_using import ROOT, Shell, shell_env  # noqa: F401  (shell_env: a fixture)

from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2

README_PORT = "8392"


def section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("\n## Web console\n", 1)[1].split("\n## ", 1)[0]


def block() -> str:
    """The section's only ``sh`` block."""
    found = re.findall(r"^```(\w*)\n(.*?)^```$", section(), flags=re.S | re.M)
    assert [lang for lang, _ in found] == ["sh"], found
    return found[0][1]


def answers(out: str) -> list[Any]:
    """The JSON documents ``out`` holds, in order (each curl prints one)."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    rest = out.strip()
    while rest:
        document, end = decoder.raw_decode(rest)
        found.append(document)
        rest = rest[end:].lstrip()
    return found


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    agent = AgentSpec("agent-0", resources="cpus:4;mem:4096;disk:10000;gpus:2;ports:[31000-31100]")
    mc = start_minicluster([agent], tmp_path / "cluster")
    yield mc
    mc.stop()


def test_the_readme_names_the_default_port_and_the_screenshot() -> None:
    assert f"http://127.0.0.1:{README_PORT}/" in section()
    shot = re.search(r"!\[[^]]*\]\(([^)]+)\)", section())
    assert shot is not None and (ROOT / shot.group(1)).stat().st_size > 10_000, shot


# The console does not depend on the database; one backend is enough for the README's text.
@pytest.mark.parametrize("backend", ["sqlite"])
def test_web_console_block_runs_as_written(
    peloton: Peloton,
    shell_env: tuple[Path, dict[str, str], int],  # noqa: F811
) -> None:
    clone, env, _ = shell_env
    job = peloton.submit("sleep 600", 2)
    peloton.wait_running(job)
    console = peloton.proc.console_port
    assert console > 0, "the daemon serves no console"
    text = block().replace(f"127.0.0.1:{README_PORT}", f"127.0.0.1:{console}")
    assert text.count(f"127.0.0.1:{console}") == 3, text
    shell = Shell(clone, {**env, "JOB": job})

    def state() -> str:
        return peloton.describe(job)

    try:
        out = shell.run(text, state)
    finally:
        shell.close()
    session, jobs, killed = answers(out)
    assert session["anonymous"] is True and session["caller"] == "", session
    assert [j["id"] for j in jobs["jobs"]] == [job], jobs
    assert jobs["jobs"][0]["state"] == "RUNNING", jobs
    assert killed["job"]["id"] == job and killed["job"]["goal"] == "KILL", killed

    def gone() -> bool:
        return peloton.client.get_job(job).state == job_pb2.JOB_STATE_KILLED

    wait_for(gone, 30, f"job {job} KILLED after the console's kill", 0.1, state)
