"""The launcher on the in-memory job ledger and an in-memory offer pool: no database, no Mesos.

What test_hostmgr_framework.py checks through pymesos and a scripted master, here in
milliseconds: a gang is recorded READY -> LAUNCHING with where it runs and launched as one
group per host with its ranks and peers; one that does not fit now goes back with the reason and
stays READY; one that never fits fails; a failed launch or a lost host leaves no lease behind and
the gang READY; a gang whose tasks were taken back meanwhile is not launched.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from daemon import wait_for
from ledger_memory import MemoryLedger
from support import FakeClock, RecordingKiller, make_spec
from test_hostmgr_framework import ListSource
from test_hostmgr_offers import raw_offer

from peloton.core.gang import Gang
from peloton.core.offers import HostOffers, LaunchTask, Lease, LeaseError
from peloton.core.records import JobRecord, Placement, TaskUpdate, attempt_id
from peloton.core.states import JobState, TaskState
from peloton.errors import Unavailable
from peloton.hostmgr.offers import OfferPool, parse_offer
from peloton.placement.launcher import CHUNK, Launcher
from peloton.v1 import job_pb2

T = TaskState
ALL_PORTS = ((1, 65535),)


class PoolHosts:
    """The launcher's Hosts over an OfferPool: every host offered whole, leases that do not
    expire, and launches recorded (or refused, with ``refuse``)."""

    def __init__(self, hosts: int, gpus: float = 4) -> None:
        self.offers = [
            parse_offer(raw_offer(f"o{i}", f"a{i}", f"h{i}", gpus=gpus), 0.0)
            for i in range(1, hosts + 1)
        ]
        self.pool = OfferPool(lease_seconds=3600)
        self.pool.add(self.offers)
        self.launched: list[Sequence[tuple[Lease, Sequence[LaunchTask]]]] = []
        self.demand: list[bool] = []
        self.refuse: Exception | None = None

    def snapshot(self) -> list[HostOffers]:
        return self.pool.snapshot()

    def totals(self) -> list[HostOffers]:
        return [
            HostOffers(o.hostname, o.agent_id, o.resources, ALL_PORTS, o.attributes)
            for o in self.offers
        ]

    def lease(self, agent_id: str) -> Lease | None:
        return self.pool.lease(agent_id, 0.0)

    def release(self, lease: Lease) -> None:
        self.pool.release(lease)

    def launch(self, shares: Sequence[tuple[Lease, Sequence[LaunchTask]]]) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.pool.take_for_launch([lease for lease, _ in shares], 0.0)
        self.launched.append(shares)

    def set_demand(self, demand: bool) -> None:
        self.demand.append(demand)


@pytest.fixture
def ledger() -> MemoryLedger:
    return MemoryLedger(clock=FakeClock(), killer=RecordingKiller())


def admitted(ledger: MemoryLedger, spec: job_pb2.JobSpec) -> tuple[JobRecord, Gang]:
    job, _ = ledger.create_job(spec)
    (instances,) = ledger.admit_pending([(job.id, spec.instances, "test")])
    return job, Gang.of_job(job.id, job.spec, instances, datetime.now(UTC))


def states(ledger: MemoryLedger, job_id: str) -> set[TaskState]:
    return {t.state for t in ledger.list_tasks(job_id)[0]}


def test_a_gang_is_recorded_and_launched_one_group_per_host(ledger: MemoryLedger) -> None:
    job, gang = admitted(ledger, make_spec(3, gpu=2, ports=["http"]))
    hosts = PoolHosts(2)
    source = ListSource([gang])
    assert Launcher(source, hosts, ledger).run_once() == 1
    assert source.returned == []
    assert hosts.demand == [True]

    ((first, a), (second, b)) = hosts.launched[0]
    assert (first.hostname, second.hostname) == ("h1", "h2")
    assert [t.task_id for t in a] == [attempt_id(job.id, 0, 1), attempt_id(job.id, 1, 1)]
    assert [t.task_id for t in b] == [attempt_id(job.id, 2, 1)]
    envs = [t.env for t in (*a, *b)]
    assert [e["PELOTON_RANK"] for e in envs] == ["0", "1", "2"]
    assert [(e["PELOTON_LOCAL_RANK"], e["PELOTON_LOCAL_SIZE"]) for e in envs] == [
        ("0", "2"),
        ("1", "2"),
        ("0", "1"),
    ]
    assert all(e["PELOTON_GANG_SIZE"] == "3" for e in envs)
    # A launch logged or shown never shows the gang's secret.
    assert all(t.env["PELOTON_GANG_SECRET"] not in repr(t) for t in (*a, *b))
    # Each rank's first port, from its host's offers; its named port is the next one.
    assert envs[0]["PELOTON_PEERS"] == "127.0.0.1:31000,127.0.0.1:31002,127.0.0.1:31000"
    assert envs[1]["PELOTON_PORT_HTTP"] == "31003"

    # Recorded with where each attempt runs, before the launch, in one change.
    tasks = {t.instance_id: t for t in ledger.list_tasks(job.id)[0]}
    assert {t.state for t in tasks.values()} == {T.LAUNCHING}
    assert (tasks[2].current.host, tasks[2].current.agent_id) == ("h2", "a2")
    assert tasks[0].current.executor_id and tasks[2].current.executor_id
    events = [(e.instance_id, e.to_state) for e in ledger.job_events(job.id) if e.instance_id == 2]
    assert [s for _, s in events] == ["READY", "PLACING", "PLACED", "LAUNCHING"]
    assert hosts.pool.leased_hosts() == set() and hosts.snapshot() == []


def test_gangs_placed_on_one_host_in_a_round_are_launched_with_one_acceptance_of_its_offers(
    ledger: MemoryLedger,
) -> None:
    """What a gang leaves of a host goes to the next gangs of its chunk: the host's offers are
    accepted once, with a task group per gang (each its own executor), on ports none of them
    shares (what one ACCEPT leaves is offered again only at the master's next allocation)."""
    jobs = [admitted(ledger, make_spec(1, gpu=1, ports=["http"])) for _ in range(2)]
    hosts = PoolHosts(1)
    assert Launcher(ListSource([gang for _, gang in jobs]), hosts, ledger).run_once() == 2
    (shares,) = hosts.launched
    assert len({lease.lease_id for lease, _ in shares}) == 1
    tasks = [task for _, group in shares for task in group]
    assert [t.task_id for t in tasks] == [attempt_id(job.id, 0, 1) for job, _ in jobs]
    ports = [p for t in tasks for p in t.ports]
    assert sorted(ports) == [31000, 31001, 31002, 31003]  # the host has 5
    assert [t.env["PELOTON_PORT_HTTP"] for t in tasks] == [str(t.ports[1]) for t in tasks]
    executors = {t.current.executor_id for job, _ in jobs for t in ledger.list_tasks(job.id)[0]}
    assert len(executors) == 2
    assert hosts.pool.leased_hosts() == set()


def test_a_host_shared_by_a_chunk_stays_leased_for_the_gangs_that_launch_and_is_freed_by_none(
    ledger: MemoryLedger,
) -> None:
    """A gang of a chunk refused at its record hands its share of a host back; the host's
    lease goes on to the launch of the others; a failed launch of gangs sharing a host releases
    its lease once and hands every gang back, READY."""
    jobs = [admitted(ledger, make_spec(1, gpu=2)) for _ in range(2)]
    ledger.preempt(jobs[0][0].id, "reclaimed")
    hosts = PoolHosts(1)
    source = ListSource([gang for _, gang in jobs])
    assert Launcher(source, hosts, ledger).run_once() == 1
    (shares,) = hosts.launched
    assert [t.task_id for _, group in shares for t in group] == [attempt_id(jobs[1][0].id, 0, 1)]
    assert [g.job_id for g, _ in source.returned] == [jobs[0][0].id]

    ledger2 = MemoryLedger(clock=FakeClock(), killer=RecordingKiller())
    jobs = [admitted(ledger2, make_spec(1, gpu=2)) for _ in range(2)]
    hosts = PoolHosts(1)
    hosts.refuse = LeaseError("lease on h1 (a1) lost an offer")
    source = ListSource([gang for _, gang in jobs])
    assert Launcher(source, hosts, ledger2).run_once() == 0
    assert [(g.job_id, why) for g, why in source.returned] == [
        (job.id, "launch failed: lease on h1 (a1) lost an offer") for job, _ in jobs
    ]
    assert hosts.pool.leased_hosts() == set() and len(hosts.snapshot()) == 1
    assert [states(ledger2, job.id) for job, _ in jobs] == [{T.READY}] * 2


def test_a_gang_that_does_not_fit_now_goes_back_with_the_reason_and_stays_ready(
    ledger: MemoryLedger,
) -> None:
    job, gang = admitted(ledger, make_spec(3, gpu=4))
    hosts = PoolHosts(3)
    assert hosts.pool.lease("a2", 0.0) is not None  # two hosts are taken by another placement
    assert hosts.pool.lease("a3", 0.0) is not None
    source = ListSource([gang])
    assert Launcher(source, hosts, ledger).run_once() == 0
    ((returned, reason),) = source.returned
    assert returned is gang
    assert reason == "needs 3 hosts with 4 free A100 GPUs; 1 host has them"
    assert states(ledger, job.id) == {T.READY}
    assert hosts.launched == []
    assert hosts.pool.leased_hosts() == {"a2", "a3"}  # none of its own left behind


def test_a_gang_no_hosts_could_ever_hold_fails_with_the_reason(ledger: MemoryLedger) -> None:
    job, gang = admitted(ledger, make_spec(3, gpu=4))
    source = ListSource([gang])
    assert Launcher(source, PoolHosts(1), ledger).run_once() == 0
    assert source.returned == []
    got = ledger.get_job(job.id)
    assert (got.state, got.reason) == (JobState.FAILED, "unplaceable")
    assert "no set of the cluster's hosts fits" in got.message
    assert states(ledger, job.id) == {T.FAILED}


def test_a_gang_that_waits_is_judged_again_when_the_cluster_shrinks(ledger: MemoryLedger) -> None:
    """A gang that would fit the empty cluster waits for room; once a host leaves the cluster
    it could never fit the rest, and fails with why."""
    job, gang = admitted(ledger, make_spec(2, gpu=4))
    hosts = PoolHosts(2)
    assert hosts.pool.lease("a2", 0.0) is not None  # another placement holds one host
    source = ListSource([gang])
    launcher = Launcher(source, hosts, ledger)
    assert launcher.run_once() == 0
    assert [why for _, why in source.returned] == [
        "needs 2 hosts with 4 free A100 GPUs; 1 host has them"
    ]
    assert states(ledger, job.id) == {T.READY}

    hosts.offers.pop()  # the held host leaves the cluster
    source.returned.clear()
    assert launcher.run_once() == 0
    assert source.returned == []
    got = ledger.get_job(job.id)
    assert (got.state, got.reason) == (JobState.FAILED, "unplaceable")


def test_a_failed_launch_releases_the_leases_and_requeues_the_gang_ready(
    ledger: MemoryLedger,
) -> None:
    job, gang = admitted(ledger, make_spec(2, gpu=4))
    hosts = PoolHosts(2)
    hosts.refuse = LeaseError("lease on h2 (a2) lost an offer")
    source = ListSource([gang])
    assert Launcher(source, hosts, ledger).run_once() == 0
    ((_, reason),) = source.returned
    assert reason == "launch failed: lease on h2 (a2) lost an offer"
    assert states(ledger, job.id) == {T.READY}
    task = ledger.list_tasks(job.id)[0][0]
    assert (task.current.attempt, task.current.reason) == (1, "requeued")
    assert hosts.pool.leased_hosts() == set()
    assert len(hosts.snapshot()) == 2  # offered again to the next round

    hosts.refuse = None  # the next round launches it, in the same attempt
    assert Launcher(source, hosts, ledger).run_once() == 1
    assert states(ledger, job.id) == {T.LAUNCHING}


def test_a_gang_taken_back_before_it_is_recorded_is_not_launched(ledger: MemoryLedger) -> None:
    job, gang = admitted(ledger, make_spec(2, gpu=4))
    ledger.preempt(job.id, "reclaimed")  # back to PENDING while the gang was in the queue
    hosts = PoolHosts(2)
    source = ListSource([gang])
    assert Launcher(source, hosts, ledger).run_once() == 0
    ((_, reason),) = source.returned
    assert reason == "2 tasks of the gang are no longer READY"
    assert hosts.launched == [] and hosts.pool.leased_hosts() == set()
    assert states(ledger, job.id) == {T.PENDING}


def test_a_round_whose_attempts_cannot_be_read_hands_every_gang_back_with_the_reason(
    ledger: MemoryLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round reads its gangs' attempts once; the database out then: nothing is placed,
    leased or launched, and every gang goes back with why, to be tried again."""
    jobs = [admitted(ledger, make_spec(2, gpu=4)) for _ in range(2)]
    hosts = PoolHosts(4)
    source = ListSource([gang for _, gang in jobs])

    def out(job_ids: object) -> dict[str, dict[int, int]]:
        raise Unavailable("the database is unreachable")

    monkeypatch.setattr(ledger, "ready_attempts", out)
    assert Launcher(source, hosts, ledger).run_once() == 0
    assert [(g.job_id, why) for g, why in source.returned] == [
        (job.id, "the database is unreachable") for job, _ in jobs
    ]
    assert hosts.launched == [] and hosts.pool.leased_hosts() == set()
    monkeypatch.undo()
    assert Launcher(source, hosts, ledger).run_once() == 2
    assert all(states(ledger, job.id) == {T.LAUNCHING} for job, _ in jobs)


def test_gangs_placed_together_are_recorded_in_one_write_and_one_taken_back_stays_out(
    ledger: MemoryLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round's placed gangs go to a worker CHUNK at a time and are recorded in one write;
    a gang whose tasks were taken back meanwhile is handed back with why, and the others of
    its write are launched."""
    jobs = [admitted(ledger, make_spec(1, gpu=4)) for _ in range(CHUNK + 1)]
    taken_back = jobs[1][0].id
    ledger.preempt(taken_back, "reclaimed")
    writes: list[list[str]] = []
    record = ledger.record_launches

    def counted(gangs: dict[str, dict[int, Placement]]) -> dict[str, str]:
        writes.append(list(gangs))
        return record(gangs)

    monkeypatch.setattr(ledger, "record_launches", counted)
    hosts = PoolHosts(CHUNK + 1)
    source = ListSource([gang for _, gang in jobs])
    assert Launcher(source, hosts, ledger).run_once() == CHUNK
    ((gang, reason),) = source.returned
    assert (gang.job_id, reason) == (taken_back, "1 tasks of the gang are no longer READY")
    # A launch per write: the gangs of a chunk are launched together.
    assert [len(shares) for shares in hosts.launched] == [CHUNK - 1, 1]
    assert [job_id for ids in writes for job_id in ids] == [
        job.id for job, _ in jobs if job.id != taken_back
    ]
    # The first CHUNK gangs went to one worker (the one taken back is refused before the
    # write: its attempt is no longer READY), the last to another.
    assert [len(ids) for ids in writes] == [CHUNK - 1, 1]
    for job, _ in jobs:
        assert states(ledger, job.id) == ({T.PENDING} if job.id == taken_back else {T.LAUNCHING})


def test_a_daemon_deposed_between_two_chunks_launches_none_of_the_second(
    ledger: MemoryLedger,
) -> None:
    """The launcher asks whether this daemon still leads right before each chunk's launch (after
    its record): one deposed meanwhile (paused, then resumed past its term) launches none of
    the chunk's gangs, and hands them back with why, their leases released."""
    jobs = [admitted(ledger, make_spec(1, gpu=4)) for _ in range(CHUNK + 2)]
    hosts = PoolHosts(CHUNK + 2)
    answers = iter([True])  # leads for the first launch only

    def leads() -> bool:
        return next(answers, False)

    source = ListSource([gang for _, gang in jobs])
    assert Launcher(source, hosts, ledger, leads=leads).run_once() == CHUNK
    assert [len(shares) for shares in hosts.launched] == [CHUNK]
    assert [(g.job_id, why) for g, why in source.returned] == [
        (job.id, "this daemon no longer leads: nothing launched") for job, _ in jobs[CHUNK:]
    ]
    assert hosts.pool.leased_hosts() == set()
    assert [states(ledger, job.id) for job, _ in jobs] == [{T.LAUNCHING}] * (CHUNK + 2)


def test_a_recorded_gang_reports_running_through_the_same_ledger(ledger: MemoryLedger) -> None:
    """What the host manager writes next (status updates) lands on what the launcher wrote."""
    job, gang = admitted(ledger, make_spec(2, gpu=4))
    assert Launcher(ListSource([gang]), PoolHosts(2), ledger).run_once() == 1
    ledger.update_tasks(job.id, [TaskUpdate(i, 1, T.RUNNING) for i in (0, 1)])
    got = ledger.get_job(job.id)
    assert (got.state, dict(got.task_counts)) == (JobState.RUNNING, {T.RUNNING: 2})
    hosts = {t.current.host for t in ledger.list_tasks(job.id)[0]}
    assert hosts == {"h1", "h2"}


class SlowHosts(PoolHosts):
    """Launches of the first job wait until ``go`` is set (a master slow to answer)."""

    def __init__(self, hosts: int) -> None:
        super().__init__(hosts)
        self.go = threading.Event()
        self.waiting = threading.Event()
        self.slow_job = ""

    def launch(self, shares: Sequence[tuple[Lease, Sequence[LaunchTask]]]) -> None:
        if shares[0][1][0].task_id.startswith(self.slow_job):
            self.waiting.set()
            self.go.wait(30)
        super().launch(shares)


def test_a_slow_launch_holds_up_no_gang_admitted_after_it(ledger: MemoryLedger) -> None:
    """The loop places the next gangs while earlier ones are still being launched (a round
    waited for all of its launches before the next round took new gangs)."""
    slow, slow_gang = admitted(ledger, make_spec(1, gpu=4))
    hosts = SlowHosts(2)
    hosts.slow_job = slow.id
    source = ListSource([slow_gang])
    launcher = Launcher(source, hosts, ledger, interval=0.05, workers=2)
    launcher.start()
    try:
        assert hosts.waiting.wait(10), "the first launch never started"
        fast, fast_gang = admitted(ledger, make_spec(1, gpu=4))
        source.gangs.append(fast_gang)
        launcher.wake()
        wait_for(
            lambda: bool(hosts.launched) and states(ledger, fast.id) == {T.LAUNCHING},
            10,
            "the gang admitted after the slow one launched",
            state=lambda: (states(ledger, fast.id), hosts.launched),
        )
        assert states(ledger, slow.id) == {T.LAUNCHING} and len(hosts.launched) == 1
    finally:
        hosts.go.set()
        launcher.stop()
    assert len(hosts.launched) == 2 and source.returned == []
