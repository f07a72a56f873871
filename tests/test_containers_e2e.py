"""Task containers end to end: a ``peloton server`` process, a minicluster whose agents run
images from a local registry (``--docker-registry``), and jobs submitted over gRPC.

A 4-rank gang runs in an image with no Python and no peloton (``base:1``: /bin/sh, a few
coreutils and their libraries), with peloton's runtime bundle mounted at /opt/peloton: each rank's
self-check joins the gang from the gang environment and allreduces, over shared memory between
the ranks of the host; each sees only its own GPU index, the volume and the /dev/shm the job
asked for. A job whose image the agents lack fails, its reason naming the image.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import Peloton, start_minicluster
from support import make_spec
from test_examples import task_log

from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2

pytestmark = [
    pytest.mark.parametrize("backend", ["postgresql"]),
    # Containers need mount namespaces and overlayfs (as a Mesos agent, root); CI runs as root.
    pytest.mark.skipif(os.geteuid() != 0, reason="task containers need root"),
]

AGENT = "cpus:8;mem:8192;disk:10000;gpus:4;ports:[31000-31100]"
SHM_MB = 96


@pytest.fixture
def cluster(tmp_path: Path, image_registry: Path) -> Iterator[Minicluster]:
    agents = [AgentSpec("gpu-host", resources=AGENT)]
    mc = start_minicluster(agents, tmp_path / "cluster", docker_registry=image_registry)
    yield mc
    mc.stop()


def container_spec(
    image: str, command: str, instances: int, **container: object
) -> job_pb2.JobSpec:
    spec = make_spec(instances, command=command, gpu=1, max_failures=0)
    spec.task.container.image = image
    for key, value in container.items():
        if key == "volumes":
            spec.task.container.volumes.extend(value)  # type: ignore[arg-type]
        else:
            setattr(spec.task.container, key, value)
    return spec


def outcome(peloton: Peloton, job_id: str, instances: int) -> str:
    """The job's state and every task's stdout and stderr: what a failed assertion shows."""
    logs = [
        f"--- task {i} stdout:\n{task_log(peloton.client, job_id, i)}"
        f"--- task {i} stderr:\n{task_log(peloton.client, job_id, i, stderr=True)}"
        for i in range(instances)
    ]
    return "\n".join([peloton.describe(job_id), *logs])


# What each rank prints before the self-check takes over the process.
RANK_SCRIPT = (
    'echo "gpus=$CUDA_VISIBLE_DEVICES nvidia=$NVIDIA_VISIBLE_DEVICES"; '
    'echo "shm=$(df -m /dev/shm | tail -1)"; '
    'echo "data=$(cat /data/hello.txt)"; '
    'test -e /usr/bin/python3 || test -e /usr/local/bin/python3 || echo "python=none"; '
    'echo "release=$(cat /etc/image-release)"; '
    "exec peloton-collective-check --gang"
)


def test_a_gang_in_an_image_without_python_allreduces_through_the_mounted_runtime(
    peloton: Peloton, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "hello.txt").write_text("from the host\n")
    volume = job_pb2.Volume(container_path="/data", host_path=str(data), mode="ro")
    spec = container_spec(
        "base:1", RANK_SCRIPT, 4, runtime="peloton", shm_mb=SHM_MB, volumes=[volume]
    )
    job_id = peloton.client.create_job(spec).job_id
    job = peloton.wait_done(job_id, timeout=120)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, outcome(peloton, job_id, 4)
    logs = [task_log(peloton.client, job_id, i) for i in range(4)]
    gpus: list[str] = []
    for rank, log in enumerate(logs):
        # The self-check joined the gang of 4 on one host and reduced over shared memory.
        assert re.search(
            rf"gang rank={rank} size=4 local_rank={rank} local_size=4 .*local=shm .*result=ok",
            log,
        ), log
        assert "python=none" in log and "release=test image 1" in log, log
        assert "data=from the host" in log, log
        # The executor's /dev/shm, shared by the host's 4 tasks: their shm_mb summed.
        shm = re.search(r"shm=\S+\s+(\d+)\s", log)
        assert shm is not None and int(shm.group(1)) == 4 * SHM_MB, log
        visible = re.search(r"gpus=(\S*) nvidia=(\S*)", log)
        assert visible is not None and visible.group(1) == visible.group(2), log
        gpus.append(visible.group(1))
    # Each rank sees one GPU index of the host's 4, none shared.
    assert sorted(gpus) == ["0", "1", "2", "3"], gpus
    # The job shows the image it ran.
    got = peloton.client.get_job(job_id)
    assert got.spec.task.container.image == "base:1"


def test_a_volume_is_read_only_when_asked_and_the_image_entrypoint_runs(
    peloton: Peloton, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ro = job_pb2.Volume(container_path="/data", host_path=str(data), mode="ro")
    job_id = peloton.client.create_job(
        container_spec("base:1", "touch /data/x 2>/dev/null || echo read-only", 1, volumes=[ro])
    ).job_id
    assert peloton.wait_done(job_id).state == job_pb2.JOB_STATE_SUCCEEDED
    assert "read-only" in task_log(peloton.client, job_id, 0)
    assert not (data / "x").exists()
    # entrypoint "image": the image's ENTRYPOINT (/bin/echo entry) with args in place of its CMD.
    spec = container_spec("entry:1", "", 1, entrypoint="image")
    spec.task.container.args.extend(["from", "args"])
    job_id = peloton.client.create_job(spec).job_id
    assert peloton.wait_done(job_id).state == job_pb2.JOB_STATE_SUCCEEDED
    assert task_log(peloton.client, job_id, 0).strip() == "entry from args"


def test_an_unknown_image_fails_the_job_naming_the_image(peloton: Peloton) -> None:
    job_id = peloton.client.create_job(container_spec("team/nope:1.0", "true", 2)).job_id
    job = peloton.wait_done(job_id, timeout=60)
    assert job.state == job_pb2.JOB_STATE_FAILED, peloton.describe(job_id)
    assert job.reason == "image_not_found", job
    assert "image not found: team/nope:1.0" in job.message, job
    # The task whose launch failed says why; which one fails first (and so which its gang's
    # default executor kills, and peloton's gang failure the rest) is a race.
    tasks = peloton.client.list_tasks(job_id).tasks
    failed = [t for t in tasks if t.current.reason == "image_not_found"]
    assert failed, tasks
    assert all("image not found: team/nope:1.0" in t.current.message for t in failed), failed
