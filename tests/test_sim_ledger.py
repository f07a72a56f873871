"""The simulator's ledger keeps the job manager's rules: every task change is checked against
the state tables, all or nothing; the job's state is derived; the scheduler and the killer are
told after the change. And the production resource manager runs on it."""

from __future__ import annotations

import pytest

from peloton.core.pools import DEFAULT_POOL, PoolConfig
from peloton.core.resources import Resources
from peloton.core.states import TASK_TRANSITIONS, Goal, JobState, TaskState
from peloton.errors import AlreadyExists, FailedPrecondition, NotFound
from peloton.resmgr.manager import ResourceManager
from peloton.sim.ledger import PREEMPTED, UNPLACEABLE, SimLedger, SimPoolStore
from peloton.sim.trace import TraceJob, job_spec

T = TaskState


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _spec(tasks: int = 2, gpus: int = 1, priority: int = 0) -> object:
    return job_spec(TraceJob("x", 0, tasks, gpus, 4, 1024, 60, priority=priority))


@pytest.fixture
def ledger() -> tuple[SimLedger, list[str], list[tuple[str, tuple[int, ...]]]]:
    led = SimLedger(Clock())
    told: list[str] = []
    killed: list[tuple[str, tuple[int, ...]]] = []
    led.set_scheduler(told.append)
    led.set_killer(lambda job_id, ids: killed.append((job_id, ids)))
    return led, told, killed


def _states(led: SimLedger, job_id: str) -> list[TaskState]:
    return led.task_states(job_id)


def test_a_job_starts_pending_and_the_scheduler_is_told(ledger: tuple) -> None:
    led, told, _ = ledger
    job = led.create_job("j", _spec(3))
    assert job.state == JobState.PENDING
    assert dict(job.task_counts) == {T.PENDING: 3}
    assert told == ["j"]
    assert [j.id for j in led.unfinished_jobs()] == ["j"]
    with pytest.raises(AlreadyExists):
        led.create_job("j", _spec(1))


def test_admission_takes_the_lowest_pending_instances_whole_or_not_at_all(ledger: tuple) -> None:
    led, told, _ = ledger
    led.create_job("j", _spec(3))
    assert led.admit_pending([("j", 2, "admitted")]) == [(0, 1)]
    assert _states(led, "j") == [T.READY, T.READY, T.PENDING]
    assert led.get_job("j").reason == "admitted"
    # Fewer PENDING than asked: nothing moves.
    assert led.admit_pending([("j", 2, "again")]) == [()]
    assert _states(led, "j") == [T.READY, T.READY, T.PENDING]
    assert told[-1] == "j"


def test_launch_walks_the_launchers_path_and_the_job_runs(ledger: tuple) -> None:
    led, _, _ = ledger
    led.create_job("j", _spec(2))
    led.admit_pending([("j", 2, "")])
    job = led.launch("j", (0, 1), ("h1", "h2"))
    assert job.state == JobState.RUNNING
    assert _states(led, "j") == [T.RUNNING, T.RUNNING]
    assert led.hosts("j") == ["h1", "h2"]
    done = led.finish("j", (0, 1))
    assert done.state == JobState.SUCCEEDED
    assert led.unfinished_jobs() == []


def test_an_illegal_change_raises_and_changes_nothing(ledger: tuple) -> None:
    led, _, _ = ledger
    led.create_job("j", _spec(2))
    # PENDING -> PLACING is not in the table (a task must be admitted first).
    assert T.PLACING not in TASK_TRANSITIONS[T.PENDING]
    before = led.get_job("j")
    with pytest.raises(FailedPrecondition):
        led.launch("j", (0, 1), ("h", "h"))
    assert _states(led, "j") == [T.PENDING, T.PENDING]
    assert led.get_job("j").version == before.version
    # Half admitted: launching both must fail for the PENDING one, and move neither.
    led.admit_pending([("j", 1, "")])
    with pytest.raises(FailedPrecondition):
        led.launch("j", (0, 1), ("h", "h"))
    assert _states(led, "j") == [T.READY, T.PENDING]
    # Finishing tasks that never ran.
    with pytest.raises(FailedPrecondition):
        led.finish("j", (0,))


def test_preemption_stops_running_tasks_then_the_killer_hears_and_they_requeue(
    ledger: tuple,
) -> None:
    led, told, killed = ledger
    led.create_job("j", _spec(2))
    led.admit_pending([("j", 2, "")])
    led.launch("j", (0, 1), ("h", "h"))
    job = led.preempt("j", "a higher-priority gang needs the GPUs")
    assert _states(led, "j") == [T.PREEMPTING, T.PREEMPTING]
    assert job.state == JobState.RUNNING
    assert (job.reason, job.message) == (PREEMPTED, "a higher-priority gang needs the GPUs")
    assert killed == [("j", (0, 1))]
    assert told[-1] == "j"
    assert led.attempts("j", {T.PREEMPTING}) == {0: 1, 1: 1}
    job = led.stop_preempted("j", (0, 1))
    # Killed, and each task's goal (restart) made a new attempt: PENDING again.
    assert _states(led, "j") == [T.PENDING, T.PENDING]
    assert led.attempts("j", {T.PENDING}) == {0: 2, 1: 2}
    assert job.state == JobState.PENDING
    assert job.goal == Goal.RUN
    assert led.hosts("j") == ["", ""]


def test_preempting_an_admitted_gang_sends_it_back_without_a_kill(ledger: tuple) -> None:
    led, _, killed = ledger
    led.create_job("j", _spec(2))
    led.admit_pending([("j", 2, "")])
    led.preempt("j", "reclaimed")
    assert _states(led, "j") == [T.PENDING, T.PENDING]
    assert killed == []


def test_preempt_count_takes_the_highest_instances(ledger: tuple) -> None:
    led, _, killed = ledger
    led.create_job("j", _spec(4))
    led.admit_pending([("j", 4, "")])
    led.launch("j", (0, 1, 2, 3), ("h",) * 4)
    led.preempt("j", "shrink", count=2)
    assert _states(led, "j") == [T.RUNNING, T.RUNNING, T.PREEMPTING, T.PREEMPTING]
    assert killed == [("j", (2, 3))]


def test_failures_end_the_job_and_leave_the_unfinished(ledger: tuple) -> None:
    led, _, _ = ledger
    ended: list[str] = []
    led.set_end_listener(lambda job: ended.append(f"{job.id}:{job.state}"))
    led.create_job("a", _spec(2))
    led.create_job("b", _spec(2))
    job = led.fail_pending("a", "gang_infeasible", "too big")
    assert job.state == JobState.FAILED
    assert (job.reason, job.message) == ("gang_infeasible", "too big")
    led.admit_pending([("b", 2, "")])
    job = led.fail_unplaceable("b", "no set of hosts fits")
    assert job.state == JobState.FAILED
    assert job.reason == UNPLACEABLE
    assert led.unfinished_jobs() == []
    assert ended == ["a:FAILED", "b:FAILED"]
    # Both are still read; a job that does not exist is left out, or NotFound.
    assert [j.id for j in led.get_jobs(["b", "a", "nope"])] == ["a", "b"]
    with pytest.raises(NotFound):
        led.get_job("nope")


def test_pending_reasons_are_kept_only_for_pending_jobs(ledger: tuple) -> None:
    led, _, _ = ledger
    seen: list[dict[str, tuple[str, str]]] = []
    led.set_reason_listener(lambda reasons: seen.append(dict(reasons)))
    led.create_job("a", _spec(1))
    led.create_job("b", _spec(1))
    led.admit_pending([("b", 1, "")])
    led.launch("b", (0,), ("h",))
    led.set_pending_reasons({"a": ("queued_behind", "behind b"), "b": ("x", "y")})
    assert (led.get_job("a").reason, led.get_job("a").message) == ("queued_behind", "behind b")
    assert led.get_job("b").reason != "x"
    assert seen == [{"a": ("queued_behind", "behind b"), "b": ("x", "y")}]


def test_requeue_placements_sends_placing_tasks_back_to_ready(ledger: tuple) -> None:
    led, _, _ = ledger
    led.create_job("j", _spec(1))
    assert led.requeue_placements() == []
    assert led.instances("j", {T.PENDING}) == (0,)
    assert led.instances("nope", {T.PENDING}) == ()


def test_the_production_resource_manager_admits_through_it(ledger: tuple) -> None:
    led, _, _ = ledger
    clock = Clock()
    led._clock = clock  # the same virtual clock for both
    rm = ResourceManager(SimPoolStore(led), led, clock=clock)
    led.set_scheduler(rm.job_changed)
    rm.set_capacity(Resources(cpu=64, mem_mb=1 << 20, gpu=8))
    rm.load()  # an empty store: the /default pool is created, as on a fresh install
    assert [p.path for p in SimPoolStore(led, [PoolConfig(DEFAULT_POOL)]).all_pools()] == [
        DEFAULT_POOL
    ]
    led.create_job("small", _spec(2, gpus=2))
    clock.now += 1
    led.create_job("big", _spec(2, gpus=4))
    clock.now += 1
    led.create_job("late", _spec(1, gpus=1))
    rm.run_cycle()
    # 4 + 8 > 8: the big gang waits and holds what it needs; the later 1-GPU gang queues
    # behind it (no starvation), exactly as on the daemon's ledger.
    assert _states(led, "small") == [T.READY, T.READY]
    assert _states(led, "big") == [T.PENDING, T.PENDING]
    assert led.get_job("late").reason == "queued_behind"
    taken = rm.take_admitted(10)
    assert [g.job_id for g in taken] == ["small"]
