"""Task containers on real Mesos 1.11: peloton, unchanged, runs a job whose tasks ask for a
container (an image, a host-path volume, a /dev/shm, peloton's runtime mounted) on a local real
cluster, and the master records the containers peloton sent.

The local real agents have no image support (their executors are stand-ins that ignore
ContainerInfo and run the command on the host): this checks that the master accepts what
peloton sends and that peloton's lifecycle of a containerized job is unchanged, not that the task
runs in its image (tests/test_containers_e2e.py does that on the minicluster). The image names
need not exist anywhere.

The master's state shows each task's ContainerInfo as peloton sent it, with the proto defaults
``cached: true`` (on images) and ``share_cgroups: true`` (on linux_info) filled in. Neither the
master's state nor the agent's (which names only the executor's container id) shows the executor's
ContainerInfo (its /dev/shm): that it is accepted is all this shows of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mesos_support import PelotonFactory
from realcluster import RealCluster
from support import make_spec

from peloton.core.containers import DEFAULT_RUNTIME_IMAGE
from peloton.v1 import job_pb2

pytestmark = [pytest.mark.parametrize("backend", ["sqlite"]), pytest.mark.local_shape]

IMAGE = "base:1"
SHM_MB = 64


def _image(name: str) -> dict[str, Any]:
    """An Image as the master's state shows it."""
    return {"type": "DOCKER", "docker": {"name": name}, "cached": True}


def test_a_job_in_containers_succeeds_and_the_master_holds_its_containers(
    local_cluster: RealCluster, make_peloton: PelotonFactory, tmp_path: Path
) -> None:
    peloton = make_peloton(local_cluster)
    data = tmp_path / "data"
    data.mkdir()
    spec = make_spec(2, command="true", max_failures=0)
    container = spec.task.container
    container.image = IMAGE
    container.entrypoint = "shell"
    container.runtime = "peloton"
    container.shm_mb = SHM_MB
    container.volumes.append(job_pb2.Volume(container_path="/data", host_path=str(data), mode="ro"))
    job_id = peloton.client.create_job(spec).job_id
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, peloton.describe(job_id)

    framework_id = peloton.framework()["id"]
    ours = [t for t in local_cluster.tasks_of(framework_id) if t["id"].startswith(job_id)]
    assert len(ours) == 2, ours
    expected = {
        "type": "MESOS",
        "mesos": {"image": _image(IMAGE)},
        "volumes": [
            {"container_path": "/data", "mode": "RO", "host_path": str(data)},
            {
                "container_path": "/opt/peloton",
                "mode": "RO",
                "image": _image(DEFAULT_RUNTIME_IMAGE),
            },
        ],
        "linux_info": {"ipc_mode": "SHARE_PARENT", "share_cgroups": True},
    }
    for task in ours:
        assert task["state"] == "TASK_FINISHED", task
        assert task.get("container") == expected, task
