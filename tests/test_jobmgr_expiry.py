"""The job manager's runtime expiry timer (no longer a side job of the resource manager's loop),
on the in-memory ledger: it kills jobs past their max runtime on its own thread, survives a failed
round, and stops at once."""

from __future__ import annotations

import threading

from ledger_memory import MemoryLedger
from support import TO_RUNNING, FakeClock, RecordingKiller, make_spec

from peloton.core.records import TaskUpdate
from peloton.core.states import JobState
from peloton.jobmgr.expiry import ExpiryTimer
from peloton.jobmgr.manager import MAX_RUNTIME


class Rounds:
    """An Expiring that counts rounds and signals the one after which ``done`` holds."""

    def __init__(self, ledger: MemoryLedger | None = None, fail_first: int = 0) -> None:
        self.ledger = ledger
        self.fail_first = fail_first
        self.calls = 0
        self.killed: list[str] = []
        self.done = threading.Event()

    def expire_jobs(self) -> list[str]:
        self.calls += 1
        if self.calls <= self.fail_first:
            raise RuntimeError("database unreachable")
        killed = self.ledger.expire_jobs() if self.ledger is not None else []
        self.killed += killed
        if killed or self.ledger is None:
            self.done.set()
        return killed


def test_the_timer_kills_a_job_past_its_max_runtime() -> None:
    clock = FakeClock()
    ledger = MemoryLedger(clock=clock, killer=RecordingKiller())
    job, _ = ledger.create_job(make_spec(2, max_runtime_seconds=60))
    ledger.admit_pending([(job.id, 2, "in")])
    for state in TO_RUNNING[1:]:
        ledger.update_tasks(job.id, [TaskUpdate(i, 1, state) for i in (0, 1)])
    rounds = Rounds(ledger)
    timer = ExpiryTimer(rounds, interval=0.01)
    assert timer.run_once() == []  # not yet past its runtime
    clock.advance(61)
    timer.start()
    try:
        assert rounds.done.wait(10), "no round killed the job"
    finally:
        timer.stop()
    assert rounds.killed == [job.id]
    got = ledger.get_job(job.id)
    assert (got.state, got.reason) == (JobState.KILLING, MAX_RUNTIME)
    assert "max_runtime_seconds (60 s)" in got.message


def test_a_failed_round_is_logged_and_the_next_one_runs() -> None:
    rounds = Rounds(fail_first=2)
    timer = ExpiryTimer(rounds, interval=0.01)
    assert timer.run_once() == []  # the failure does not escape
    timer.start()
    try:
        assert rounds.done.wait(10), "the timer stopped after a failed round"
    finally:
        timer.stop()
    assert rounds.calls >= 3


def test_stop_returns_at_once_and_no_round_runs_after_it() -> None:
    rounds = Rounds()
    timer = ExpiryTimer(rounds, interval=3600)
    timer.start()
    timer.stop()  # would hang for an hour if it waited out the interval
    assert rounds.calls == 0
    ExpiryTimer(rounds).stop()  # never started: nothing to stop
