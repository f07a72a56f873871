"""Kills with several daemons: only the leader talks to Mesos, but any daemon may write a kill.

A kill through a follower (KillJob, RestartJob) is a write like any other: its tasks are KILLING
(or PREEMPTING) in the database, and the follower sends nothing. The leader learns of the job
from its events (:mod:`peloton.ha.sync`), reads which of its attempts must stop, and sends the
KILL for those it has not sent itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from peloton.core.records import JobRecord, attempt_id, parse_attempt_id
from peloton.core.states import TaskState

# The states of an attempt that was told to stop and may still run.
STOPPING = frozenset({TaskState.KILLING, TaskState.PREEMPTING})


class Killer(Protocol):
    """Where KILLs go (the host manager)."""

    def kill(self, attempt_ids: Sequence[str], grace_seconds: int) -> None: ...


class Jobs(Protocol):
    """What the forwarding reads of the job manager."""

    def get_jobs(self, job_ids: Iterable[str]) -> list[JobRecord]: ...

    def attempts(self, job_id: str, states: Iterable[TaskState]) -> dict[int, int]: ...


class LeaderKills:
    """The task killer of one of several daemons: kills go to Mesos from the leader only."""

    def __init__(self, killer: Killer, jobs: Jobs, leads: Callable[[], bool]) -> None:
        self._killer = killer
        self._jobs = jobs
        self._leads = leads
        self._lock = threading.Lock()
        # By job: its attempts KILLed by this daemon that may still run. Every kill is written
        # with events, so each job here is read again (jobs_changed) until they have ended.
        self._sent: dict[str, set[str]] = {}

    def kill(self, attempt_ids: Sequence[str], grace_seconds: int) -> None:
        """The job manager's killer, after a commit: on a follower the leader sends them."""
        if not self._leads():
            return
        with self._lock:
            for attempt in attempt_ids:
                ids = parse_attempt_id(attempt)
                if ids is not None:
                    self._sent.setdefault(ids[0], set()).add(attempt)
        self._killer.kill(attempt_ids, grace_seconds)

    def jobs_changed(self, job_ids: Iterable[str]) -> None:
        """Jobs written by any daemon (on the leader): KILL what must stop and was not sent."""
        ids = set(job_ids)
        jobs = {job.id: job for job in self._jobs.get_jobs(ids)}
        for job_id in ids:
            job = jobs.get(job_id)  # None: deleted
            stopping: set[str] = set()
            if job is not None and any(job.task_counts.get(s, 0) for s in STOPPING):
                attempts = self._jobs.attempts(job_id, STOPPING)
                stopping = {attempt_id(job_id, i, a) for i, a in attempts.items()}
            with self._lock:
                new = sorted(stopping - self._sent.pop(job_id, set()))
                if stopping:  # those no longer stopping have ended: forgotten
                    self._sent[job_id] = stopping
            if new and job is not None:
                self._killer.kill(new, job.spec.preemption.kill_grace_seconds)
