"""The checks of ``tests/mesos_fidelity.py`` on real Mesos 1.11: what the minicluster is held to
(``tests/test_minicluster_fidelity.py`` runs the same functions on it).

The framework-user, bad-executor and Docker-container checks run on ``PELOTON_TEST_MESOS_MASTER``
when set (their tasks are dropped by the agents or refused by the master: nothing runs); the
others need agents of a given shape and start local real clusters. The task-container check is
one of those: the local agents have no image support (their executors ignore ContainerInfo and
run the command on the host), so it shows that the master accepts the containers peloton sends
and the tasks run, where an operator's agents would need the test images. What the local real
cluster cannot show (tasks switched to the framework's user: its executors are stand-ins that
ignore the user; tasks run in their images) stays on the minicluster.
"""

from __future__ import annotations

from pathlib import Path

import mesos_fidelity as fidelity
import pytest
from mesos_support import RealClusterFactory
from realcluster import RealCluster

RESERVED = {0: {"resources": fidelity.RESERVED_AGENT, "hostname": fidelity.RESERVED_HOSTNAME}}
SHARED = {
    0: {"hostname": fidelity.SHARED_HOSTNAME},
    1: {"hostname": fidelity.SHARED_HOSTNAME},
    2: {"hostname": "node-c"},
}


@pytest.mark.parametrize("partition_aware", [True, False])
@pytest.mark.parametrize("user", ["", fidelity.NO_SUCH_USER])
def test_an_empty_or_unknown_user_fails_every_executor(
    mesos: RealCluster, user: str, partition_aware: bool
) -> None:
    fidelity.check_unknown_user_fails_every_executor(mesos.master, user, partition_aware)


@pytest.mark.parametrize("partition_aware", [True, False])
def test_an_unknown_task_is_reconciled_unknown(mesos: RealCluster, partition_aware: bool) -> None:
    fidelity.check_an_unknown_task_is_reconciled_unknown(mesos.master, partition_aware)


def test_bad_executors_and_agents_are_refused(mesos: RealCluster) -> None:
    fidelity.check_bad_executors_and_agents_are_refused(mesos.master)


def test_docker_containers_in_a_task_group_are_refused(mesos: RealCluster) -> None:
    fidelity.check_docker_containers_in_a_task_group_are_refused(mesos.master)


@pytest.mark.local_shape
def test_the_current_user_runs(real_cluster: RealClusterFactory) -> None:
    fidelity.check_known_user_runs(real_cluster(resources=fidelity.PLAIN_AGENT).master)


@pytest.mark.local_shape
def test_task_groups_share_one_accept(real_cluster: RealClusterFactory) -> None:
    cluster = real_cluster(resources=fidelity.PLAIN_AGENT)
    fidelity.check_task_groups_share_one_accept(cluster.master)


@pytest.mark.local_shape
def test_containers_of_a_task_group_run(real_cluster: RealClusterFactory, tmp_path: Path) -> None:
    cluster = real_cluster(resources=fidelity.PLAIN_AGENT)
    host_dir = tmp_path / "volume"
    host_dir.mkdir()
    fidelity.check_containers_of_a_task_group_run(cluster.master, "base:1", "data:1", str(host_dir))


@pytest.mark.local_shape
def test_agents_sharing_a_hostname_are_each_offered(real_cluster: RealClusterFactory) -> None:
    cluster = real_cluster(agents=3, resources=fidelity.PLAIN_AGENT, per_agent=SHARED)
    fidelity.check_agents_sharing_a_hostname_are_each_offered(cluster.master)


@pytest.fixture(name="reserved")
def fixture_reserved(real_cluster: RealClusterFactory) -> RealCluster:
    """Agent 0 with fidelity.RESERVED_AGENT, agent 1 with fidelity.PLAIN_AGENT."""
    return real_cluster(agents=2, resources=fidelity.PLAIN_AGENT, per_agent=RESERVED)


@pytest.mark.local_shape
def test_reserved_resources_are_offered_as_reserved(reserved: RealCluster) -> None:
    fidelity.check_reserved_resources_are_offered_as_reserved(reserved.master)


@pytest.mark.local_shape
def test_reservations_are_not_offered_to_other_roles(reserved: RealCluster) -> None:
    fidelity.check_reservations_are_not_offered_to_other_roles(reserved.master)


@pytest.mark.local_shape
def test_launch_takes_resources_as_offered(reserved: RealCluster) -> None:
    fidelity.check_launch_takes_resources_as_offered(reserved.master)


@pytest.mark.local_shape
def test_launch_not_as_offered_is_refused(reserved: RealCluster) -> None:
    fidelity.check_launch_not_as_offered_is_refused(reserved.master)
