"""Run-as users on a real Mesos master (``mesos``: ``PELOTON_TEST_MESOS_MASTER`` or a local real
cluster of two agents) through a ``peloton server`` process with a ``run_as_file``: a job's
tasks are launched as its user, and a user its caller may not use is refused before anything
reaches Mesos.

The master's record of each task names the user it runs as (``Task.user``, from the TaskInfo's
``CommandInfo.user``): that is what the real master and agents take from peloton. The tests that
make Unix users run on a local real cluster (``local_cluster``: the users exist only on this
machine, so an operator's agents could not run them); its executors are stand-ins that ignore the
user (they run every task as the user who started the cluster, see tests/mesos/mesos_support.py),
so the switch itself is shown by the minicluster (tests/test_runas.py), which does what a
``--switch_user`` agent running as root does.
"""

from __future__ import annotations

import getpass
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from mesos_support import MesosPeloton, PelotonFactory
from realcluster import RealCluster
from support import make_spec

from peloton.client import ClientError
from peloton.v1 import job_pb2

pytestmark = pytest.mark.parametrize("backend", ["postgresql"])


@pytest.fixture
def users() -> Iterator[Callable[[], str]]:
    """``users()``: a new Unix user (no home) of this machine, where the local cluster's agents
    run; removed after the test."""
    made: list[str] = []

    def make() -> str:
        name = f"pt{uuid.uuid4().hex[:10]}"
        subprocess.run(["useradd", "--no-create-home", name], check=True, capture_output=True)
        made.append(name)
        return name

    yield make
    for name in made:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def _daemon(make_peloton: PelotonFactory, mesos: RealCluster, tmp_path: Path, rules: Any) -> Any:
    path = tmp_path / "run-as.yaml"
    path.write_text(yaml.safe_dump(rules))
    return make_peloton(mesos, "--run-as-file", str(path))


def _tasks_of(peloton: MesosPeloton, mesos: RealCluster, job_id: str) -> list[dict[str, Any]]:
    framework_id = peloton.framework()["id"]
    return [t for t in mesos.tasks_of(framework_id) if t["id"].startswith(job_id)]


def test_a_jobs_tasks_are_launched_as_its_user(
    make_peloton: PelotonFactory,
    local_cluster: RealCluster,
    tmp_path: Path,
    users: Callable[[], str],
) -> None:
    mesos = local_cluster
    user = users()
    # Without authentication every caller is anonymous: the file's entries for it apply.
    peloton = _daemon(make_peloton, mesos, tmp_path, [{"users": ["anonymous"], "run_as": [user]}])
    spec = make_spec(2, command="id -un", gpu=0)
    spec.user = user
    job_id = peloton.client.create_job(spec).job_id
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    assert job.spec.user == user
    tasks = _tasks_of(peloton, mesos, job_id)
    assert len(tasks) == 2, tasks
    assert {t["user"] for t in tasks} == {user}, tasks


def test_a_job_without_a_user_runs_as_the_frameworks(
    peloton: MesosPeloton, mesos: RealCluster
) -> None:
    job_id = peloton.submit("id -un", 1, gpu=0)
    assert peloton.wait_done(job_id).state == job_pb2.JOB_STATE_SUCCEEDED
    tasks = _tasks_of(peloton, mesos, job_id)
    # No CommandInfo.user: the master records none, and the framework's user applies.
    assert len(tasks) == 1 and "user" not in tasks[0], tasks
    assert peloton.framework()["user"] == getpass.getuser()


def test_a_user_the_caller_may_not_use_is_refused_before_mesos_sees_it(
    make_peloton: PelotonFactory,
    local_cluster: RealCluster,
    tmp_path: Path,
    users: Callable[[], str],
) -> None:
    mesos = local_cluster
    allowed, other = users(), users()
    peloton = _daemon(
        make_peloton, mesos, tmp_path, [{"users": ["anonymous"], "run_as": [allowed]}]
    )
    spec = make_spec(1, command="id -un", gpu=0, name="refused")
    spec.user = other
    with pytest.raises(ClientError) as info:
        peloton.client.create_job(spec)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert info.value.details == f"anonymous may not run tasks as {other}"
    assert peloton.client.list_jobs().jobs == []
    framework_id = peloton.framework()["id"]
    assert mesos.tasks_of(framework_id) == []
