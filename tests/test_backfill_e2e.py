"""A placement-aware pool in the daemon: a ``peloton server`` process with a minicluster whose
agents run real processes. In a BACKFILL pool a gang the totals fit but no host can take (its GPU
model is busy) is not admitted (it holds none of the pool's share) and says why, while a gang
that fits the free hosts starts. Its reservation names the host and rack it will start on
once the gang holding its hosts is expected to end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import Peloton, start_minicluster, task_states, wait_for
from support import make_spec

from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2, pool_pb2

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])

AGENT = "cpus:8;mem:8192;disk:10000;gpus:4;ports:[31000-31100]"
SLEEP = "exec sleep 600"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    """One A100 host in rack r1 and one V100 host in rack r2, 4 GPUs each."""
    agents = [
        AgentSpec("a100", resources=AGENT, attributes="gpu_model:A100;rack:r1"),
        AgentSpec("v100", resources=AGENT, attributes="gpu_model:V100;rack:r2"),
    ]
    mc = start_minicluster(agents, tmp_path / "cluster")
    yield mc
    mc.stop()


def on_a100(spec: job_pb2.JobSpec) -> job_pb2.JobSpec:
    spec.task.constraints.add(attribute="gpu_model", op="eq", values=["A100"])
    return spec


def test_a_backfill_pool_admits_only_what_the_hosts_can_take(peloton: Peloton) -> None:
    pool = pool_pb2.PoolSpec(path="/bf", queue_policy=pool_pb2.QUEUE_POLICY_BACKFILL)
    peloton.client.create_pool(pool)
    client = peloton.client
    # The A100 host is full, for at most 10 minutes.
    holder = client.create_job(
        on_a100(
            make_spec(
                2,
                pool="/bf",
                command=SLEEP,
                gpu=2,
                kill_grace_seconds=0,
                max_runtime_seconds=600,
            )
        )
    ).job_id
    peloton.wait_running(holder)
    # 4 GPUs are free in all, on the V100 host: an A100 gang fits the totals, not the hosts.
    blocked = client.create_job(
        on_a100(make_spec(1, pool="/bf", command=SLEEP, gpu=2, name="blocked"))
    ).job_id
    anywhere = client.create_job(
        make_spec(1, pool="/bf", command=SLEEP, gpu=2, name="anywhere", kill_grace_seconds=0)
    ).job_id
    peloton.wait_running(anywhere)

    def reserved() -> job_pb2.Job | None:
        job = client.get_job(blocked)
        return job if job.reason == "reserved" else None

    job = wait_for(
        reserved, 30, "the A100 gang's reservation", interval=0.1,
        state=lambda: peloton.describe(blocked),
    )  # fmt: skip
    assert "placement now:" in job.message and "A100" in job.message, job.message
    # It starts when the holder is expected to end, on the A100 host.
    assert " on 1 host in rack r1 (needs " in job.message, job.message
    # Not admitted: its task still PENDING, holding nothing.
    assert task_states(peloton, blocked) == {0: "TASK_STATE_PENDING"}
    # Once the A100 host frees up, it is admitted and placed there.
    client.kill_job(holder)
    peloton.wait_running(blocked)
    for j in (blocked, anywhere):
        client.kill_job(j)
