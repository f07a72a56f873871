"""Several ``peloton server`` processes on one PostgreSQL database, frameworks of a real Mesos
master under one name (issue 19): the leader is SIGKILLed while a burst of gangs is launched and
run; the other daemon takes the lease over within its time to live and re-subscribes with the
framework id on the database (a failover at the master: the same framework, never a new one, nor
the old one torn down); every job succeeds, each Mesos task id was launched once and is an attempt
the jobs name, and the tasks that ran at the kill ran through it. A job sent to the new leader
afterwards runs too.

tests/test_several_daemons.py tests the election and the same burst on peloton's minicluster;
this is the takeover against the real master's failover, reconciliation and status-update
machinery. It kills a daemon and needs eight GPUs on two agents: ``disruptive`` and
``local_shape`` (always its own local real cluster).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from daemon import DONE, run_peloton, scrape_metrics, wait_for
from mesos_support import MesosPeloton
from realcluster import RealCluster
from support import make_spec

from peloton.v1 import job_pb2

pytestmark = [
    pytest.mark.parametrize("backend", ["postgresql"]),
    pytest.mark.disruptive,
    pytest.mark.local_shape,
]

TTL = 3.0
RENEW = 0.5
# A follower takes over at most a renewal after the lease expired; the rest is for a busy machine.
TAKEOVER_SECONDS = TTL + RENEW + 5
START_SECONDS = 30
# The log line of a daemon whose scheduling components started (it leads).
SCHEDULES = "this daemon schedules now"
# Six gangs of two 1-GPU tasks on two agents of four GPUs: four run at once, two wait for them.
# A task sleeps longer than a takeover takes, so those running at the kill run through it.
BURST = 6
COMMAND = "sleep 8"
BURST_SECONDS = 150


def daemon_args(daemon_id: str) -> list[str]:
    """Its id and the short lease (reconciliation every 5 s, as in the rest of the suite: also
    while gangs are being launched, whose ACCEPTs it must not overtake)."""
    return [
        "--daemon-id",
        daemon_id,
        "--leader-lease-ttl-seconds",
        str(TTL),
        "--leader-lease-renew-seconds",
        str(RENEW),
        "--reconcile-interval-seconds",
        "5",
    ]


def teardown(cluster: RealCluster, name: str) -> None:
    """Tear down every framework of that name at the master (their tasks end with them)."""
    for fw in cluster.frameworks():
        if fw["name"] == name:
            cluster.teardown(fw["id"])


def stop_all(cluster: RealCluster, name: str, daemons: dict[str, MesosPeloton]) -> None:
    """Kill every daemon, then tear their framework down: a daemon still running would subscribe
    again, as a new framework, once the master removed its own."""
    with ExitStack() as stack:  # each one done, even if another fails; the teardown last
        stack.callback(teardown, cluster, name)
        for p in daemons.values():
            stack.callback(p.proc.close)
            stack.callback(p.client.close)


@pytest.fixture
def daemons(
    db_url: str, tmp_path: Path, local_cluster: RealCluster
) -> Iterator[dict[str, MesosPeloton]]:
    """Daemons a (the first leader) and b on one database, frameworks of the local real cluster
    under one name; killed and their framework torn down after the test (before the cluster
    stops: this depends on ``local_cluster``)."""
    name = f"peloton-test-ha-{uuid.uuid4().hex[:8]}"
    procs: dict[str, MesosPeloton] = {}
    try:
        a = procs["a"] = MesosPeloton(
            db_url, local_cluster, tmp_path / "a", daemon_args("a"), framework_name=name
        )
        # b starts once a schedules: a leads, and created the /default pool that b reads (two
        # daemons starting at once on a new database both create it, and one exits).
        wait_for(
            lambda: SCHEDULES in a.proc.stderr,
            START_SECONDS,
            "a to schedule",
            state=lambda: a.proc.stderr,
        )
        procs["b"] = MesosPeloton(
            db_url, local_cluster, tmp_path / "b", daemon_args("b"), framework_name=name
        )
        yield procs
    finally:
        stop_all(local_cluster, name, procs)


def cluster_status(db_url: str) -> dict[str, Any]:
    ttl = ["--leader-lease-ttl-seconds", str(TTL)]
    result = run_peloton("cluster", "status", "--db-url", db_url, *ttl, "-o", "json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def gauge(p: MesosPeloton, name: str) -> float:
    return scrape_metrics(p.proc.metrics_port)[(name, ())]


def wait_leader(db_url: str, among: dict[str, MesosPeloton], timeout: float) -> str:
    """The one daemon of ``among`` that both the database and its own gauge say leads."""

    def one() -> str | None:
        leaders = [name for name, p in among.items() if gauge(p, "peloton_leader") == 1]
        return leaders[0] if leaders == [cluster_status(db_url)["leader"]] else None

    return wait_for(
        one,
        timeout,
        "exactly one leader",
        interval=0.1,
        state=lambda: (
            {name: gauge(p, "peloton_leader") for name, p in among.items()},
            cluster_status(db_url),
        ),
    )


def named(cluster: RealCluster, name: str) -> dict[str, list[dict[str, Any]]]:
    """The master's frameworks of that name: registered (connected or not) and completed."""
    state = cluster.state()
    return {
        key: [f for f in state[key] if f["name"] == name]
        for key in ("frameworks", "completed_frameworks")
    }


def subscribed(cluster: RealCluster, name: str) -> str | None:
    """The id of the one framework of that name, once the master has it connected and active."""
    ours = named(cluster, name)["frameworks"]
    if len(ours) == 1 and ours[0]["connected"] and ours[0]["active"]:
        return str(ours[0]["id"])
    return None


def master_tasks(cluster: RealCluster, framework_id: str) -> list[dict[str, Any]]:
    """Every task the master knows of the framework (active, unreachable, completed)."""
    return cluster.tasks_of(framework_id)


def attempts(p: MesosPeloton, job_ids: list[str]) -> dict[str, job_pb2.Attempt]:
    """Every attempt the jobs name, current and earlier ones, by id (its Mesos task id)."""
    return {
        a.attempt_id: a
        for job_id in job_ids
        for t in p.client.list_tasks(job_id).tasks
        for a in (*t.history, t.current)
    }


def wait_all_done(p: MesosPeloton, job_ids: list[str]) -> None:
    """Every job ended, and succeeded (each job described on timeout)."""
    wait_for(
        lambda: all(p.client.get_job(j).state in DONE for j in job_ids),
        BURST_SECONDS,
        "every job to end",
        interval=0.5,
        state=lambda: "\n".join(p.describe(j) for j in job_ids),
    )
    states = {j: job_pb2.JobState.Name(p.client.get_job(j).state) for j in job_ids}
    assert set(states.values()) == {"JOB_STATE_SUCCEEDED"}, [p.describe(j) for j in job_ids]


def test_a_killed_leader_mid_burst_is_replaced_on_the_same_framework_and_every_task_runs_once(
    db_url: str, local_cluster: RealCluster, daemons: dict[str, MesosPeloton]
) -> None:
    name = daemons["a"].framework_name
    leader = wait_leader(db_url, daemons, TAKEOVER_SECONDS)
    assert leader == "a"
    follower = "b"
    framework_id = wait_for(
        lambda: subscribed(local_cluster, name),
        START_SECONDS,
        f"the leader's framework {name} subscribed",
        interval=0.1,
        state=lambda: named(local_cluster, name),
    )
    # Only the leader subscribes.
    assert gauge(daemons[follower], "peloton_mesos_connected") == 0
    assert SCHEDULES not in daemons[follower].proc.stderr
    epoch = cluster_status(db_url)["lease"]["epoch"]

    # A gang the old leader had written launched, and was killed before it sent the ACCEPT, is
    # reconciled lost and restarts: after a second, not the default 30.
    spec = make_spec(2, name="burst", command=COMMAND, gpu=1, backoff_seconds=1)
    clients = [daemons["a"].client, daemons["b"].client]
    job_ids = [clients[i % 2].create_job(spec).job_id for i in range(BURST)]

    def running_now() -> set[str] | None:
        tasks = master_tasks(local_cluster, framework_id)
        return {t["id"] for t in tasks if t["state"] == "TASK_RUNNING"} or None

    running = wait_for(
        running_now,
        START_SECONDS,
        "a task of the burst running at the master",
        interval=0.05,
        state=lambda: master_tasks(local_cluster, framework_id),
    )
    killed_at, killed_wall = time.monotonic(), datetime.now(UTC)
    daemons[leader].proc.kill()
    rest = {follower: daemons[follower]}

    # Seen through `peloton cluster status` and the metrics, whose every look takes a second or
    # more on a busy machine: the bound is on when the lease was taken, below.
    assert wait_leader(db_url, rest, TAKEOVER_SECONDS + START_SECONDS) == follower
    led_after = time.monotonic() - killed_at
    status = cluster_status(db_url)
    assert status["lease"]["epoch"] == epoch + 1, status
    # When it took the lease over, on the database's clock (this machine's): the lease's time to
    # live after the last renewal, and at most a renewal more.
    acquired = datetime.fromisoformat(status["lease"]["acquired_at"])
    acquired = acquired if acquired.tzinfo else acquired.replace(tzinfo=UTC)
    took_lease_after = (acquired - killed_wall).total_seconds()
    assert took_lease_after <= TAKEOVER_SECONDS, status
    new = daemons[follower]

    def resubscribed() -> bool:
        connected = gauge(new, "peloton_mesos_connected") == 1
        return connected and subscribed(local_cluster, name) is not None

    # It fails the framework over: the same id, re-subscribed (the master never removed it).
    wait_for(
        resubscribed,
        START_SECONDS,
        "the new leader subscribed to the master",
        interval=0.1,
        state=lambda: (gauge(new, "peloton_mesos_connected"), named(local_cluster, name)),
    )
    subscribed_after = time.monotonic() - killed_at
    assert subscribed(local_cluster, name) == framework_id, named(local_cluster, name)
    # The master's own account: the framework it registered before the kill re-registered after.
    fw = local_cluster.framework(framework_id)
    assert fw["registered_time"] < killed_wall.timestamp() < fw.get("reregistered_time", 0), fw
    reregistered_after = fw["reregistered_time"] - killed_wall.timestamp()
    wait_all_done(new, job_ids)
    done_after = time.monotonic() - killed_at

    # One framework of the name, the first one, never torn down.
    ours = named(local_cluster, name)
    assert [f["id"] for f in ours["frameworks"]] == [framework_id], ours
    assert ours["completed_frameworks"] == [], ours
    tasks = master_tasks(local_cluster, framework_id)
    twice = {t: n for t, n in Counter(t["id"] for t in tasks).items() if n > 1}
    assert not twice, f"task ids launched more than once: {twice}"
    # Each task id at the master is an attempt of the jobs, and each current one is there. An
    # earlier attempt the master never had was written launched by the old leader, which died
    # before its ACCEPT reached the master: the new leader's reconciliation found it unknown, so
    # it ended lost (its gang restarted on new attempts) rather than being launched again.
    of_jobs = attempts(new, job_ids)
    at_master = {t["id"] for t in tasks}
    assert at_master <= set(of_jobs), (sorted(at_master - set(of_jobs)), tasks)
    current = {t.current.attempt_id for j in job_ids for t in new.client.list_tasks(j).tasks}
    assert current <= at_master, (sorted(current - at_master), tasks)
    never = {i: a for i, a in of_jobs.items() if i not in at_master}
    for attempt in never.values():
        assert attempt.state == job_pb2.TASK_STATE_LOST, attempt
        assert "unknown" in attempt.message, attempt
    assert {t["state"] for t in tasks} == {"TASK_FINISHED"}, tasks
    # The tasks running at the kill ran through it: their first attempt, not launched again,
    # succeeded.
    by_attempt = {t.current.attempt_id: t for j in job_ids for t in new.client.list_tasks(j).tasks}
    for task_id in running:
        task = by_attempt.get(task_id)
        assert task is not None, (task_id, sorted(by_attempt))
        assert task.current.attempt == 1 and not task.history, task
        assert task.current.state == job_pb2.TASK_STATE_SUCCEEDED, task

    # The new leader runs a job sent to it, on the same framework.
    job_id = new.submit("true", 2)
    job = new.wait_done(job_id)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, new.describe(job_id)
    last = {t["id"]: t["state"] for t in master_tasks(local_cluster, framework_id)}
    assert {i: s for i, s in last.items() if i.startswith(job_id)} == {
        f"{job_id}-{i}-1": "TASK_FINISHED" for i in range(2)
    }, last
    assert subscribed(local_cluster, name) == framework_id, named(local_cluster, name)

    latest = Counter(t.current.attempt for t in by_attempt.values())
    print(
        f"\ntakeover: {len(running)} tasks running at the kill; lease taken after "
        f"{took_lease_after:.2f}s, seen leading after {led_after:.2f}s, "
        f"seen subscribed after {subscribed_after:.2f}s (re-registered at the master after "
        f"{reregistered_after:.2f}s), every job done after {done_after:.2f}s; "
        f"framework {framework_id} kept; current attempts {dict(latest)}; attempts never "
        f"launched (lost in the kill) {len(never)}"
    )
