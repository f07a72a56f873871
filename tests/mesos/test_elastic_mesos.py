"""Elastic gangs (``gang: {min_instances, max_instances}``) on a real Mesos 1.11 cluster, through a
``peloton server`` process whose rendezvous endpoints the ranks train against with
:mod:`peloton.collective.elastic`: what tests/test_elastic_e2e.py checks on the minicluster, with
the same deterministic trainer and checks (tests/elastic_support.py), on real master and agent
code and Mesos's default executor (a host's share of a gang is one task group; each rank a gang
grows by is a group of its own).

- A gang of 2 to 4 one-GPU ranks starts with 2 while another job holds the other agent's GPUs,
  grows to 4 when that job ends, shrinks to 3 when a rank is SIGKILLed (the survivors go on from
  the last commit) and succeeds with exactly the parameters its steps imply.
- A gang at 4 is shrunk to 2 by a higher-priority gang: its 2 highest instances are drained (they
  end KILLED or SUCCEEDED, never FAILED), its first ranks are not restarted, and it succeeds with
  every step applied once.

The trainer takes only the steps the test allows (a file in the test's directory) and the test
kills a rank's process by its pid: the agents must be on this machine, so these run on a local
cluster of their own, of 2 agents of 2 GPUs whose hostnames resolve nowhere (ranks reach each
other and the endpoint by address, never by an agent's hostname).
"""

from __future__ import annotations

from pathlib import Path

import elastic_support as es
import pytest
from mesos_support import PelotonFactory, RealClusterFactory, agent_resources
from realcluster import RealCluster
from test_disruptions import our_tasks

from peloton.v1 import job_pb2

pytestmark = [
    pytest.mark.parametrize("backend", ["postgresql"]),
    pytest.mark.disruptive,
    pytest.mark.local_shape,
]

AGENT = "cpus:4;mem:8192;disk:10000;gpus:2"
# Steps allowed at 2 ranks; then at 4 up to the SIGKILL (commits every 4 steps: the last one
# before it at 12, so steps 12 and 13 are lost and redone at 3); TOTAL (18) in all.
AT_2, AT_4 = 6, 14
SUCCEEDED = (1, "TASK_STATE_SUCCEEDED")


@pytest.fixture
def cluster(real_cluster: RealClusterFactory) -> RealCluster:
    """Two agents of 2 GPUs, ``agent-0`` and ``agent-1`` (names no resolver knows)."""
    return real_cluster(
        agents=2,
        per_agent={
            i: {"hostname": f"agent-{i}", "resources": agent_resources(i, AGENT, ports=100)}
            for i in range(2)
        },
    )


def test_an_elastic_gang_grows_into_freed_gpus_and_survives_a_sigkilled_rank(
    make_peloton: PelotonFactory, cluster: RealCluster, tmp_path: Path
) -> None:
    peloton = make_peloton(cluster)
    out = es.out_dir(tmp_path)
    # Another job holds one agent's 2 GPUs until the test lets it end.
    release = out / "release-blocker"
    blocker = peloton.client.create_job(
        es.spec("blocker", es.holder(tmp_path, release), instances=1, gpu=2)
    ).job_id
    peloton.wait_running(blocker)

    # A failed rank may rejoin only after 300 s: the gang goes on without it to the end.
    job_id = peloton.client.create_job(
        es.spec(
            "elastic",
            es.worker(tmp_path, out),
            elastic=(2, 4),
            max_failures=1,
            backoff_seconds=300,
        )
    ).job_id
    events = es.Events(peloton.proc.address, job_id)
    try:
        # Only 2 fit: the gang starts with instances 0 and 1 on the free agent. The other job
        # ends: the gang grows into its GPUs, to 4, over both agents.
        es.starts_small_and_grows(peloton, events, job_id, out, (2, 4), blocker, release, AT_2)
        hosts = {t.current.host for t in peloton.client.list_tasks(job_id).tasks}
        assert hosts == {"agent-0", "agent-1"}, hosts
        es.allow(out, AT_4)
        es.wait_step(out, AT_4 - 1, 4, peloton, job_id)

        # SIGKILL of instance 3 (a rank the gang grew by: alone in its task group) between
        # commits: the survivors restore the last one, re-form at 3 and redo steps 12 and 13.
        es.sigkilled(peloton, events, job_id, out, 3, 4, AT_4 - 1)
        job = es.finish(peloton, job_id, out)
    finally:
        events.close()

    es.trained(out)
    last = {step: size for _, size, step in es.steps_log(out)}
    assert last == {s: 2 if s < AT_2 else 4 if s < 12 else 3 for s in range(es.TOTAL)}, last
    applied = [(size, step) for _, size, step in es.steps_log(out)]
    assert applied.count((4, 12)) == applied.count((3, 12)) == 1, applied
    assert (job.elastic.size, job.elastic.generation) == (3, es.steps_log(out)[-1][0]), job.elastic
    assert len(events.resizes()) == job.elastic.generation, events.resizes()
    tasks = es.attempts(peloton, job_id)
    assert {i: tasks[i] for i in range(3)} == dict.fromkeys(range(3), SUCCEEDED), tasks
    failed = peloton.client.get_task(job_id, 3).task
    assert failed.history[0].state == job_pb2.TASK_STATE_FAILED, failed
    # Its next attempt, waiting out the backoff, was killed when the gang finished.
    assert (failed.current.state, failed.current.reason) == (
        job_pb2.TASK_STATE_KILLED,
        "gang_finished",
    ), failed.current
    # The master ran each first attempt once, and no other.
    ran = {f"{job_id}-{i}-1": "TASK_FINISHED" for i in range(3)}
    assert our_tasks(peloton, job_id) == {**ran, f"{job_id}-3-1": "TASK_FAILED"}


def test_a_higher_priority_gang_drains_an_elastic_gangs_highest_ranks(
    make_peloton: PelotonFactory, cluster: RealCluster, tmp_path: Path
) -> None:
    peloton = make_peloton(cluster)
    out = es.out_dir(tmp_path)
    job_id = peloton.client.create_job(
        es.spec("elastic", es.worker(tmp_path, out), elastic=(2, 4), preemptible=True)
    ).job_id
    events = es.Events(peloton.proc.address, job_id)
    try:
        es.wait_size(peloton, job_id, 4)
        es.allow(out, AT_2)
        es.wait_step(out, AT_2 - 1, 4, peloton, job_id)
        # Instances 2 and 3 drained (KILLED or SUCCEEDED), 0 and 1 go on in their first attempt.
        urgent, flag = es.drained(peloton, events, job_id, tmp_path, out, 4, 2)
        job = es.finish(peloton, job_id, out)
        flag.touch()
        assert peloton.wait_done(urgent).state == job_pb2.JOB_STATE_SUCCEEDED
    finally:
        events.close()

    # Every step once, none lost: at 4 until the drain, at 2 after it.
    es.trained(out)
    applied = [(size, step) for _, size, step in es.steps_log(out)]
    assert applied == [(4 if s < AT_2 else 2, s) for s in range(es.TOTAL)], applied
    assert (job.elastic.size, job.elastic.generation) == (2, es.steps_log(out)[-1][0]), job.elastic
    tasks = es.attempts(peloton, job_id)
    assert {i: tasks[i] for i in (0, 1)} == dict.fromkeys((0, 1), SUCCEEDED), tasks
    # At the master: the first attempts only, the drained ones killed or finished.
    ran = our_tasks(peloton, job_id)
    assert sorted(ran) == [f"{job_id}-{i}-1" for i in range(4)], ran
    assert [ran[f"{job_id}-{i}-1"] for i in (0, 1)] == ["TASK_FINISHED"] * 2, ran
    assert {ran[f"{job_id}-{i}-1"] for i in (2, 3)} <= {"TASK_KILLED", "TASK_FINISHED"}, ran
