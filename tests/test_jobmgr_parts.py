"""The job manager's parts on their own: the unit of work, and the storage seam (no SQL in
peloton/jobmgr; a taken request id is the repository's own error)."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from support import FakeClock
from support import independent_spec as make_spec

from peloton.core.states import Goal, JobState, TaskState
from peloton.errors import FailedPrecondition
from peloton.jobmgr import work as uow
from peloton.jobmgr.lifecycle import Lifecycle
from peloton.jobmgr.reads import Reads
from peloton.storage import jobs as repo
from peloton.storage.db import Database

T = TaskState
JOBMGR = Path(__file__).resolve().parent.parent / "peloton" / "jobmgr"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_job_manager_runs_no_sql_of_its_own() -> None:
    for path in sorted(JOBMGR.glob("*.py")):
        sql = {n for n in _imports(path) if n.split(".")[0] == "sqlalchemy"}
        assert not sql, f"{path.name} imports {sql}: statements belong in peloton/storage"


def test_a_taken_request_id_is_the_repositorys_error(db: Database) -> None:
    def insert(session: repo.Tx, job_id: str) -> None:
        repo.insert_job(
            session,
            job_id=job_id,
            spec=make_spec(2),
            request_id="req",
            now=FakeClock()(),
            task_state=T.PENDING,
            job_state=JobState.PENDING,
        )

    with db.writing() as session:
        insert(session, "a")
    with pytest.raises(repo.RequestIdTaken), db.writing() as session:
        insert(session, "b")
    with db.reading() as session:
        assert repo.job_exists(session, "a")
        assert not repo.job_exists(session, "b")


def test_a_unit_of_work_moves_renews_derives_and_rolls_back_as_one(db: Database) -> None:
    clock = FakeClock()
    ctx = uow.Context(db, clock)
    reads = Reads(ctx)
    job, _ = Lifecycle(ctx).create_job(make_spec(3, max_runtime_seconds=60))
    clock.advance(1)
    with ctx.job(job.id) as work:
        assert (work.state, work.counts, work.now) == (JobState.PENDING, {T.PENDING: 3}, clock.now)
        work.move({T.PENDING}, T.READY, reason="r", message="m", goal=Goal.RUN, instances=(0, 1))
        work.move({T.READY}, T.FAILED, reason="r", message="m", goal=Goal.RUN, instances=(0,))
        assert work.counts == {T.PENDING: 1, T.READY: 1, T.FAILED: 1}
        work.derive()
        assert work.state == JobState.RUNNING
        assert work.attempts({T.FAILED}) == [f"{job.id}-0-1"]
    stored = reads.get_job(job.id)
    assert stored.task_counts == {T.PENDING: 1, T.READY: 1, T.FAILED: 1}
    assert stored.state == JobState.RUNNING
    # The runtime limit starts when the job first runs.
    with db.reading() as session:
        assert repo.expired_jobs(session, clock.now + timedelta(seconds=60)) == [(job.id, 60)]
    # An illegal move fails the whole unit: nothing of it is written.
    with pytest.raises(FailedPrecondition), ctx.job(job.id) as work:
        work.move({T.READY}, T.PENDING, reason="x", message="", goal=Goal.RUN)
        work.move({T.FAILED}, T.PENDING, reason="x", message="", goal=Goal.RUN)
    assert reads.get_job(job.id).task_counts == stored.task_counts
    assert reads.instances(job.id, {T.READY}) == (1,)
    # An ended task starts a new attempt.
    with ctx.job(job.id) as work:
        work.renew({T.FAILED}, reason="again", message="", reset_failures=False)
        assert work.counts == {T.PENDING: 2, T.READY: 1}
        assert f"{job.id}-0-2" in work.attempts({T.PENDING})
        work.derive()
    assert reads.attempts(job.id, {T.PENDING}) == {0: 2, 2: 1}


def test_shift_checks_each_state_left_and_keeps_counts_whole() -> None:
    counts = {T.PENDING: 2, T.RUNNING: 1}
    uow.shift(counts, {T.PENDING: 2}, T.READY)
    assert counts == {T.READY: 2, T.RUNNING: 1}
    with pytest.raises(AssertionError, match="negative"):
        uow.shift(counts, {T.RUNNING: 2}, T.KILLING)
    with pytest.raises(FailedPrecondition):
        uow.shift({T.RUNNING: 1}, {T.RUNNING: 1}, T.PENDING, new_attempt=True)
