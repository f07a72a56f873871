"""The resource manager's cycle on the in-memory job ledger, no database.

The scenarios of test_resmgr_scenarios.py, test_gang_lifecycle.py and test_resmgr_conservation.py
run here unchanged on a :class:`Harness` without a database (``Harness.in_memory``): the cycle
takes its ledger and pool store as protocols, and the in-memory ledger keeps the job manager's
rules, so the same assertions hold on both. Then what is cheap to check only here: a daemon
restart's requeue of interrupted placements, and the cycle's writes going only through the
ledger's protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import test_gang_lifecycle as gang
import test_resmgr_conservation as conservation
import test_resmgr_scenarios as scenarios
from ledger_memory import MemoryLedger
from resmgr_support import TO_RUNNING, Harness
from support import FakeClock, RecordingKiller

from peloton.core.records import TaskUpdate
from peloton.core.resources import Resources
from peloton.core.states import JobState, TaskState
from peloton.resmgr.manager import ResourceManager

T = TaskState
CLUSTER16 = Resources(cpu=10_000, mem_mb=1e9, disk_mb=1e9, gpu=16)


def _name(test: Callable[..., Any]) -> str:
    return test.__name__.removeprefix("test_")


# Scenarios that take a harness on a 16-GPU cluster (their modules' fixtures build one).
ON_CLUSTER16 = [
    scenarios.test_gangs_are_admitted_whole_and_the_reason_is_readable,
    scenarios.test_borrowed_gpus_are_reclaimed_within_one_cycle_plus_grace,
    scenarios.test_non_preemptible_work_never_runs_on_borrowed_capacity,
    scenarios.test_an_infeasible_gang_fails_fast_with_its_reason,
    scenarios.test_higher_priority_preempts_lower_inside_a_pool,
    scenarios.test_min_instances_gang_first_then_single_tasks,
    scenarios.test_state_is_rebuilt_from_the_database,
    scenarios.test_jobs_go_only_into_existing_leaf_pools,
    scenarios.test_status_reports_borrowing_and_lending,
    scenarios.test_a_job_killed_and_restarted_between_cycles_gets_its_reason_again,
    gang.test_failed_task_takes_the_gang_down_and_it_restarts_whole_after_the_backoff,
    gang.test_the_gang_fails_with_the_first_failure_once_max_failures_is_spent,
    gang.test_max_failures_zero_fails_on_the_first_failure,
    gang.test_a_task_failing_while_being_killed_is_not_another_gang_failure,
    gang.test_restart_job_starts_the_gang_failure_count_over,
    gang.test_preempted_gang_is_requeued_whole_not_in_pieces,
    gang.test_max_runtime_kills_the_job_counted_from_its_first_start,
    gang.test_a_job_without_max_runtime_is_never_expired,
]

# Scenarios that build their own harness from a database: given None, they build it in memory.
OWN_CLUSTER = [
    scenarios.test_two_100_task_gangs_on_100_gpus_never_deadlock,
    scenarios.test_no_ping_pong_between_two_pools_over_1000_cycles,
    conservation.test_two_gangs_bigger_than_their_share_do_not_leave_the_cluster_idle,
    conservation.test_a_gang_its_pool_is_entitled_to_still_holds_what_it_waits_for,
    gang.test_no_task_of_a_gang_ever_runs_alone,
]

# Scenarios on the two-agent cluster with the README's example pools.
ON_TWO_AGENTS = [
    conservation.test_a_gang_that_can_never_fit_its_share_does_not_starve_another_pool,
    conservation.test_pools_lend_no_more_than_the_cluster_has,
]

# The job manager's own failure rules, given a ledger, a killer and a clock.
ON_A_LEDGER = [
    gang.test_a_failure_lost_with_a_sibling_blames_the_task_that_failed,
    gang.test_independent_tasks_restart_alone_each_within_its_own_limit,
]


@pytest.mark.parametrize("scenario", ON_CLUSTER16, ids=_name)
def test_cluster16_scenario_in_memory(scenario: Callable[[Harness], None]) -> None:
    scenario(Harness.in_memory(CLUSTER16))


@pytest.mark.parametrize("scenario", OWN_CLUSTER, ids=_name)
def test_own_cluster_scenario_in_memory(scenario: Callable[[None], None]) -> None:
    scenario(None)


@pytest.mark.parametrize("scenario", ON_TWO_AGENTS, ids=_name)
def test_two_agent_scenario_in_memory(scenario: Callable[[Harness], None]) -> None:
    h = Harness.in_memory(conservation.TWO_AGENTS)
    for config in conservation.EXAMPLE_POOLS:
        h.rm.create_pool(config)
    scenario(h)


@pytest.mark.parametrize("scenario", ON_A_LEDGER, ids=_name)
def test_failure_rules_in_memory(scenario: Callable[..., None]) -> None:
    clock, killer = FakeClock(), RecordingKiller()
    ledger = MemoryLedger(clock=clock, killer=killer)
    if "clock" in scenario.__code__.co_varnames[: scenario.__code__.co_argcount]:
        scenario(ledger, killer, clock)
    else:
        scenario(ledger, killer)


def test_placements_a_dead_daemon_left_are_requeued_and_handed_out_again() -> None:
    h = Harness.in_memory(CLUSTER16)
    job_id = h.submit("/default", 3)
    h.cycle()
    (gang,) = h.rm.take_admitted(10)
    h.jobs.update_tasks(job_id, [TaskUpdate(i, 1, T.PLACING) for i in gang.instances])
    h.jobs.update_tasks(job_id, [TaskUpdate(0, 1, T.PLACED)])
    assert h.counts(job_id) == {"PLACING": 2, "PLACED": 1}

    # A new daemon: its resource manager rebuilds from the ledger; the leases died with the
    # old one, so the gang goes back to READY and is handed to placement again, whole.
    again = ResourceManager(h.pools, h.jobs, clock=h.seconds)
    h.jobs.set_scheduler(again)
    again.load()
    assert h.counts(job_id) == {"READY": 3}
    events = [e for e in h.jobs.job_events(job_id) if e.reason == "requeued"]
    assert len(events) == 3
    assert all("daemon restart" in e.message for e in events)
    assert [(g.job_id, g.instances) for g in again.take_admitted(10)] == [(job_id, (0, 1, 2))]
    assert again.status("/default").kinds["gpu"].allocation == 3


def test_a_killed_gang_frees_its_share_for_the_next_only_once_its_tasks_end() -> None:
    h = Harness.in_memory(Resources(cpu=100, mem_mb=1e6, disk_mb=1e6, gpu=4))
    first = h.submit("/default", 4)
    second = h.submit("/default", 4)
    h.cycle()
    h.place_all()
    assert h.counts(second) == {"PENDING": 4}
    h.jobs.kill_job(first)
    h.cycle()
    assert h.counts(first) == {"KILLING": 4}
    assert h.counts(second) == {"PENDING": 4}, "the killed tasks still hold their GPUs"
    assert h.complete_kills() == 4
    h.cycle()
    assert h.job(first).state == JobState.KILLED
    assert h.counts(second) == {"READY": 4}
    assert h.rm.status("/default").queued_gangs == 0


def test_the_cycle_writes_only_through_the_ledger_protocol() -> None:
    """The resource manager calls nothing of the ledger beyond SchedulingLedger."""
    h = Harness.in_memory(CLUSTER16)
    calls: list[str] = []
    allowed = {
        "unfinished_jobs",
        "get_jobs",
        "instances",
        "admit_pending",
        "set_pending_reasons",
        "fail_pending",
        "preempt",
        "requeue_placements",
    }

    class Spy:
        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            return getattr(h.jobs, name)

    rm = ResourceManager(h.pools, Spy(), clock=h.seconds)
    h.jobs.set_scheduler(rm)
    rm.load()
    rm.set_capacity(Resources(cpu=100, mem_mb=1e6, disk_mb=1e6, gpu=4))
    low = h.submit("/default", 4, priority=0)
    rm.run_cycle()
    for g in rm.take_admitted(10):
        h._move(g.job_id, g.instances, TO_RUNNING)
    h.submit("/default", 4, priority=10)
    h.submit("/default", 8, gpu=1)  # never fits: failed
    for _ in range(3):
        h.clock.advance(1)
        rm.run_cycle()
    assert h.counts(low) == {"PREEMPTING": 4}
    assert set(calls) <= allowed
    assert {"admit_pending", "set_pending_reasons", "fail_pending", "preempt"} <= set(calls)


def test_gangs_handed_back_together_are_queued_again_with_their_reasons_in_one_write() -> None:
    """Placement hands a round's unplaced gangs back at once: their reasons are written in
    one write (not one per gang), each is handed out again, but a killed job's is not."""
    h = Harness.in_memory(CLUSTER16)
    jobs = [h.submit("/default", 2) for _ in range(3)]
    h.cycle()
    gangs = h.rm.take_admitted(10)
    assert [g.job_id for g in gangs] == jobs
    h.jobs.kill_job(jobs[2])
    h.cycle()  # the resource manager learns of the kill
    writes: list[dict[str, tuple[str, str]]] = []
    real = h.jobs.set_pending_reasons

    def recording(reasons: dict[str, tuple[str, str]]) -> None:
        writes.append(dict(reasons))
        real(reasons)

    h.jobs.set_pending_reasons = recording  # type: ignore[method-assign]
    h.rm.return_admitted([(g, f"no room for {g.job_id[:4]}") for g in gangs])
    assert writes == [{g.job_id: ("placement", f"no room for {g.job_id[:4]}") for g in gangs}]
    for job_id in jobs[:2]:
        job = h.jobs.get_job(job_id)
        assert (job.reason, job.message) == ("placement", f"no room for {job_id[:4]}")
    assert [g.job_id for g in h.rm.take_admitted(10)] == jobs[:2]
