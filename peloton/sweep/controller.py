"""The sweep controller: runs every RUNNING sweep on the leader daemon (README "Sweeps").

Each pass over a sweep reads its trials and their reported objective from the database, then,
in this order:

1. ends the trials whose jobs ended (SUCCEEDED with an objective reported; FAILED without one,
   or when the job failed; KILLED when someone killed the job); an elastic trial ends when one
   of its tasks succeeded (its training is over), and the rest of its job is stopped;
2. ends the trials that reported the objective as NaN or infinite (FAILED, their job killed);
3. stops the trials the early-stopping rule stops: the trial is recorded STOPPED with the rule's
   reason first, then its job is killed gracefully (SIGTERM, its kill grace, SIGKILL);
4. fails the sweep after ``max_failed_trials`` failures (killing the trials still running);
5. starts new trials while fewer than ``parallel_trials`` run, ``max_trials`` is not reached
   and the budget has room for one more at its gang's minimum (the GPUs of trials that ended
   count until their jobs' tasks have left); the sweep succeeds when none runs and none is
   left to start;
6. grows the leading elastic trials with the budget's GPUs no trial holds
   (:func:`peloton.sweep.realloc.plan_growth`), once every running trial has reported (a
   trial is never shrunk back: the leader among them all gets them).

Everything a pass decides is written before it acts, and every decision is worked out from
the database alone, so a daemon that restarts (or a new leader) goes on where the last stopped:
a trial row is written before its job, whose request id the row fixes, so that a restart in
between creates the same job once.

Threads: one thread runs the passes; :meth:`wake` (a report arrived, a job ended) shortens its
wait. The servicer only writes reports and reads.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from peloton.core.records import JobRecord
from peloton.core.states import JOB_TERMINAL, JobState, TaskState
from peloton.errors import FailedPrecondition, NotFound, PelotonError
from peloton.storage import sweeps as repo
from peloton.storage.db import Database
from peloton.storage.sweeps import SweepRecord, TrialRecord
from peloton.sweep import spec as sweep_spec
from peloton.sweep.metrics import SweepMetrics
from peloton.sweep.realloc import Running, plan_growth
from peloton.sweep.search import GridSearch, RandomSearch, Searcher
from peloton.sweep.stopping import History, best, loss_of
from peloton.sweep.trialjob import SWEEP_LABEL, trial_job
from peloton.v1 import job_pb2

log = logging.getLogger(__name__)

# How often the controller looks at running sweeps when nothing wakes it.
PASS_SECONDS = 1.0
# The kill reason of a trial's job that the controller ended.
STOPPED_REASON = "sweep_trial_stopped"


class Jobs(Protocol):
    """The job manager, as the controller uses it."""

    def create_job(
        self, spec: job_pb2.JobSpec, request_id: str = "", owner: str = ""
    ) -> tuple[JobRecord, bool]: ...

    def get_job(self, job_id: str) -> JobRecord: ...

    def kill_job(self, job_id: str, message: str = "", *, reason: str = "killed") -> JobRecord: ...


# (sweep id, the sweep's plan, the database URL) -> the sweep's search algorithm.
SearcherFactory = Callable[[SweepRecord, sweep_spec.Plan], Searcher]


def built_in_searcher(sweep: SweepRecord, plan: sweep_spec.Plan) -> Searcher:
    """Random or grid search (the algorithms that need no storage of their own)."""
    if plan.algorithm == "grid":
        return GridSearch(plan.space, plan.grid_points)
    return RandomSearch(plan.space, sweep.spec.seed)


def searchers(db_url: str) -> SearcherFactory:
    """The search algorithm of each sweep: built in, or Optuna's with its storage at
    ``db_url`` (imported only when a sweep asks for it)."""

    def make(sweep: SweepRecord, plan: sweep_spec.Plan) -> Searcher:
        if plan.algorithm in sweep_spec.BUILT_IN:
            return built_in_searcher(sweep, plan)
        from peloton.sweep.optuna_search import OptunaSearch

        return OptunaSearch(plan.space, plan.algorithm, sweep.spec.seed, db_url, sweep.id)

    return make


@dataclass(frozen=True)
class _Trial:
    """A trial as one pass sees it: its row, its losses, whether it reported a non-number."""

    record: TrialRecord
    history: History
    bad_step: int | None  # the first step its objective was not a number


def _finished_elastic(job: JobRecord) -> bool:
    """Whether an elastic trial's training is over: one of its tasks succeeded (its ranks end
    together; those still running are stopped, as they would end on their own)."""
    return job.task_counts.get(TaskState.SUCCEEDED, 0) > 0


def repo_label(job: JobRecord) -> str | None:
    """The sweep a job is a trial of (None: it is none's)."""
    return job.spec.labels.get(SWEEP_LABEL)


def request_id(sweep_id: str, index: int) -> str:
    """The request id of a trial's job: creating it twice creates one job."""
    return f"sweep/{sweep_id}/{index}"


class SweepController:
    """Runs the sweeps (see the module doc)."""

    def __init__(
        self,
        db: Database,
        jobs: Jobs,
        server: Callable[[], str],
        searcher: SearcherFactory = built_in_searcher,
        metrics: SweepMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        interval: float = PASS_SECONDS,
        grown: Callable[[str], None] = lambda _job_id: None,
        server_tls: bool = False,
    ) -> None:
        """``server()``: the daemon's gRPC address as the trials' tasks reach it
        (``server_tls``: over TLS); ``grown(job id)``: a trial's growth limit went up (the
        resource manager re-reads the job)."""
        self._db = db
        self._jobs = jobs
        self._server = server
        self._server_tls = server_tls
        # Jobs of ended trials known to hold nothing any more (see _held).
        self._settled: set[str] = set()
        self._make_searcher = searcher
        self._searchers: dict[str, Searcher] = {}
        self.metrics = metrics or SweepMetrics()
        self._clock = clock
        self._interval = interval
        self._grown = grown
        # The gang size each running elastic trial's job may grow to now, by job id (what the
        # resource manager asks through growth_limit); re-read from the trials every pass.
        self._limits: dict[str, int] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sweep-controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def growth_limit(self, job: JobRecord) -> int | None:
        """How far ``job`` may grow now (the resource manager's growth policy): a sweep's
        elastic trial to the size the sweep gave it, its gang's minimum until then (also
        before the first pass after a restart); any other job to its maximum (None)."""
        if repo_label(job) is None or not job.spec.gang.max_instances:
            return None
        return self._limits.get(job.id, job.spec.gang.min_instances)

    def wake(self) -> None:
        """Look at the sweeps now (something they wait on changed)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                self.run_once()
            except Exception:  # the next pass retries; a pass writes before it acts
                log.exception("a sweep controller pass failed")

    def run_once(self) -> None:
        """One pass over every running sweep; one that fails (its Optuna storage cannot be
        opened, say) is logged and retried next pass, and holds up no other."""
        with self._db.reading() as session:
            running = repo.list_sweeps(session, [repo.RUNNING])
        for sweep in running:
            try:
                self.step(sweep)
            except Exception:
                log.exception("a sweep controller pass failed", extra={"sweep_id": sweep.id})

    # ------------------------------------------------------------------ one sweep

    def step(self, sweep: SweepRecord) -> None:
        """One pass over one sweep (see the module doc)."""
        plan = sweep_spec.plan(sweep.spec)
        searcher = self._searchers.get(sweep.id)
        if searcher is None:
            searcher = self._searchers[sweep.id] = self._make_searcher(sweep, plan)
        trials = self._read(sweep, plan)
        for t in trials:
            if t.record.state == repo.RUNNING and t.record.job_id is None:
                self._create_job(sweep, t.record)
        live = [t for t in trials if t.record.state == repo.RUNNING]
        jobs = self._job_states(live)
        for t in live:
            self._judge(sweep, plan, searcher, t, jobs.get(t.record.index), trials)
        trials = self._read(sweep, plan)
        if self._failed_too_often(sweep, trials):
            return
        if self._start_trials(sweep, plan, searcher, trials):
            self._reallocate(sweep, plan, self._read(sweep, plan))

    def _read(self, sweep: SweepRecord, plan: sweep_spec.Plan) -> list[_Trial]:
        metric = sweep.spec.objective.metric
        with self._db.reading() as session:
            rows = repo.trials(session, sweep.id)
            reports = repo.metric_history(session, sweep.id, metric)
        out = []
        for r in rows:
            self._learn_limit(r)
            raw = reports.get(r.index, [])
            bad = next((s for s, v in raw if v is None), None)
            history = [(s, loss_of(v, plan.maximize)) for s, v in raw if v is not None]
            out.append(_Trial(r, history, bad))
        found = [b for t in out if (b := best(t.history)) is not None]
        if found:
            top = min(found)
            self.metrics.best.labels(sweep.id).set(loss_of(top, plan.maximize))
        return out

    def _learn_limit(self, trial: TrialRecord) -> None:
        """Keep a trial's growth limit as its row says; one learned from the database (after a
        restart, on a new leader) makes the resource manager ask again."""
        if trial.job_id is None:
            return
        if trial.state != repo.RUNNING:
            self._limits.pop(trial.job_id, None)
        elif trial.size and self._limits.get(trial.job_id) != trial.size:
            self._limits[trial.job_id] = trial.size
            self._grown(trial.job_id)

    def _job_states(self, live: Sequence[_Trial]) -> dict[int, JobRecord | None]:
        out: dict[int, JobRecord | None] = {}
        for t in live:
            if t.record.job_id is None:
                continue
            try:
                out[t.record.index] = self._jobs.get_job(t.record.job_id)
            except NotFound:
                out[t.record.index] = None  # deleted
        return out

    def _judge(
        self,
        sweep: SweepRecord,
        plan: sweep_spec.Plan,
        searcher: Searcher,
        t: _Trial,
        job: JobRecord | None,
        trials: Sequence[_Trial],
    ) -> None:
        metric = sweep.spec.objective.metric
        own = best(t.history)
        if t.record.job_id is None:
            return
        if job is None:
            self._end(sweep, searcher, t, "FAILED", "its job was deleted", own)
        elif job.state == JobState.SUCCEEDED or _finished_elastic(job):
            if own is None:
                ended = self._end(
                    sweep, searcher, t, "FAILED", f"ended without reporting {metric}", None
                )
            else:
                ended = self._end(sweep, searcher, t, "SUCCEEDED", "", own)
            if ended and not job.terminal:
                self._kill(t.record, "the trial finished: one of its tasks succeeded")
        elif job.state == JobState.FAILED:
            self._end(sweep, searcher, t, "FAILED", f"its job failed: {job.message}", None)
        elif job.terminal or job.state == JobState.KILLING:
            self._end(sweep, searcher, t, "KILLED", f"its job was killed: {job.message}", own)
        elif t.bad_step is not None:
            why = f"reported {metric} that is not a number at step {t.bad_step}"
            if self._end(sweep, searcher, t, "FAILED", why, None):
                self._kill(t.record, why)
        elif plan.stopping is not None:
            histories = {str(x.record.index): x.history for x in trials}
            why = plan.stopping.stop(str(t.record.index), histories)
            if why and self._end(sweep, searcher, t, "STOPPED", why, own):
                rule = "asha" if why.startswith("ASHA") else "median"
                self.metrics.stopped.labels(rule).inc()
                self._kill(t.record, f"stopped early: {why}")

    def _end(
        self,
        sweep: SweepRecord,
        searcher: Searcher,
        t: _Trial,
        state: str,
        reason: str,
        loss: float | None,
    ) -> bool:
        with self._db.writing() as session:
            ended = repo.end_trial(session, sweep.id, t.record.index, state, reason, self._clock())
        if ended:
            searcher.observe(t.record.ref, loss)
            log.info(
                "sweep trial ended",
                extra={
                    "sweep_id": sweep.id,
                    "trial": t.record.index,
                    "job_id": t.record.job_id,
                    "state": state,
                    "reason": reason,
                    "best": loss,
                },
            )
        return ended

    def _kill(self, trial: TrialRecord, message: str) -> None:
        assert trial.job_id is not None
        # It may have ended meanwhile: then nothing is left to stop.
        with contextlib.suppress(FailedPrecondition, NotFound):
            self._jobs.kill_job(trial.job_id, message, reason=STOPPED_REASON)

    def _failed_too_often(self, sweep: SweepRecord, trials: Sequence[_Trial]) -> bool:
        limit = sweep.spec.max_failed_trials
        failed = sum(1 for t in trials if t.record.state == "FAILED")
        if not limit or failed < limit:
            return False
        self.end_sweep(
            sweep.id, "FAILED", f"failed trials reached max_failed_trials ({failed} of {limit})"
        )
        return True

    def end_sweep(self, sweep_id: str, state: str, reason: str) -> bool:
        """End a running sweep and kill its running trials (KILLED, with ``reason``)."""
        now = self._clock()
        with self._db.writing() as session:
            if not repo.end_sweep(session, sweep_id, state, reason, now):
                return False
            running = [t for t in repo.trials(session, sweep_id) if t.state == repo.RUNNING]
            for t in running:
                repo.end_trial(session, sweep_id, t.index, "KILLED", f"sweep ended: {reason}", now)
        for t in running:
            if t.job_id is not None:
                self._kill(t, f"sweep ended: {reason}")
        self._searchers.pop(sweep_id, None)
        with contextlib.suppress(KeyError):  # no trial reported yet
            self.metrics.best.remove(sweep_id)
        log.info("sweep ended", extra={"sweep_id": sweep_id, "state": state, "reason": reason})
        return True

    def _start_trials(
        self,
        sweep: SweepRecord,
        plan: sweep_spec.Plan,
        searcher: Searcher,
        trials: Sequence[_Trial],
    ) -> bool:
        """Start what the limits allow; False when the sweep ended instead (none left)."""
        running = [t for t in trials if t.record.state == repo.RUNNING]
        index = len(trials)
        held = self._held(plan, trials)
        one = plan.min_size * plan.gpus_per_task
        exhausted = False
        while len(running) < plan.parallel and index < sweep.spec.max_trials:
            if held + one > plan.budget_gpus:
                break
            suggestion = searcher.suggest(index)
            if suggestion is None:
                exhausted = True
                break
            record = TrialRecord(
                sweep_id=sweep.id,
                index=index,
                params=suggestion.params,
                token=secrets.token_hex(16),
                created_at=self._clock(),
                ref=suggestion.ref,
                size=plan.min_size,
            )
            with self._db.writing() as session:
                repo.insert_trial(session, record)
            self._create_job(sweep, record)
            running.append(_Trial(record, [], None))
            held += one
            index += 1
        if not running and (exhausted or index >= sweep.spec.max_trials):
            self._succeed(sweep, plan, trials)
            return False
        return True

    def _create_job(self, sweep: SweepRecord, trial: TrialRecord) -> None:
        spec = trial_job(
            sweep.spec.trial,
            sweep.spec.name,
            sweep.id,
            trial.index,
            trial.params,  # type: ignore[arg-type]
            trial.token,
            self._server(),
            self._server_tls,
        )
        try:
            job, _ = self._jobs.create_job(spec, request_id(sweep.id, trial.index), sweep.owner)
        except PelotonError as exc:
            # The template no longer fits (its pool was deleted, say): the trial fails.
            with self._db.writing() as session:
                repo.end_trial(
                    session,
                    sweep.id,
                    trial.index,
                    "FAILED",
                    f"cannot create its job: {exc}",
                    self._clock(),
                )
            return
        with self._db.writing() as session:
            repo.set_trial_job(session, sweep.id, trial.index, job.id)
        log.info(
            "sweep trial started",
            extra={"sweep_id": sweep.id, "trial": trial.index, "job_id": job.id},
        )

    def _succeed(self, sweep: SweepRecord, plan: sweep_spec.Plan, trials: Sequence[_Trial]) -> None:
        scored = [(b, t.record.index) for t in trials if (b := best(t.history)) is not None]
        if scored:
            loss, index = min(scored)
            value = loss_of(loss, plan.maximize)
            reason = f"best trial {index}: {sweep.spec.objective.metric} {value:.6g}"
        else:
            reason = "no trial reported the objective"
        self.end_sweep(sweep.id, "SUCCEEDED", reason)

    def _held(self, plan: sweep_spec.Plan, trials: Sequence[_Trial]) -> float:
        """The GPUs the sweep's trials hold: the running trials', and those of trials that
        ended (stopped, failed, killed) while their jobs' tasks are still leaving (up to their
        kill grace), so that a new trial never takes them before they are free."""
        held = 0
        for t in trials:
            job_id = t.record.job_id
            if t.record.state != repo.RUNNING and (job_id is None or self._left(job_id)):
                continue
            held += self._size(t.record, plan)
        return held * plan.gpus_per_task

    def _left(self, job_id: str) -> bool:
        """Whether an ended trial's job holds nothing any more (remembered once it does)."""
        if job_id in self._settled:
            return True
        try:
            done = self._jobs.get_job(job_id).state in JOB_TERMINAL
        except NotFound:
            done = True  # deleted: it holds nothing
        if done:
            self._settled.add(job_id)
        return done

    @staticmethod
    def _size(trial: TrialRecord, plan: sweep_spec.Plan) -> int:
        """The gang size the budget counts for a running trial."""
        return trial.size or plan.min_size

    def _reallocate(
        self, sweep: SweepRecord, plan: sweep_spec.Plan, trials: Sequence[_Trial]
    ) -> None:
        if plan.max_size <= plan.min_size:
            return
        running = [t for t in trials if t.record.state == repo.RUNNING and t.record.job_id]
        # Growth only once no trial is left to start: until then freed GPUs start new trials.
        started = len(trials)
        if started < sweep.spec.max_trials and len(running) < plan.parallel:
            return
        # Only once every running trial has reported: growth is not taken back, so it goes to
        # the leader among all of them, not to the first that reported.
        if any(not t.history for t in running):
            return
        held = self._held(plan, trials)
        grows = plan_growth(
            [
                Running(
                    str(t.record.index),
                    self._size(t.record, plan),
                    plan.max_size,
                    plan.gpus_per_task,
                    best(t.history),
                )
                for t in running
            ],
            plan.budget_gpus - held,
        )
        if not grows:
            return
        now = self._clock()
        with self._db.writing() as session:
            for index, size in grows.items():
                repo.set_trial_size(session, sweep.id, int(index), size, now)
            repo.add_reallocations(session, sweep.id, len(grows))
        self.metrics.reallocations.inc(len(grows))
        by_index = {str(t.record.index): t.record.job_id for t in running}
        for index, size in grows.items():
            job_id = by_index[index]
            assert job_id is not None
            self._limits[job_id] = size
            self._grown(job_id)
        log.info(
            "sweep GPUs follow results",
            extra={"sweep_id": sweep.id, "grown": {int(i): s for i, s in grows.items()}},
        )


def trial_counts(trials: Sequence[TrialRecord]) -> Mapping[str, int]:
    """Trials by state name, lower case (the API's)."""
    out: dict[str, int] = {}
    for t in trials:
        out[t.state.lower()] = out.get(t.state.lower(), 0) + 1
    return out
