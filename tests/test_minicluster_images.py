"""Task containers on the minicluster: a task whose ContainerInfo names a Docker image runs in
it, as on Mesos agents with ``--image_providers=docker`` and a local ``--docker_registry``.

The images (tests/images_support.py) are built here from this machine's own programs: a shell
and a few coreutils, no Python. Overlay mounts need root.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
from daemon import wait_for
from images_support import IMAGE_PATH, RELEASE, write_test_images
from minicluster_support import (  # noqa: F401 (fixtures)
    EXECUTOR,
    RawScheduler,
    fixture_make_minicluster,
    task_info,
)

from peloton.minicluster import Minicluster
from peloton.minicluster.containers import SANDBOX, SHM_SIZE_ERROR
from peloton.minicluster.images import ImageStore, ProvisionError, unpack
from peloton.minicluster.model import TERMINAL_STATES

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="overlay mounts need root")

MiniclusterFactory = Any


@pytest.fixture(scope="module", name="registry")
def fixture_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test images (images_support.IMAGES), written once for the module."""
    root = tmp_path_factory.mktemp("images")
    return write_test_images(root / "registry", root / "scratch")


def image_task(
    task_id: str,
    image: str,
    command: str = "",
    *,
    shell: bool = True,
    arguments: list[str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    linux: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """A TaskInfo (see task_info) whose container is ``image``; ``command`` is its value
    (none if empty)."""
    info = task_info(task_id, command, cpus=0.1, **kwargs)
    info["command"]["shell"] = shell
    if not command:
        del info["command"]["value"]
    if arguments is not None:
        info["command"]["arguments"] = arguments
    container: dict[str, Any] = {"type": "MESOS", "mesos": {"image": _image(image)}}
    if volumes:
        container["volumes"] = volumes
    if linux:
        container["linux_info"] = linux
    info["container"] = container
    return info


def _image(name: str) -> dict[str, Any]:
    return {"type": "DOCKER", "docker": {"name": name}}


def _finish(sched: RawScheduler, *task_ids: str) -> dict[str, list[dict[str, Any]]]:
    """Each task's statuses, acknowledged, up to its terminal one."""
    out: dict[str, list[dict[str, Any]]] = {}
    for task_id in task_ids:
        statuses: list[dict[str, Any]] = []
        while not statuses or statuses[-1]["state"] not in TERMINAL_STATES:
            statuses.append(sched.update(task_id, timeout=30))
            sched.ack(statuses[-1])
        out[task_id] = statuses
    return out


def _states(statuses: list[dict[str, Any]]) -> list[str]:
    return [s["state"] for s in statuses]


def _stdout(mc: Minicluster, task_id: str) -> str:
    sandbox = mc.task(task_id).sandbox
    assert sandbox is not None
    return (sandbox / "stdout").read_text()


def _mounts_under(path: Path) -> list[str]:
    """Mount points of this (the host's) namespace under ``path``."""
    lines = Path("/proc/self/mounts").read_text().splitlines()
    return [line.split()[1] for line in lines if line.split()[1].startswith(str(path))]


def _run(
    mc: Minicluster, tasks: list[dict[str, Any]], **launch: Any
) -> dict[str, list[dict[str, Any]]]:
    """Launch ``tasks`` as one group on the first agent and follow them to their end."""
    sched = RawScheduler(mc.address).subscribe()
    sched.launch_group(sched.offer("agent-0"), tasks, **launch)
    return _finish(sched, *(t["task_id"]["value"] for t in tasks))


def test_a_task_runs_in_its_image_with_the_image_environment(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(agents=1, docker_registry=registry)
    show = (
        "cat /etc/image-release; test -e /usr/bin/python3 && echo python || echo no-python; "
        "pwd; echo made > made-here; env"
    )
    statuses = _run(mc, [image_task("t", "base:1", show, env={"GREETING": "task"})])["t"]
    assert _states(statuses) == ["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"]
    lines = _stdout(mc, "t").splitlines()
    assert lines[:3] == [RELEASE, "no-python", SANDBOX]
    env = dict(line.split("=", 1) for line in lines[3:])
    # The image's Env, the task's variables over it, and what the agent sets.
    assert env["GREETING"] == "task" and env["LAYER"] == "base" and env["PATH"] == IMAGE_PATH
    assert env["MESOS_SANDBOX"] == SANDBOX and env["MESOS_TASK_ID"] == "t"
    assert "MESOS_DIRECTORY" not in env and "VIRTUAL_ENV" not in env
    sandbox = mc.task("t").sandbox
    assert sandbox is not None and (sandbox / "made-here").read_text() == "made\n"


def test_whiteouts_delete_files_and_opaque_directories_hide_the_layers_below(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(agents=1, docker_registry=registry)
    show = "ls /etc; echo --; ls -a /opt/stuff"
    assert _states(_run(mc, [image_task("t", "layered:1", show)])["t"])[-1] == "TASK_FINISHED"
    etc, stuff = _stdout(mc, "t").split("--\n")
    assert "image-release" in etc.split() and "doomed" not in etc.split()
    assert stuff.split() == [".", "..", "new"]


def test_shell_exec_and_image_entrypoint_command_forms(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(agents=1, docker_registry=registry)
    tasks = [
        image_task("shell", "entry:1", "echo shell"),  # the ENTRYPOINT is ignored
        image_task("exec", "entry:1", "/bin/echo", shell=False, arguments=["echo", "a", "b c"]),
        image_task("entry", "entry:1", shell=False),  # ENTRYPOINT + CMD
        image_task("entry-args", "entry:1", shell=False, arguments=["x", "y"]),  # replace CMD
        image_task("cmd", "cmd:1", shell=False),
        image_task("cmd-args", "cmd:1", shell=False, arguments=["only"]),  # CMD[0] + these
        image_task("workdir", "workdir:1", "pwd"),
    ]
    ends = _run(mc, tasks)
    assert {t: _states(s)[-1] for t, s in ends.items()} == dict.fromkeys(ends, "TASK_FINISHED")
    assert {t: _stdout(mc, t) for t in ends} == {
        "shell": "shell\n",
        "exec": "a b c\n",
        "entry": "entry from-cmd\n",
        "entry-args": "entry x y\n",
        "cmd": "cmd default\n",
        "cmd-args": "only\n",
        "workdir": "/opt/work\n",
    }


def test_host_and_image_volumes_are_mounted_with_their_modes(
    make_minicluster: MiniclusterFactory, registry: Path, tmp_path: Path
) -> None:
    mc = make_minicluster(agents=1, docker_registry=registry)
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro/in.txt").write_text("read me\n")
    (tmp_path / "rw").mkdir()
    volumes: list[dict[str, Any]] = [
        {"container_path": "/data", "host_path": str(tmp_path / "ro"), "mode": "RO"},
        {"container_path": "/results", "host_path": str(tmp_path / "rw"), "mode": "RW"},
        {"container_path": "/opt/payload", "mode": "RO", "image": _image("data:1")},
        {"container_path": "scratch", "host_path": "scratch", "mode": "RW"},
    ]
    script = (
        "cat /data/in.txt; touch /data/new 2>/dev/null && echo ro-written || echo ro-refused; "
        "echo result > /results/out.txt; cat /opt/payload/payload/content.txt; "
        "touch /opt/payload/new 2>/dev/null && echo image-written || echo image-refused; "
        "echo in-sandbox > scratch/file"
    )
    ends = _run(mc, [image_task("t", "base:1", script, volumes=volumes)])
    assert _states(ends["t"])[-1] == "TASK_FINISHED"
    assert _stdout(mc, "t").splitlines() == [
        "read me",
        "ro-refused",
        "from the data image",
        "image-refused",
    ]
    assert (tmp_path / "rw/out.txt").read_text() == "result\n"
    assert not (tmp_path / "ro/new").exists()
    sandbox = mc.task("t").sandbox
    assert sandbox is not None and (sandbox / "scratch/file").read_text() == "in-sandbox\n"


def test_the_executors_shm_is_sized_and_shared_by_its_tasks(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(agents=1, docker_registry=registry)
    share = {"ipc_mode": "SHARE_PARENT"}
    size = "df -k /dev/shm | tail -1"
    reader = (
        "i=0; while [ ! -e /dev/shm/msg ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; "
        f"cat /dev/shm/msg; {size}"
    )
    tasks = [
        image_task("writer", "base:1", f"echo from-writer > /dev/shm/msg; {size}", linux=share),
        image_task("reader", "base:1", reader, linux=share),
        image_task("own", "base:1", size, linux={"ipc_mode": "PRIVATE", "shm_size": 16}),
    ]
    executor = {"type": "MESOS", "linux_info": {"ipc_mode": "PRIVATE", "shm_size": 64}}
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.offer("agent-0")
    agent_id = offer["agent_id"]
    for t in tasks:
        t["agent_id"] = agent_id
    body = {
        "offer_ids": [offer["id"]],
        "operations": [_launch_group(sched, tasks, dict(_executor("shm"), container=executor))],
    }
    sched.ok("ACCEPT", body)
    ends = _finish(sched, "writer", "reader", "own")
    assert {t: _states(s)[-1] for t, s in ends.items()} == dict.fromkeys(ends, "TASK_FINISHED")
    assert _stdout(mc, "writer").split()[1] == "65536"  # KiB: the executor's 64 MB
    lines = _stdout(mc, "reader").splitlines()
    assert lines[0] == "from-writer" and lines[1].split()[1] == "65536"
    assert _stdout(mc, "own").split()[1] == "16384"
    # The executor ended with its last task: its /dev/shm is unmounted from the host.
    work = mc.work_dir
    assert work is not None
    mc.wait_until(lambda: not _mounts_under(work), 10)


def _executor(executor_id: str) -> dict[str, Any]:
    return {"type": "DEFAULT", "executor_id": {"value": executor_id}, "resources": EXECUTOR}


def _launch_group(
    sched: RawScheduler, tasks: list[dict[str, Any]], executor: dict[str, Any]
) -> dict[str, Any]:
    executor = dict(executor, framework_id={"value": sched.framework_id})
    return {
        "type": "LAUNCH_GROUP",
        "launch_group": {"executor": executor, "task_group": {"tasks": tasks}},
    }


def test_an_unknown_image_fails_its_task_as_the_default_executor_reports_it(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(agents=1, docker_registry=registry)
    tasks = [image_task("ghost", "nope:1", "true"), image_task("fine", "base:1", "sleep 30")]
    ends = _run(mc, tasks)
    failed = ends["ghost"][-1]
    assert _states(ends["ghost"]) == ["TASK_STARTING", "TASK_FAILED"]
    assert failed["message"] == (
        f"Failed to find archive for image 'nope:1' at '{registry}/nope:1.tar'"
    )
    assert failed["source"] == "SOURCE_EXECUTOR" and "reason" not in failed
    killed = ends["fine"][-1]
    assert killed["state"] == "TASK_KILLED"
    assert "task 'ghost' of its group failed" in killed["message"]


def test_a_command_task_with_an_unknown_image_fails_as_its_agent_reports_it(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(agents=1, docker_registry=registry)
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.offer()
    task = dict(image_task("ghost", "nope", "true"), agent_id=offer["agent_id"])
    launch = {"type": "LAUNCH", "launch": {"task_infos": [task]}}
    sched.ok("ACCEPT", {"offer_ids": [offer["id"]], "operations": [launch]})
    failed = _finish(sched, "ghost")["ghost"][-1]
    assert failed["state"] == "TASK_FAILED" and failed["source"] == "SOURCE_AGENT"
    assert failed["reason"] == "REASON_CONTAINER_LAUNCH_FAILED"
    # No tag: the archive is named as the reference is written (the tag inside is 'latest').
    assert failed["message"] == (
        f"Failed to launch container: Failed to find archive for image 'nope' at "
        f"'{registry}/nope.tar'"
    )


def test_without_a_registry_an_image_is_unsupported(make_minicluster: MiniclusterFactory) -> None:
    mc = make_minicluster(agents=1)
    failed = _run(mc, [image_task("t", "base:1", "true")])["t"][-1]
    assert failed["state"] == "TASK_FAILED"
    assert failed["message"] == "Unsupported container image type: DOCKER"


def test_what_stops_a_container_before_its_command_fails_the_task(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(agents=1, docker_registry=registry)
    cases = {
        "no-program": (
            image_task("no-program", "base:1", "/bin/nope", shell=False),
            "Failed to execute '/bin/nope': No such file or directory",
        ),
        "no-command": (
            image_task("no-command", "data:1", shell=False),
            "Failed to determine the launch command: No executable is found",
        ),
        "no-host-path": (
            image_task(
                "no-host-path",
                "base:1",
                "true",
                volumes=[{"container_path": "/x", "host_path": "/nonexistent", "mode": "RO"}],
            ),
            "Path '/nonexistent' in HOST_PATH volume does not exist",
        ),
        "shm-size": (
            image_task(
                "shm-size", "base:1", "true", linux={"ipc_mode": "SHARE_PARENT", "shm_size": 8}
            ),
            SHM_SIZE_ERROR,
        ),
    }
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.offer("agent-0")
    for i, (task, _) in enumerate(cases.values()):
        # One group each: a failed task takes its group down.
        sched.launch_group(offer, [task], filters={"refuse_seconds": 0})
        if i < len(cases) - 1:
            offer = sched.offer("agent-0")
    for task_id, (_, message) in cases.items():
        statuses = _finish(sched, task_id)[task_id]
        assert _states(statuses) == ["TASK_STARTING", "TASK_FAILED"], task_id
        assert statuses[-1]["message"] == message


def test_layers_are_extracted_once_for_all_agents(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(agents=2, docker_registry=registry)
    sched = RawScheduler(mc.address).subscribe()
    sched.launch_group(sched.offer("agent-0"), [image_task("first", "base:1", "true")])
    assert _states(_finish(sched, "first")["first"])[-1] == "TASK_FINISHED"
    work = mc.work_dir
    assert work is not None
    layers = work / "store/docker/layers"
    (cached,) = layers.iterdir()
    inode = cached.stat().st_ino
    # Planted in the cached layer: a container that uses the cache sees it.
    (cached / "etc/planted").write_text("from the cache\n")
    sched.launch_group(sched.offer("agent-1"), [image_task("second", "base:1", "cat /etc/planted")])
    assert _states(_finish(sched, "second")["second"])[-1] == "TASK_FINISHED"
    assert _stdout(mc, "second") == "from the cache\n"
    assert [p.stat().st_ino for p in layers.iterdir()] == [inode]
    assert list((work / "store/docker/staging").iterdir()) == []


def test_a_containerized_task_is_killed_with_term_then_kill(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(agents=2, docker_registry=registry)
    sched = RawScheduler(mc.address).subscribe()
    # "ready" once SIGTERM is ignored: a KILL before that (TASK_RUNNING comes as the shell
    # starts) would find it polite, on a busy machine.
    stubborn = image_task("stubborn", "base:1", "trap '' TERM; echo ready; sleep 30", grace=0.5)
    polite = image_task("polite", "base:1", "sleep 30", grace=30)
    sched.launch_group(sched.offer("agent-0"), [stubborn])
    sched.launch_group(sched.offer("agent-1"), [polite])
    for task_id in ("stubborn", "polite"):
        for state in ("TASK_STARTING", "TASK_RUNNING"):
            sched.ack(sched.update(task_id, state, timeout=30))
    wait_for(lambda: _stdout(mc, "stubborn") == "ready\n", 30, "the stubborn task's trap")
    sched.ok("KILL", {"task_id": {"value": "polite"}})
    sched.ok("KILL", {"task_id": {"value": "stubborn"}})
    polite_end = sched.update("polite")
    assert polite_end["state"] == "TASK_KILLED"
    assert polite_end["message"] == "Command terminated with signal SIGTERM"
    stubborn_end = sched.update("stubborn")
    assert stubborn_end["state"] == "TASK_KILLED"
    assert stubborn_end["message"] == "Command terminated with signal SIGKILL"
    for task_id in ("stubborn", "polite"):
        pid = mc.task(task_id).pid
        assert pid is not None and not Path(f"/proc/{pid}").exists()


def test_gpu_tasks_see_only_their_own_gpus(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(
        agents=1, resources="cpus:4;mem:4096;disk:10000;gpus:4", docker_registry=registry
    )
    show = 'echo "$CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES"; sleep 0.5'
    tasks = [image_task(f"g{i}", "base:1", show, gpus=1) for i in range(2)]
    tasks.append(task_info("host", show, cpus=0.1, gpus=2))
    ends = _run(mc, tasks)
    assert {t: _states(s)[-1] for t, s in ends.items()} == dict.fromkeys(ends, "TASK_FINISHED")
    seen = [_stdout(mc, t).split() for t in ("g0", "g1", "host")]
    assert all(cuda == nvidia for cuda, nvidia in seen)
    gpus = [set(cuda.split(",")) for cuda, _ in seen]
    assert sum(len(g) for g in gpus) == len(set().union(*gpus)) == 4  # disjoint
    assert set().union(*gpus) == {"0", "1", "2", "3"}


def test_the_master_refuses_containers_mesos_refuses(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(agents=1, docker_registry=registry)
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.offer()
    docker = image_task("docker", "base:1", "true")
    docker["container"] = {"type": "DOCKER", "docker": {"image": "base:1"}}
    sched.launch_group(offer, [docker], filters={"refuse_seconds": 0})
    error = sched.update("docker")
    assert error["state"] == "TASK_ERROR" and error["reason"] == "REASON_TASK_GROUP_INVALID"
    assert (
        error["message"]
        == "Task 'docker' is invalid: Docker ContainerInfo is not supported on the task"
    )

    both = image_task(
        "both",
        "base:1",
        "true",
        volumes=[
            {"container_path": "/x", "host_path": "/tmp", "image": _image("data:1"), "mode": "RO"}
        ],
    )
    sched.launch_group(sched.offer(), [both], filters={"refuse_seconds": 0})
    assert sched.update("both")["message"] == (
        "Task 'both' is invalid: Task's `ContainerInfo` is invalid: Invalid volume: "
        "Only one of them should be set: 'host_path', 'image' and 'source'"
    )

    nameless = image_task("nameless", "base:1", "true")
    del nameless["container"]["mesos"]["image"]["docker"]["name"]
    offer = sched.offer()
    nameless["agent_id"] = offer["agent_id"]
    status, body = sched.call(
        "ACCEPT",
        {
            "offer_ids": [offer["id"]],
            "operations": [_launch_group(sched, [nameless], _executor("e"))],
        },
    )
    assert status == 400
    assert body.decode() == (
        "Failed to parse body into Call protobuf: Missing required fields: "
        "accept.operations[0].launch_group.task_group.tasks[0].container.mesos.image.docker.name"
    )


def test_no_mount_outlives_the_minicluster(
    make_minicluster: MiniclusterFactory, registry: Path
) -> None:
    mc = make_minicluster(agents=1, docker_registry=registry)
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.offer()
    task = image_task("long", "base:1", "sleep 30", linux={"ipc_mode": "SHARE_PARENT"})
    task["agent_id"] = offer["agent_id"]
    executor = {"type": "MESOS", "linux_info": {"ipc_mode": "PRIVATE", "shm_size": 8}}
    operation = _launch_group(sched, [task], dict(_executor("keep"), container=executor))
    sched.ok("ACCEPT", {"offer_ids": [offer["id"]], "operations": [operation]})
    for state in ("TASK_STARTING", "TASK_RUNNING"):
        sched.ack(sched.update("long", state, timeout=30))
    work = mc.work_dir
    assert work is not None
    assert [Path(m).name for m in _mounts_under(work)] == ["shm"]  # the executor's, on the host
    mc.stop()
    assert _mounts_under(work) == []


def test_minicluster_up_serves_images_of_its_docker_registry(
    registry: Path, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "peloton.cli", "minicluster", "up", "--port", "0"]
    options = ["--agents", "1", "--docker-registry", str(registry)]
    proc = subprocess.Popen(
        [*command, *options, "--work-dir", str(tmp_path / "work")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("minicluster master at "), line
        sched = RawScheduler(line.split()[3]).subscribe()
        sched.launch_group(sched.offer(), [image_task("t", "base:1", "cat /etc/image-release")])
        assert _states(_finish(sched, "t")["t"])[-1] == "TASK_FINISHED"
        stdout = next((tmp_path / "work").rglob("tasks/t")) / "stdout"
        assert stdout.read_text() == f"{RELEASE}\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


def test_a_layer_cannot_write_outside_itself(tmp_path: Path) -> None:
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        link = tarfile.TarInfo("escape")
        link.type, link.linkname = tarfile.SYMTYPE, str(tmp_path / "outside")
        tar.addfile(link)
        tar.addfile(tarfile.TarInfo("escape/planted"))
    (tmp_path / "outside").mkdir()
    (tmp_path / "dest").mkdir()
    with tarfile.open(layer) as tar, pytest.raises(ProvisionError, match="goes through a link"):
        unpack(tar, tmp_path / "dest")
    assert list((tmp_path / "outside").iterdir()) == []


def test_concurrent_provisions_of_one_image_share_its_layers(
    registry: Path, tmp_path: Path
) -> None:
    store = ImageStore(registry, tmp_path / "cache")
    results: list[tuple[Path, ...]] = []
    threads = [
        threading.Thread(target=lambda: results.append(store.provision("layered:1").layers))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and len(set(results)) == 1
    assert sorted(store.layers.iterdir()) == sorted(results[0])
    assert list((tmp_path / "cache/staging").iterdir()) == []
