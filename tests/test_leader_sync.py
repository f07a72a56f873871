"""What a daemon of several learns of the others' writes (peloton.ha.sync) and the kills the
leader sends for them (peloton.ha.kills), without a database: fakes stand for the job events,
the job manager and the host manager."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from support import make_spec

from peloton.core.eventpoll import RESCAN_SECONDS
from peloton.core.records import JobRecord, attempt_id
from peloton.core.states import Goal, JobState, TaskState
from peloton.ha.kills import LeaderKills
from peloton.ha.sync import Sync


@dataclass
class Events:
    """Job events: (sequence, job id), visible in any order."""

    rows: list[tuple[int, str]] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)

    def changes(self, after: int) -> dict[str, int]:
        self.asked.append(after)
        newest: dict[str, int] = {}
        for s, j in self.rows:
            if s > after:
                newest[j] = max(s, newest.get(j, 0))
        return newest

    def newest(self) -> int:
        return max((s for s, _ in self.rows), default=0)


@dataclass
class Role:
    leads: bool = False
    now: float = 0.0
    jobs: list[set[str]] = field(default_factory=list)
    pools: int = 0


def sync(events: Events, role: Role) -> Sync:
    def on_pools() -> None:
        role.pools += 1

    return Sync(
        changes=events.changes,
        newest=events.newest,
        leads=lambda: role.leads,
        on_jobs=role.jobs.append,
        on_pools=on_pools,
        interval=0.5,
        clock=lambda: role.now,
    )


def test_a_follower_rereads_the_pools_and_the_leader_schedules_what_others_wrote() -> None:
    events, role = Events([(1, "old")]), Role()
    s = sync(events, role)
    s.poll()  # what was written before is the resource manager's load()
    assert (role.jobs, role.pools) == ([], 0)
    events.rows.append((2, "j2"))
    role.now = 1
    s.poll()
    assert (role.jobs, role.pools) == ([], 1)
    role.leads, role.now = True, 2
    s.poll()
    assert role.jobs == [{"j2"}]


def test_an_event_committed_after_newer_ones_is_still_found() -> None:
    events, role = Events([(1, "a")]), Role(leads=True)
    s = sync(events, role)
    s.poll()
    events.rows.append((3, "c"))  # sequence 2's transaction has not committed yet
    role.now = 1
    s.poll()
    assert role.jobs == [{"c"}]
    events.rows.append((2, "b"))
    role.now = RESCAN_SECONDS / 2
    s.poll()
    assert role.jobs[-1] == {"b"}  # c, read again, is not told twice
    # Past the window, polls read from a later sequence.
    role.now = RESCAN_SECONDS + 2
    s.poll()
    assert events.asked[-1] == 3


@dataclass
class Killer:
    sent: list[tuple[list[str], int]] = field(default_factory=list)

    def kill(self, attempt_ids: Sequence[str], grace_seconds: int) -> None:
        self.sent.append((list(attempt_ids), grace_seconds))


@dataclass
class Jobs:
    """One job and its attempts KILLING (instance -> attempt)."""

    stopping: dict[int, int] = field(default_factory=dict)

    def record(self) -> JobRecord:
        spec = make_spec(3, kill_grace_seconds=7)
        at = datetime(2026, 1, 1, tzinfo=UTC)
        counts = {TaskState.KILLING: len(self.stopping)} if self.stopping else {}
        return JobRecord("j", spec, JobState.KILLING, Goal.KILL, "", "", at, at, 1, counts)

    def get_jobs(self, job_ids: Iterable[str]) -> list[JobRecord]:
        return [self.record()] if "j" in set(job_ids) else []

    def attempts(self, job_id: str, states: Iterable[TaskState]) -> dict[int, int]:
        return dict(self.stopping)


def test_the_leader_sends_the_kills_written_through_a_follower_once() -> None:
    killer, jobs, role = Killer(), Jobs(), Role()
    kills = LeaderKills(killer, jobs, lambda: role.leads)
    kills.kill([attempt_id("j", 0, 1)], 7)  # on a follower: the leader sends it
    assert killer.sent == []
    role.leads = True
    jobs.stopping = {0: 1, 1: 1}
    kills.kill([attempt_id("j", 1, 1)], 7)  # the leader's own kill
    kills.jobs_changed({"j"})
    kills.jobs_changed({"j"})  # read again (the events' window): nothing twice
    assert killer.sent == [([attempt_id("j", 1, 1)], 7), ([attempt_id("j", 0, 1)], 7)]
    jobs.stopping = {}
    kills.jobs_changed({"j", "deleted"})  # ended: forgotten
    jobs.stopping = {0: 2}
    kills.jobs_changed({"j"})
    assert killer.sent[-1] == ([attempt_id("j", 0, 2)], 7)


def test_jobs_written_right_after_the_start_are_told_at_the_first_poll() -> None:
    # The daemon's resource manager loads the jobs after start(): what is written between that
    # and the thread's first poll (an interval later) must not be taken as already known.
    events, role = Events([(1, "old")]), Role(leads=True)
    s = sync(events, role)
    s.start()
    s.stop()
    events.rows.append((2, "new"))
    role.now = 1
    s.poll()
    assert role.jobs[-1] == {"new"}
