"""Agents of given shapes, on local real clusters (``local_shape``): static reservations for
peloton's role, and agents that share a hostname."""

from __future__ import annotations

import pytest
from daemon import run_peloton, wait_for
from mesos_support import PelotonFactory, RealClusterFactory, agent_resources
from realcluster import RealCluster
from support import make_spec

from peloton.v1 import job_pb2

pytestmark = [pytest.mark.parametrize("backend", ["postgresql"]), pytest.mark.local_shape]

RESERVED = "gpus(gpu):2;cpus(gpu):4;mem(gpu):8192;cpus:4;mem:8192;disk:20000"


def every_offer_answered(cluster: RealCluster, framework_id: str) -> None:
    """Wait until the master holds no offer of the framework and every offer it sent was
    accepted or declined (none dropped)."""

    def state() -> dict[str, float]:
        metrics = cluster.framework_metrics(framework_id)
        return {
            "outstanding": cluster.outstanding_offers(framework_id),
            "unanswered": metrics["offers/sent"]
            - metrics["offers/accepted"]
            - metrics["offers/declined"],
        }

    wait_for(
        lambda: state() == {"outstanding": 0, "unanswered": 0},
        30,
        "every offer accepted or declined",
        interval=0.2,
        state=state,
    )


def test_a_gang_runs_on_resources_reserved_for_the_role_and_unreserved_ones(
    real_cluster: RealClusterFactory, make_peloton: PelotonFactory
) -> None:
    cluster = real_cluster(
        agents=2,
        per_agent={i: {"resources": agent_resources(i, RESERVED)} for i in range(2)},
    )
    peloton = make_peloton(cluster, "--mesos-role", "gpu")
    # Each task takes an agent's reserved GPUs, cpus and mem, and unreserved cpus and mem on top.
    spec = make_spec(2, command="true", gpu=2)
    spec.task.resources.cpu = 6
    spec.task.resources.mem_mb = 10240
    job_id = peloton.client.create_job(spec).job_id
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    framework = peloton.framework()
    assert framework["roles"] == ["gpu"] and "MULTI_ROLE" in framework["capabilities"], framework
    tasks = [t for t in cluster.tasks_of(framework["id"]) if t["id"].startswith(job_id)]
    assert sorted(t["state"] for t in tasks) == ["TASK_FINISHED"] * 2, tasks
    assert len({t["slave_id"] for t in tasks}) == 2, tasks
    every_offer_answered(cluster, framework["id"])


def test_agents_that_share_a_hostname_are_hosts_of_their_own(
    real_cluster: RealClusterFactory, make_peloton: PelotonFactory
) -> None:
    cluster = real_cluster(
        agents=3,
        hostname="node-a",
        per_agent={
            i: {"resources": agent_resources(i, "cpus:4;mem:8192;disk:10000;gpus:2")}
            for i in range(3)
        },
    )
    assert [a["hostname"] for a in cluster.agents()] == ["node-a"] * 3
    peloton = make_peloton(cluster)
    job_id = peloton.submit("true", 3, gpu=2)  # every GPU of all three agents
    job = peloton.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
    framework_id = peloton.framework()["id"]
    tasks = [t for t in cluster.tasks_of(framework_id) if t["id"].startswith(job_id)]
    assert len({t["slave_id"] for t in tasks}) == 3, tasks
    hosts = run_peloton("host", "list", server=peloton.proc.address)
    assert hosts.returncode == 0, hosts.stderr
    assert hosts.stdout.count("node-a") == 3, hosts.stdout
    every_offer_answered(cluster, framework_id)
