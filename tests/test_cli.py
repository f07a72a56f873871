"""The ``peloton`` command as a subprocess against a real daemon: output, exit codes, errors.

Exit codes: 0 ok; 1 the server refused or could not be reached; 2 usage or validation error.
Every error is one line on stderr (``error: ...``), usage errors included, and no traceback.
"""

from __future__ import annotations

import json
import random
import re
import selectors
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from daemon import (
    PELOTON,
    address,
    drive,
    error_line,
    free_port,
    in_process_server,
    migrated_sqlite_url,
    run_peloton,
)
from support import TO_RUNNING, make_spec

from peloton.cli.output import REASON_WIDTH
from peloton.client import DEFAULT_PORT, PelotonClient, server_address
from peloton.config import ServerConfig
from peloton.core.records import TaskUpdate
from peloton.core.states import TaskState
from peloton.server import Server
from peloton.v1 import job_pb2

J = job_pb2
JOB_YAML = """\
name: resnet
pool: /research/vision
labels: {team: vision}
instances: 2
task:
  command: python train.py
  resources: {cpu: 1, mem_mb: 256, gpu: 1}
"""
CREATED = re.compile(r"^job ([0-9a-f-]{36}) created$")


@dataclass
class Cli:
    """Runs ``peloton --server ADDRESS ...`` against the test's daemon."""

    server: Server
    client: PelotonClient
    workdir: Path

    def __call__(
        self, *args: str, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run_peloton(
            *args, server=address(self.server.grpc_port), input_text=input_text, cwd=self.workdir
        )

    def ok(self, *args: str, input_text: str | None = None) -> str:
        result = self(*args, input_text=input_text)
        assert result.returncode == 0, result.stderr
        assert result.stderr == "", result.stderr
        return result.stdout

    def data(self, *args: str) -> Any:
        """The command's ``-o json`` output, parsed."""
        return json.loads(self.ok(*args, "-o", "json"))

    def job_file(self, text: str = JOB_YAML, name: str = "job.yaml") -> str:
        path = self.workdir / name
        path.write_text(text)
        return str(path)

    def submit(self, text: str = JOB_YAML, *extra: str) -> str:
        out = self.ok("job", "submit", self.job_file(text), *extra).strip()
        match = CREATED.match(out)
        assert match, out
        return match.group(1)


@contextmanager
def serve_cli(db_url: str, tmp_path: Path) -> Iterator[Cli]:
    with (
        in_process_server(db_url, tmp_path / "data") as server,
        PelotonClient(address(server.grpc_port), timeout=10) as client,
    ):
        yield Cli(server, client, tmp_path)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with serve_cli(migrated_sqlite_url(tmp_path), tmp_path) as c:
        yield c


def usage_error(result: subprocess.CompletedProcess[str]) -> str:
    """A click usage error: exit 2, one ``error:`` line naming the command's --help, no usage
    block, nothing on stdout."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    line = error_line(result)
    assert line.startswith("error: "), line
    assert re.search(r" \(see: peloton( [a-z]+)* --help\)$", line), line
    assert "Usage:" not in result.stderr
    assert result.stdout == ""
    return line


def failure(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    line = error_line(result)
    assert line.startswith("error: "), line
    return line


# ---------------------------------------------------------------------------- job submit


def test_submit_prints_the_job_id(cli: Cli) -> None:
    job_id = cli.submit()
    job = cli.client.get_job(job_id)
    assert job.spec.name == "resnet"
    assert job.spec.pool == "/research/vision"
    assert dict(job.spec.labels) == {"team": "vision"}
    assert job.spec.instances == 2


def test_submit_json_and_yaml_output(cli: Cli) -> None:
    data = cli.data("job", "submit", cli.job_file())
    assert data["state"] == "PENDING"
    assert data["spec"]["name"] == "resnet"
    assert data["spec"]["instances"] == 2
    assert data["spec"]["task"]["resources"] == {
        "cpu": 1.0,
        "mem_mb": 256.0,
        "disk_mb": 0.0,
        "gpu": 1.0,
    }
    # The default, filled by the server; a fixed gang (not elastic).
    assert data["spec"]["gang"] == {
        "min_instances": 2,
        "max_instances": 0,
        "elastic_timeout_seconds": 0,
    }
    assert cli.client.get_job(data["job_id"]).spec.name == "resnet"

    doc = yaml.safe_load(cli.ok("job", "submit", cli.job_file(), "-o", "yaml"))
    assert doc["spec"]["pool"] == "/research/vision"
    assert doc["job_id"] != data["job_id"]


def test_submit_pool_override(cli: Cli) -> None:
    job_id = cli.submit(JOB_YAML, "--pool", "/research/nlp")
    assert cli.client.get_job(job_id).spec.pool == "/research/nlp"
    line = failure(cli("job", "submit", cli.job_file(), "--pool", "nlp"), 2)
    assert "--pool" in line
    assert len(list(cli.client.iter_jobs())) == 1


def test_submit_request_id_is_idempotent(cli: Cli) -> None:
    job_id = cli.submit(JOB_YAML, "--request-id", "train-42")
    again = cli.ok("job", "submit", cli.job_file(), "--request-id", "train-42")
    assert again.strip() == f"job {job_id} already exists (same request id)"
    assert [j.job_id for j in cli.client.iter_jobs()] == [job_id]

    changed = cli.job_file(JOB_YAML.replace("instances: 2", "instances: 3"), "changed.yaml")
    line = failure(cli("job", "submit", changed, "--request-id", "train-42"), 1)
    assert line.startswith("error: already exists: ")
    assert "train-42" in line


def test_submit_quiet_prints_only_the_id(cli: Cli) -> None:
    # For scripts: JOB=$(peloton job submit -q FILE); -o is ignored.
    first = cli.ok("job", "submit", "-q", cli.job_file())
    second = cli.ok("job", "submit", "--quiet", cli.job_file(), "-o", "json")
    ids = [first, second]
    assert all(re.fullmatch(r"[0-9a-f-]{36}\n", out) for out in ids), ids
    assert {j.job_id for j in cli.client.iter_jobs()} == {out.strip() for out in ids}


def test_submit_from_stdin(cli: Cli) -> None:
    out = cli.ok("job", "submit", "-", input_text=JOB_YAML.replace("resnet", "from-stdin"))
    match = CREATED.match(out.strip())
    assert match, out
    assert cli.client.get_job(match.group(1)).spec.name == "from-stdin"


# ---------------------------------------------------------------------------- get, list


def test_job_get(cli: Cli) -> None:
    job_id = cli.submit()
    out = cli.ok("job", "get", job_id)
    fields = dict(re.findall(r"^(\w+):\s+(.*)$", out, flags=re.MULTILINE))
    assert fields["Job"] == job_id
    assert fields["Name"] == "resnet"
    assert fields["Pool"] == "/research/vision"
    assert fields["State"] == "PENDING"
    assert fields["Tasks"] == "2 PENDING"
    assert fields["Labels"] == "team=vision"
    assert fields["Instances"] == "2 (gang of 2)"

    data = cli.data("job", "get", job_id)
    assert data["job_id"] == job_id
    assert data["task_states"] == [{"state": "PENDING", "count": 2}]


def test_job_list_filters_and_formats(cli: Cli) -> None:
    c = cli.client
    a = c.create_job(make_spec(1, name="train-a", pool="/vision", labels={"team": "cv"})).job_id
    b = c.create_job(make_spec(1, name="train-b", pool="/nlp", labels={"team": "nlp"})).job_id
    d = c.create_job(make_spec(1, name="eval-d", pool="/vision", labels={"team": "cv"})).job_id
    drive(cli.server, d, [0], TO_RUNNING)
    c.kill_job(b)

    def ids(*args: str) -> list[str]:
        data = cli.data("job", "list", *args)
        assert data["next_page_token"] == ""
        return [j["job_id"] for j in data["jobs"]]

    assert ids() == [d, b, a]  # newest first
    assert ids("--state", "running") == [d]
    assert ids("--state", "KILLED", "--state", "PENDING") == [b, a]
    assert ids("--pool", "/vision") == [d, a]
    assert ids("--name", "train-") == [b, a]
    assert ids("--label", "team=cv", "--state", "PENDING") == [a]

    doc = yaml.safe_load(cli.ok("job", "list", "--pool", "/nlp", "-o", "yaml"))
    assert [j["job_id"] for j in doc["jobs"]] == [b]
    assert doc["jobs"][0]["state"] == "KILLED"

    paged = cli("job", "list", "--limit", "2")
    assert paged.returncode == 0, paged.stderr
    table = paged.stdout
    assert table.split()[:7] == ["JOB", "NAME", "POOL", "STATE", "TASKS", "CREATED", "REASON"]
    rows = [line.split() for line in table.splitlines()[2:] if line.strip()]
    assert [r[:4] for r in rows] == [
        [d, "eval-d", "/vision", "RUNNING"],
        [b, "train-b", "/nlp", "KILLED"],
    ]
    assert paged.stderr.strip() == "(more jobs: use --all or --limit)"
    everything = cli.data("job", "list", "--limit", "1", "--all")
    assert [j["job_id"] for j in everything["jobs"]] == [d, b, a]


def test_pool_list(cli: Cli) -> None:
    vision = cli.workdir / "vision.yaml"
    vision.write_text(
        "path: /cv\nowner: cv-team\nqueue_policy: fifo\n"
        "resources:\n  gpu: {reservation: 2, limit: 8}\n"
    )
    assert cli.ok("pool", "create", str(vision)).strip() == "pool /cv created"
    job_id = cli.client.create_job(make_spec(1, pool="/cv", gpu=1)).job_id

    data = cli.data("pool", "list")
    assert list(data) == ["pools"]
    paths = [p["spec"]["path"] for p in data["pools"]]
    assert paths == [p.spec.path for p in cli.client.list_pools()]  # parents first
    assert paths[0] == "/"
    assert {"/default", "/cv", "/nlp"} <= set(paths)
    cv = data["pools"][paths.index("/cv")]
    assert cv["spec"]["owner"] == "cv-team"
    assert cv["spec"]["queue_policy"] == "QUEUE_POLICY_FIFO"
    assert cv["spec"]["resources"]["gpu"]["reservation"] == 2
    assert cv["spec"]["resources"]["gpu"]["limit"] == 8
    assert cv["children"] == []
    # Every field, zero values included: a script need not guess what is missing.
    assert set(cv) == {"spec", "status", "children", "queued_gangs", "oversized_gangs"}
    assert set(cv["status"]) == {"cpu", "mem_mb", "disk_mb", "gpu"}
    assert cv["status"]["cpu"]["borrowed"] == 0
    assert cv["status"]["gpu"]["reservation"] == 2
    research = data["pools"][paths.index("/research")]
    assert research["children"] == ["/research/nlp", "/research/vision"]
    assert research["spec"]["owner"] == ""
    assert research["queued_gangs"] == 0

    doc = yaml.safe_load(cli.ok("pool", "list", "-o", "yaml"))
    assert [p["spec"]["path"] for p in doc["pools"]] == paths

    table = cli.ok("pool", "list")
    lines = table.splitlines()
    assert lines[0].split() == [
        "POOL",
        "OWNER",
        "QUEUE",
        "QUEUED",
        "GPU",  # the kinds in use or configured
        "ALLOC/ENT/LIMIT",
        "CHILDREN",
    ]
    rows = {line.split()[0]: line.split() for line in lines[2:] if line.strip()}
    assert list(rows) == paths
    assert rows["/cv"][:4] == ["/cv", "cv-team", "FIFO", "1"]
    assert rows["/cv"][4].endswith("/8")  # the GPU limit
    assert rows["/cv"][-1] == "-"
    assert rows["/research"][3] == "-"  # a parent pool queues nothing itself
    assert rows["/research"][-1] == "nlp,vision"
    assert rows["/"][1:4] == ["-", "-", "-"]

    header = cli.ok("pool", "list", "--kind", "mem_mb", "--kind", "cpu").splitlines()[0].split()
    assert header[4:-1] == ["MEM_MB", "ALLOC/ENT/LIMIT", "CPU", "ALLOC/ENT/LIMIT"]
    assert "--kind" in usage_error(cli("pool", "list", "--kind", "tpu"))
    cli.client.kill_job(job_id)


def _rows(table: str) -> dict[str, str]:
    """A table's lines after the header rule, by their first cell."""
    return {line.split()[0]: line for line in table.splitlines()[2:] if line.strip()}


def test_reasons_are_cut_in_tables_and_whole_when_wide(cli: Cli) -> None:
    why = "the dataset moved to " + "/".join(f"shard-{i:03d}" for i in range(20))
    killed = cli.submit()
    cli.client.kill_job(killed, why)
    pending = cli.submit()
    got = cli.client.get_job(killed)
    whole = f"{got.reason} - {why}" if got.reason else why

    rows = _rows(cli.ok("job", "list"))
    cut = rows[killed].split(None, 8)[-1].rstrip()
    assert len(cut) == REASON_WIDTH, cut
    assert cut.endswith("…")
    assert whole.startswith(cut[:-1])
    assert rows[pending].split()[3] == "PENDING"

    rows = _rows(cli.ok("job", "list", "-o", "wide"))
    assert rows[killed].rstrip().endswith(" " + whole)
    assert len(rows) == 2  # one line per job: nothing folded

    # The same with PELOTON_OUTPUT=wide; commands without lists take it as the table.
    env = {"PELOTON_OUTPUT": "wide"}
    server = address(cli.server.grpc_port)
    wide = run_peloton("job", "list", server=server, env=env)
    assert wide.returncode == 0, wide.stderr
    assert _rows(wide.stdout)[killed].rstrip().endswith(" " + whole)
    got_table = run_peloton("job", "get", killed, server=server, env=env)
    assert got_table.returncode == 0, got_table.stderr
    assert f"Reason:    {whole}" in got_table.stdout.splitlines()  # a single view: whole

    # A task's reason: the same cut, whole when wide.
    task_why = "exited 1: " + "x" * 150
    drive(cli.server, pending, [0], TO_RUNNING)
    cli.server.jobs.update_tasks(  # type: ignore[union-attr]
        pending, [TaskUpdate(0, 1, TaskState.FAILED, "task_failed", task_why, "host-0")]
    )
    current = cli.client.get_task(pending, 0).task.current  # a new attempt: the gang restarts
    task_whole = f"{current.reason} - {current.message}"
    assert task_why in task_whole
    row = _rows(cli.ok("task", "list", pending))["0"]
    cell = row.split(None, 4)[-1].rstrip()
    assert len(cell) == REASON_WIDTH
    assert task_whole.startswith(cell[:-1])
    row = _rows(cli.ok("task", "list", pending, "-o", "wide"))["0"]
    assert row.rstrip().endswith(task_whole)
    data = cli.data("task", "list", pending)
    assert data["tasks"][0]["current"]["message"] == current.message


def test_json_and_yaml_have_every_field_and_the_tables_state_names(cli: Cli) -> None:
    job_id = cli.submit()
    drive(cli.server, job_id, [0, 1], [*TO_RUNNING, TaskState.SUCCEEDED])

    job = cli.data("job", "get", job_id)
    assert job["spec"]["priority"] == 0  # zero values are there, not left out
    assert job["spec"]["task"]["resources"]["disk_mb"] == 0
    assert job["message"] == ""
    assert job["state"] == "SUCCEEDED"
    assert job["task_states"] == [{"state": "SUCCEEDED", "count": 2}]
    assert "SUCCEEDED" in cli.ok("job", "get", job_id)

    tasks = cli.data("task", "list", job_id)["tasks"]
    assert [(t["instance_id"], t["state"]) for t in tasks] == [(0, "SUCCEEDED"), (1, "SUCCEEDED")]
    assert tasks[0]["failures"] == 0
    assert tasks[0]["current"]["state"] == "SUCCEEDED"
    task = cli.data("task", "get", job_id, "0")
    assert task["task"]["instance_id"] == 0
    assert {e["to_state"] for e in task["events"]} <= {s.value for s in TaskState}

    listed = cli.data("job", "list")["jobs"]
    assert [j["state"] for j in listed] == ["SUCCEEDED"]
    updates = [
        json.loads(line) for line in cli("job", "watch", job_id, "-o", "json").stdout.splitlines()
    ]
    assert updates[-1]["job_state"] == "SUCCEEDED"
    assert updates[-1]["event"]["to_state"] == "SUCCEEDED"
    assert updates[0]["event"]["from_state"] == ""  # a zero value, kept

    doc = yaml.safe_load(cli.ok("task", "get", job_id, "1", "-o", "yaml"))
    assert doc["task"]["state"] == "SUCCEEDED"
    assert doc["task"]["history"] == []

    # Input in any case, as the tables spell it.
    for spelling in ("SUCCEEDED", "succeeded", "Succeeded"):
        assert [j["job_id"] for j in cli.data("job", "list", "--state", spelling)["jobs"]] == [
            job_id
        ]
        assert len(cli.data("task", "list", job_id, "--state", spelling)["tasks"]) == 2


def test_job_ids_may_be_shortened_to_a_unique_prefix(cli: Cli) -> None:
    # Jobs until two ids share their first character (at most 17: there are 16 hex digits).
    by_first: dict[str, list[str]] = {}
    while not any(len(ids) > 1 for ids in by_first.values()):
        job_id = cli.client.create_job(make_spec(2, name=f"j{len(by_first)}")).job_id
        by_first.setdefault(job_id[0], []).append(job_id)
    shared = next(first for first, ids in by_first.items() if len(ids) > 1)
    a, b = by_first[shared]
    every = [j for ids in by_first.values() for j in ids]

    # Ambiguous: a usage error naming the candidates; nothing is done to either job.
    line = failure(cli("job", "kill", shared), 2)
    assert line.startswith(f"error: job id prefix '{shared}' is ambiguous: 2 jobs start with it: ")
    assert a in line and b in line
    assert {j.state for j in map(cli.client.get_job, (a, b))} == {job_pb2.JOB_STATE_PENDING}

    # Unique: every command takes it.
    n = next(n for n in range(1, 37) if sum(j.startswith(a[:n]) for j in every) == 1)
    short = a[:n]
    assert cli.data("job", "get", short)["job_id"] == a
    assert cli.data("task", "list", short)["tasks"][0]["job_id"] == a
    assert cli.data("task", "get", short, "1")["task"]["job_id"] == a
    assert cli.ok("job", "kill", a[:8]).strip() == f"job {a} KILLED"
    assert cli("job", "watch", short, "-o", "json").returncode == 1  # KILLED: the watch ends
    assert cli.ok("job", "restart", short).strip() == f"job {a} PENDING"
    cli.client.kill_job(a)
    assert cli.ok("job", "delete", short).strip() == f"job {a} deleted"
    assert cli.data("job", "get", shared)["job_id"] == b  # now the only one

    # No match: the server's not found, for the prefix as given.
    assert failure(cli("job", "get", "zzz"), 1) == "error: not found: job zzz not found"


# ---------------------------------------------------------------------------- kill, restart, delete


def test_job_kill_restart_delete(cli: Cli) -> None:
    job_id = cli.submit()
    assert cli.ok("job", "kill", job_id, "-m", "enough").strip() == f"job {job_id} KILLED"
    assert cli.client.get_job(job_id).message == "enough"
    assert cli.ok("job", "restart", job_id).strip() == f"job {job_id} PENDING"
    assert cli.client.get_task(job_id, 0).task.current.attempt == 2
    killed = cli.data("job", "kill", job_id)
    assert killed["state"] == "KILLED"
    assert cli.ok("job", "delete", job_id).strip() == f"job {job_id} deleted"
    line = failure(cli("job", "get", job_id), 1)
    assert line == f"error: not found: job {job_id} not found"


def test_watch_exit_codes(cli: Cli) -> None:
    done = cli.submit()
    drive(cli.server, done, [0, 1], (*TO_RUNNING, TaskState.SUCCEEDED))
    result = cli("job", "watch", done)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.search(r"job\s+- -> PENDING\s+created\b", lines[0]), lines[0]
    assert re.search(r"job\s+RUNNING -> SUCCEEDED$", lines[-1]), lines[-1]
    assert any(re.search(r"task 1\s+STARTING -> RUNNING\s+on host-1", line) for line in lines)

    killed = cli.submit()
    cli.client.kill_job(killed)
    result = cli("job", "watch", killed, "-o", "json")
    assert result.returncode == 1
    assert result.stderr == ""
    updates = [json.loads(line) for line in result.stdout.splitlines()]
    assert [u["event"]["to_state"] for u in updates] == ["PENDING", "KILLED", "KILLED", "KILLED"]
    assert updates[-1]["job_state"] == "KILLED"

    failure(cli("job", "watch", "no-such-job"), 1)


def test_watch_follows_a_live_job_to_its_end(cli: Cli) -> None:
    job_id = cli.submit()
    proc = subprocess.Popen(
        [PELOTON, "--server", address(cli.server.grpc_port), "job", "watch", job_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=30), "the watch printed nothing"
        first = proc.stdout.readline()
        assert "- -> PENDING" in first
        drive(cli.server, job_id, [0, 1], (*TO_RUNNING, TaskState.SUCCEEDED))
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert re.search(r"job\s+RUNNING -> SUCCEEDED$", out.splitlines()[-1])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# ---------------------------------------------------------------------------- tasks


def test_task_list_and_get(cli: Cli) -> None:
    job_id = cli.submit()
    drive(cli.server, job_id, [1], TO_RUNNING)
    table = cli.ok("task", "list", job_id)
    rows = [line.split() for line in table.splitlines()[2:] if line.strip()]
    assert table.split()[:5] == ["INSTANCE", "STATE", "ATTEMPT", "HOST", "REASON"]
    assert [r[:4] for r in rows] == [["0", "PENDING", "1", "-"], ["1", "RUNNING", "1", "host-1"]]
    data = cli.data("task", "list", job_id, "--state", "running")
    assert [(t["instance_id"], t["state"]) for t in data["tasks"]] == [(1, "RUNNING")]

    drive(cli.server, job_id, [1], [TaskState.SUCCEEDED])
    drive(cli.server, job_id, [0], [*TO_RUNNING, TaskState.SUCCEEDED])
    cli.client.restart_job(job_id)
    out = cli.ok("task", "get", job_id, "1")
    assert f"Task:     {job_id} instance 1" in out
    assert f"Attempt:  {job_id}-1-2" in out
    assert "History:" in out
    assert re.search(rf"{job_id}-1-1\s+SUCCEEDED\s+host-1", out)
    assert "Events:" in out
    data = cli.data("task", "get", job_id, "1")
    assert data["task"]["current"]["attempt"] == 2
    assert [a["state"] for a in data["task"]["history"]] == ["SUCCEEDED"]
    assert data["events"][-1]["to_state"] == "PENDING"

    failure(cli("task", "get", job_id, "7"), 1)
    usage_error(cli("task", "get", job_id, "-1"))
    assert "INSTANCE" in usage_error(cli("task", "get", job_id, str(2**32)))  # not a uint32


# ---------------------------------------------------------------------------- errors


def test_server_side_errors_exit_1(cli: Cli) -> None:
    line = failure(cli("job", "get", "no-such-job"), 1)
    assert line == "error: not found: job no-such-job not found"
    failure(cli("job", "kill", "no-such-job"), 1)
    job_id = cli.submit()
    drive(cli.server, job_id, [0, 1], TO_RUNNING)
    line = failure(cli("job", "delete", job_id), 1)
    assert line.startswith("error: failed precondition: ")
    assert "RUNNING" in line
    line = failure(cli("job", "restart", cli.submit()), 1)
    assert "PENDING" in line


def test_validation_errors_exit_2(cli: Cli) -> None:
    line = failure(cli("job", "submit", cli.job_file(JOB_YAML.replace("instances", "instnces"))), 2)
    assert "instnces" in line
    assert "did you mean instances?" in line
    nested = JOB_YAML.replace("resources:", "resorces:")
    line = failure(cli("job", "submit", cli.job_file(nested)), 2)
    assert "task.resorces" in line
    assert "did you mean task.resources?" in line

    line = failure(cli("job", "submit", cli.job_file("name: [unclosed\n")), 2)
    assert "not valid YAML" in line
    line = failure(cli("job", "submit", cli.job_file(JOB_YAML.replace("gpu: 1", "gpu: many"))), 2)
    assert "gpu" in line

    # Validated by the server: INVALID_ARGUMENT is a usage error too.
    line = failure(
        cli("job", "submit", cli.job_file(JOB_YAML.replace("instances: 2", "instances: 0"))), 2
    )
    assert line == "error: invalid: instances: must be at least 1"
    line = failure(cli("job", "submit", cli.job_file(JOB_YAML.replace("gpu: 1", "gpu: 0.5"))), 2)
    assert line.startswith("error: invalid: task.resources.gpu: ")
    assert list(cli.client.iter_jobs()) == []

    assert "FILE" in usage_error(cli("job", "submit", str(cli.workdir / "absent.yaml")))
    assert "--label" in usage_error(cli("job", "list", "--label", "team"))
    assert usage_error(cli("job", "list", "--state", "sleeping")) == (
        "error: invalid value for '--state': 'sleeping' is not one of PENDING, RUNNING, SUCCEEDED,"
        " FAILED, KILLING, KILLED (any case) (see: peloton job list --help)"
    )
    help_text = cli.ok("task", "list", "--help")
    assert "--state STATE" in help_text
    assert "RUNNING, SUCCEEDED" in " ".join(help_text.split())
    assert "--limit" in usage_error(cli("job", "list", "--limit", "0"))
    usage_error(cli("job", "frobnicate"))


def test_every_usage_error_is_one_line(cli: Cli) -> None:
    absent = str(cli.workdir / "absent.yaml")
    line = usage_error(cli("job", "submit", absent))
    assert line == (
        f"error: invalid value for FILE: cannot read {absent}: No such file or directory"
        " (see: peloton job submit --help)"
    )
    line = usage_error(cli("pool", "create", absent))
    assert line.startswith(f"error: invalid value for FILE: cannot read {absent}")
    line = usage_error(cli("job", "list", "--stat", "x"))
    assert line == (
        "error: no such option '--stat'. Did you mean '--state'? (see: peloton job list --help)"
    )
    assert usage_error(cli("job", "get")) == (
        "error: missing argument 'JOB_ID' (see: peloton job get --help)"
    )
    assert usage_error(cli("task", "get", "some-job")) == (
        "error: missing argument 'INSTANCE' (see: peloton task get --help)"
    )
    assert usage_error(cli("job", "frobnicate")) == (
        "error: no such command 'frobnicate' (see: peloton job --help)"
    )
    assert usage_error(cli("frobnicate")) == (
        "error: no such command 'frobnicate' (see: peloton --help)"
    )
    line = usage_error(run_peloton("--server"))
    assert line == "error: option '--server' requires an argument (see: peloton --help)"
    line = usage_error(cli("job", "list", "-o", "xml"))
    assert line.startswith("error: invalid value for '--output' / '-o': 'xml' is not one of ")
    assert list(cli.client.iter_jobs()) == []

    # A group alone asks for its help: the help, not an error (exit 2 as click does).
    alone = cli("job")
    assert alone.returncode == 2
    assert "Commands:" in alone.stderr
    assert "submit" in alone.stderr


def test_unreachable_server_fails_fast_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    started = time.monotonic()
    result = run_peloton("--timeout", "2", "job", "list", server=f"127.0.0.1:{port}")
    elapsed = time.monotonic() - started
    line = failure(result, 1)
    assert line.startswith(f"error: cannot reach the peloton server at 127.0.0.1:{port}")
    assert elapsed < 10, f"took {elapsed:.1f}s"


def test_server_address_from_the_environment(cli: Cli) -> None:
    job_id = cli.submit()
    env = {"PELOTON_SERVER": address(cli.server.grpc_port), "PELOTON_OUTPUT": "json"}
    result = run_peloton("job", "get", job_id, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["job_id"] == job_id


def test_server_without_a_port_is_port_5392(tmp_path: Path) -> None:
    # A daemon on port 5392 of a loopback address of its own (all of 127/8 is this machine's),
    # so another daemon on 127.0.0.1:5392 neither hides nor answers for it.
    host = f"127.{random.randrange(1, 255)}.{random.randrange(256)}.{random.randrange(1, 255)}"
    config = ServerConfig(
        db_url=migrated_sqlite_url(tmp_path),
        grpc_host=host,
        grpc_port=DEFAULT_PORT,
        metrics_port=0,
        console_port=0,
        data_dir=tmp_path / "data",
    )
    server = Server(config)
    server.start()
    try:
        assert server.grpc_port == DEFAULT_PORT
        with PelotonClient(host, timeout=10) as client:
            job_id = client.create_job(make_spec(1, name="no-port")).job_id
        for argv, env in (
            (["--server", host], {}),
            (["-s", host], {}),
            ([], {"PELOTON_SERVER": host}),
        ):
            result = run_peloton(*argv, "job", "list", "-o", "json", env=env)
            assert result.returncode == 0, (argv, env, result.stderr)
            assert [j["job_id"] for j in json.loads(result.stdout)["jobs"]] == [job_id]
    finally:
        server.stop(grace=1.0)

    # Nothing there now: the error names the port dialled.
    line = failure(run_peloton("--timeout", "2", "job", "list", server=host), 1)
    assert line.startswith(f"error: cannot reach the peloton server at {host}:5392: ")


@pytest.mark.parametrize(
    ("given", "target"),
    [
        ("db.example", "db.example:5392"),
        ("db.example:7000", "db.example:7000"),
        ("[::1]", "[::1]:5392"),
        ("[::1]:7000", "[::1]:7000"),
        ("::1", "[::1]:5392"),
        ("dns:///db.example:7000", "dns:///db.example:7000"),
        ("unix:/run/peloton.sock", "unix:/run/peloton.sock"),
    ],
)
def test_server_address_forms(given: str, target: str) -> None:
    assert server_address(given) == target


def test_bad_server_addresses_are_usage_errors() -> None:
    for bad, why in (
        ("db.example:http", "the port must be a number from 1 to 65535"),
        ("db.example:0", "the port must be a number from 1 to 65535"),
        (":7000", "has no host"),
        ("[::1", "is not [IPV6]:PORT"),
    ):
        line = usage_error(run_peloton("job", "list", server=bad))
        assert line.startswith(f"error: invalid value for '--server' / '-s': {bad!r}"), line
        assert why in line, line


def test_completion_script() -> None:
    result = run_peloton("completion", "bash")
    assert result.returncode == 0
    assert "_PELOTON_COMPLETE" in result.stdout
    assert "complete " in result.stdout
    usage_error(run_peloton("completion", "tcsh"))


# ---------------------------------------------------------------------------- PostgreSQL


@pytest.mark.parametrize("backend", ["postgresql"])
def test_cli_on_postgresql(db_url: str, tmp_path: Path) -> None:
    assert db_url.startswith("postgresql")
    with serve_cli(db_url, tmp_path) as cli:
        job_id = cli.submit()
        assert [j["job_id"] for j in cli.data("job", "list", "--label", "team=vision")["jobs"]] == [
            job_id
        ]
        assert cli.data("job", "get", job_id)["spec"]["name"] == "resnet"
        assert cli.ok("job", "kill", job_id).strip() == f"job {job_id} KILLED"
        assert cli("job", "watch", job_id).returncode == 1
        assert cli.ok("job", "delete", job_id).strip() == f"job {job_id} deleted"
        failure(cli("job", "get", job_id), 1)
