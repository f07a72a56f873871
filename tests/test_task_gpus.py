"""``peloton task get`` shows the host indices of a task's GPUs, which the task reports itself.

A Mesos agent tells no framework which of its GPUs it gave a task, so the line peloton puts before
the command of a task with GPUs writes what the task sees into its sandbox, and GetTaskGpus reads
it from the agent. Covers that line under ``/bin/sh`` (dash): what it writes with and without
CUDA_VISIBLE_DEVICES, that it never fails or changes the task's command; where the launch puts it;
and end to end (a daemon on SQLite, a minicluster whose agent runs real processes, the CLI): the
two tasks of a gang show the distinct indices each printed, JSON output, a task without GPUs, a
task not placed yet, an agent that is gone, and in containers (root only) the "shell" entrypoint
reporting while "exec" says it does not.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import Peloton, run_peloton, start_minicluster
from support import make_spec
from test_examples import task_log, wait_for_log
from test_hostmgr_offers import raw_offer

from peloton.api.host_service import gpu_indices
from peloton.core.containers import ContainerLaunch
from peloton.core.offers import LaunchTask, Lease
from peloton.core.resources import EXECUTOR_RESOURCES, Resources
from peloton.hostmgr.launch import gpu_report, launch_group
from peloton.hostmgr.offers import parse_offer
from peloton.hostmgr.sandbox import GPU_REPORT
from peloton.minicluster import AgentSpec, Minicluster

# SQLite: the database does not matter here (PostgreSQL runs the other integration tests).
on_sqlite = pytest.mark.parametrize("backend", ["sqlite"])
# Containers need mount namespaces and overlayfs (as a Mesos agent, root); CI runs as root.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="task containers need root")

AGENT = "cpus:8;mem:8192;disk:10000;gpus:4;ports:[31000-31100]"
# What a task prints before it waits to be killed: the GPUs its agent made visible to it.
PRINT_GPUS = 'echo "gpus=$CUDA_VISIBLE_DEVICES"; exec sleep 120'


# ---------------------------------------------------------------------------- the report line


def run_report(
    sandbox: Path, command: str = "true", devices: str = "/nonexistent/nvidia", **env: str
) -> subprocess.CompletedProcess[str]:
    """The report line, then ``command``, as a task's shell runs them (``/bin/sh -c``), in an
    environment of ``env`` and MESOS_SANDBOX only (no CUDA_VISIBLE_DEVICES unless given)."""
    full_env = {"PATH": os.environ["PATH"], "MESOS_SANDBOX": str(sandbox), **env}
    return subprocess.run(
        ["/bin/sh", "-c", f"{gpu_report(devices)}\n{command}"],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def report(sandbox: Path) -> str:
    return (sandbox / GPU_REPORT).read_text()


def test_the_report_is_cuda_visible_devices_where_the_agent_sets_it(tmp_path: Path) -> None:
    assert "\n" not in gpu_report()
    assert run_report(tmp_path, CUDA_VISIBLE_DEVICES="3,1").returncode == 0
    assert report(tmp_path) == "3,1\n"  # in CUDA's order
    # Set and empty: the task sees no GPU, whatever device nodes there are.
    devices = tmp_path / "dev"
    devices.mkdir()
    (devices / "nvidia0").touch()
    run_report(tmp_path, devices=str(devices / "nvidia"), CUDA_VISIBLE_DEVICES="")
    assert report(tmp_path) == "\n"


def test_without_cuda_visible_devices_the_report_is_the_device_nodes_the_task_may_open(
    tmp_path: Path,
) -> None:
    devices = tmp_path / "dev dir"  # a space: the prefix is quoted
    devices.mkdir()
    for name in ("nvidia0", "nvidia3", "nvidia12", "nvidiactl", "nvidia-uvm"):
        (devices / name).touch()
    # A node the task may not open (as the devices cgroup denies GPUs not allocated to it).
    (devices / "nvidia5").symlink_to("missing")
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    result = run_report(sandbox, devices=str(devices / "nvidia"))
    assert (result.returncode, result.stderr) == (0, "")
    assert report(sandbox) == "0,12,3\n"  # the glob's order; only numbered nodes
    run_report(sandbox, devices=str(tmp_path / "none" / "nvidia"))
    assert report(sandbox) == "\n"


def test_the_report_leaves_the_command_its_variables_status_and_process(tmp_path: Path) -> None:
    # Variables the line uses keep the task's values (it runs in a subshell).
    result = run_report(
        tmp_path,
        'echo "$d|${g-unset}|$CUDA_VISIBLE_DEVICES"; exit 7',
        d="mine",
        CUDA_VISIBLE_DEVICES="2",
    )
    assert (result.returncode, result.stdout, result.stderr) == (7, "mine|unset|2\n", "")
    assert report(tmp_path) == "2\n"
    # The command's exec still replaces the task's shell: the process Mesos watches.
    env = {"PATH": os.environ["PATH"], "MESOS_SANDBOX": str(tmp_path)}
    script = f"{gpu_report()}\nexec /bin/sh -c 'echo $$'"
    proc = subprocess.Popen(["/bin/sh", "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert out == f"{proc.pid}\n"


def test_a_sandbox_the_task_cannot_write_or_no_mkdir_fails_nothing(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    result = run_report(not_a_directory, "echo ran", CUDA_VISIBLE_DEVICES="0")
    assert (result.returncode, result.stdout, result.stderr) == (0, "ran\n", "")
    # An image without mkdir: nothing is written, and the command runs.
    empty = tmp_path / "empty"
    empty.mkdir()
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    result = run_report(sandbox, "echo ran", PATH=str(empty), CUDA_VISIBLE_DEVICES="0")
    assert (result.returncode, result.stdout, result.stderr) == (0, "ran\n", "")
    assert not (sandbox / GPU_REPORT).exists()


def test_reports_are_read_as_host_indices_in_their_order() -> None:
    assert gpu_indices("2,3\n") == [2, 3]
    assert gpu_indices("3, 1\n") == [3, 1]
    assert gpu_indices("\n") == []
    for other in (
        "GPU-8a7b1c2d-0000\n",
        "MIG-1/2/3\n",
        "1,,2\n",
        "-1\n",
        "\u0663\n",
        "4294967296\n",
    ):
        assert gpu_indices(other) is None, other


# ---------------------------------------------------------------------------- the launch


def commands(*tasks: tuple[ContainerLaunch | None, float]) -> list[dict[str, object]]:
    """The CommandInfo of each task (container, gpus) of one launch, its environment left out."""
    lease = Lease("lease-1", "h1", "a1", (parse_offer(raw_offer("o1"), 0),), 60)
    launch = [
        LaunchTask(
            f"job-{i}-0",
            f"t-{i}",
            "/bin/train" if c is not None and c.entrypoint == "exec" else "train --fast",
            {},
            Resources(cpu=0.5, mem_mb=256, gpu=gpu),
            container=c,
        )
        for i, (c, gpu) in enumerate(tasks)
    ]
    op = launch_group(lease, "fw", "job-0-0-executor", EXECUTOR_RESOURCES, launch)
    infos = op["launch_group"]["task_group"]["tasks"]
    return [{k: v for k, v in t["command"].items() if k != "environment"} for t in infos]


def test_only_a_shell_command_of_a_task_with_gpus_reports_them() -> None:
    shell = ContainerLaunch("x:1", "shell", (), (), shm_mb=64, runtime="peloton")
    exec_ = ContainerLaunch("x:1", "exec", ("-v",), (), shm_mb=64)
    image = ContainerLaunch("x:1", "image", ("--epochs", "3"), (), shm_mb=64)
    plain, cpu_only, in_shell, in_exec, in_image = commands(
        (None, 1), (None, 0), (shell, 1), (exec_, 1), (image, 1)
    )
    assert plain == {"shell": True, "value": f"{gpu_report()}\ntrain --fast"}
    assert cpu_only == {"shell": True, "value": "train --fast"}
    report_line, path, command = str(in_shell["value"]).split("\n")
    assert (report_line, command) == (gpu_report(), "train --fast")
    assert path.startswith("PATH=")
    assert in_exec == {"shell": False, "value": "/bin/train", "arguments": ["/bin/train", "-v"]}
    assert in_image == {"shell": False, "arguments": ["--epochs", "3"]}


# ---------------------------------------------------------------------------- end to end


@pytest.fixture
def cluster(tmp_path: Path, image_registry: Path) -> Iterator[Minicluster]:
    agents = [AgentSpec("gpu-host", resources=AGENT)]
    mc = start_minicluster(agents, tmp_path / "cluster", docker_registry=image_registry)
    yield mc
    mc.stop()


def task_get(peloton: Peloton, job_id: str, instance: int, *args: str) -> str:
    result = run_peloton("task", "get", job_id, str(instance), *args, server=peloton.proc.address)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def gpus_line(peloton: Peloton, job_id: str, instance: int) -> str | None:
    """The GPUs line of ``task get`` (what follows ``GPUs:``), None if it has none."""
    found = re.search(r"^GPUs: +(.*)$", task_get(peloton, job_id, instance), re.MULTILINE)
    return found.group(1) if found else None


def printed_gpus(peloton: Peloton, job_id: str, instance: int) -> str:
    """The CUDA_VISIBLE_DEVICES the task printed, once it did: its report is written by then."""
    wait_for_log(peloton.client, job_id, instance, "gpus=")
    found = re.search(r"gpus=(\S*)", task_log(peloton.client, job_id, instance))
    assert found is not None
    return found.group(1)


@on_sqlite
def test_each_task_of_a_gang_shows_the_gpus_it_sees(peloton: Peloton) -> None:
    job_id = peloton.submit(PRINT_GPUS, 2, gpu=1)
    peloton.wait_running(job_id)
    seen = [printed_gpus(peloton, job_id, i) for i in range(2)]
    assert all(s.isdigit() for s in seen) and seen[0] != seen[1], seen
    for instance, gpu in enumerate(seen):
        assert gpus_line(peloton, job_id, instance) == gpu
    data = json.loads(task_get(peloton, job_id, 1, "--output", "json"))
    assert data["task"]["instance_id"] == 1
    assert data["gpus"] == {
        "gpu_indices": [int(seen[1])],
        "reported": True,
        "reason": "",
        "task_id": f"{job_id}-1-1",
        "attempt": 1,
        "requested": 1,
        "error": "",
    }


@on_sqlite
def test_a_task_without_gpus_or_not_placed_shows_no_gpus(peloton: Peloton) -> None:
    cpu_only = peloton.submit("exec sleep 120", 1, gpu=0)
    peloton.wait_running(cpu_only)
    assert gpus_line(peloton, cpu_only, 0) is None
    gpus = json.loads(task_get(peloton, cpu_only, 0, "-o", "json"))["gpus"]
    assert (gpus["requested"], gpus["reported"], gpus["gpu_indices"]) == (0, True, [])
    # More GPUs than the agent has: the task never reaches a host.
    too_big = peloton.submit("true", 1, gpu=8)
    assert gpus_line(peloton, too_big, 0) is None
    assert json.loads(task_get(peloton, too_big, 0, "-o", "json"))["gpus"] is None


@on_sqlite
def test_an_agent_that_is_gone_does_not_fail_task_get(
    peloton: Peloton, cluster: Minicluster
) -> None:
    job_id = peloton.client.create_job(
        make_spec(1, command=PRINT_GPUS, gpu=1, max_failures=0)
    ).job_id
    peloton.wait_running(job_id)
    printed_gpus(peloton, job_id, 0)
    cluster.kill_agent("gpu-host")
    # Unreachable at once, or DOWN once peloton hears of it: the line says so either way.
    line = gpus_line(peloton, job_id, 0)
    assert line is not None and line.startswith("unknown ("), line
    assert "UNAVAILABLE" in line or "DOWN" in line, line
    data = json.loads(task_get(peloton, job_id, 0, "-o", "json"))["gpus"]
    assert data["error"] in ("UNAVAILABLE", "FAILED_PRECONDITION"), data
    assert (data["reported"], data["requested"], data["attempt"]) == (False, None, 1)


def container_job(
    peloton: Peloton, command: str, entrypoint: str = "", args: list[str] | None = None
) -> str:
    """A job of one task with a GPU, in base:1 (dash and a few coreutils: enough to report)."""
    spec = make_spec(1, command=command, gpu=1, max_failures=0)
    spec.task.container.image = "base:1"
    spec.task.container.entrypoint = entrypoint
    spec.task.container.args.extend(args or [])
    return peloton.client.create_job(spec).job_id


@on_sqlite
@needs_root
def test_a_container_reports_its_gpus_unless_it_runs_without_a_shell(peloton: Peloton) -> None:
    shell = container_job(peloton, PRINT_GPUS)
    exec_ = container_job(peloton, "/bin/sleep", entrypoint="exec", args=["120"])
    for job_id in (shell, exec_):
        peloton.wait_running(job_id, timeout=60)
    gpu = printed_gpus(peloton, shell, 0)
    assert gpu.isdigit(), gpu
    assert gpus_line(peloton, shell, 0) == gpu
    assert gpus_line(peloton, exec_, 0) == (
        "not reported (its container's entrypoint is 'exec': only a command that runs through "
        "a shell reports its GPUs)"
    )
    data = json.loads(task_get(peloton, exec_, 0, "-o", "json"))["gpus"]
    assert (data["reported"], data["gpu_indices"], data["error"]) == (False, [], "")


def test_task_get_help_mentions_the_gpus() -> None:
    result = run_peloton("task", "get", "--help")
    assert result.returncode == 0 and "GPUs" in result.stdout, result.stdout
