"""SweepService: the public sweep API (proto/peloton/v1/sweep.proto), and the metrics trials
report (ReportMetrics, called by :func:`peloton.report` inside the trials' tasks).

Sweeps are rows in the database: any daemon of several takes them; the leader's controller
(:mod:`peloton.sweep.controller`) runs them.
"""

from __future__ import annotations

import hmac
import math
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import grpc

from peloton.api import convert
from peloton.api.authz import Authorizer, method_name
from peloton.api.caller import current_caller
from peloton.core.spec import validate_job_spec, with_defaults
from peloton.errors import InvalidArgument, NotFound
from peloton.security.runas import RunAsPolicy
from peloton.storage import sweeps as repo
from peloton.storage.db import Database
from peloton.storage.sweeps import SweepRecord, TrialRecord
from peloton.sweep import spec as sweep_spec
from peloton.sweep.controller import SweepController, trial_counts
from peloton.sweep.space import sample
from peloton.sweep.stopping import best, loss_of
from peloton.sweep.trialjob import text, trial_job
from peloton.v1 import sweep_pb2, sweep_pb2_grpc

SUBMIT_SWEEP = method_name("SweepService", "SubmitSweep")
GET_SWEEP = method_name("SweepService", "GetSweep")
LIST_SWEEPS = method_name("SweepService", "ListSweeps")
LIST_TRIALS = method_name("SweepService", "ListTrials")
KILL_SWEEP = method_name("SweepService", "KillSweep")
REPORT_METRICS = method_name("SweepService", "ReportMetrics")

# Metrics one report may carry, and the longest metric name.
MAX_METRICS = 64
MAX_METRIC_NAME = 255

_SWEEP_STATE = {
    "RUNNING": sweep_pb2.SWEEP_STATE_RUNNING,
    "SUCCEEDED": sweep_pb2.SWEEP_STATE_SUCCEEDED,
    "FAILED": sweep_pb2.SWEEP_STATE_FAILED,
    "KILLED": sweep_pb2.SWEEP_STATE_KILLED,
}
_TRIAL_STATE = {
    "RUNNING": sweep_pb2.TRIAL_STATE_RUNNING,
    "SUCCEEDED": sweep_pb2.TRIAL_STATE_SUCCEEDED,
    "STOPPED": sweep_pb2.TRIAL_STATE_STOPPED,
    "FAILED": sweep_pb2.TRIAL_STATE_FAILED,
    "KILLED": sweep_pb2.TRIAL_STATE_KILLED,
}


def check_trial_template(spec: sweep_pb2.SweepSpec, plan: sweep_spec.Plan) -> None:
    """The job of a trial must pass the job checks: refused here, naming ``trial.<field>``
    (``name`` for the sweep's name, which names every trial)."""
    job = trial_job(
        spec.trial,
        spec.name,
        str(uuid.UUID(int=0)),
        spec.max_trials - 1,
        sample(plan.space, random.Random(0)),
        "0" * 32,
        "127.0.0.1:1",
    )
    try:
        validate_job_spec(with_defaults(job))
    except InvalidArgument as exc:
        field = "name" if exc.field == "name" else f"trial.{exc.field}"
        raise InvalidArgument(field, exc.reason) from None


class SweepService(sweep_pb2_grpc.SweepServiceServicer):
    def __init__(
        self,
        db: Database,
        controller: SweepController,
        authz: Authorizer,
        run_as: RunAsPolicy,
        check_pool: Callable[[str], None],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._db = db
        self._controller = controller
        self._authz = authz
        self._run_as = run_as
        self._check_pool = check_pool
        self._clock = clock

    def _sweep(self, sweep_id: str, method: str) -> SweepRecord:
        if not sweep_id:
            raise InvalidArgument("sweep_id", "is required")
        with self._db.reading() as session:
            sweep = repo.get_sweep(session, sweep_id)
        if sweep is None:
            raise NotFound(f"sweep {sweep_id} not found")
        pool = sweep_spec.pool_of(sweep.spec)
        self._authz.check(method, pool=pool, job=f"sweep {sweep_id}", owner=sweep.owner)
        return sweep

    def SubmitSweep(
        self, request: sweep_pb2.SubmitSweepRequest, context: grpc.ServicerContext
    ) -> sweep_pb2.SubmitSweepResponse:
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "is required")
        spec = request.spec
        plan = sweep_spec.plan(spec)
        check_trial_template(spec, plan)
        pool = sweep_spec.pool_of(spec)
        self._authz.check(SUBMIT_SWEEP, pool=pool)
        caller = current_caller()
        self._run_as.check(caller, spec.trial.user)
        try:
            self._check_pool(pool)
        except InvalidArgument as exc:
            raise InvalidArgument(f"trial.{exc.field}", exc.reason) from None
        sweep = SweepRecord(
            id=str(uuid.uuid4()),
            spec=spec,
            owner=caller.name,
            state=repo.RUNNING,
            created_at=self._clock(),
        )
        with self._db.writing() as session:
            repo.insert_sweep(session, sweep, pool)
        self._controller.wake()
        return sweep_pb2.SubmitSweepResponse(sweep=self._sweep_pb(sweep))

    def GetSweep(
        self, request: sweep_pb2.GetSweepRequest, context: grpc.ServicerContext
    ) -> sweep_pb2.GetSweepResponse:
        sweep = self._sweep(request.sweep_id, GET_SWEEP)
        return sweep_pb2.GetSweepResponse(sweep=self._sweep_pb(sweep))

    def ListSweeps(
        self, request: sweep_pb2.ListSweepsRequest, context: grpc.ServicerContext
    ) -> sweep_pb2.ListSweepsResponse:
        viewable = self._authz.viewable_pools()
        with self._db.reading() as session:
            sweeps = repo.list_sweeps(session)
        shown = [s for s in sweeps if viewable is None or sweep_spec.pool_of(s.spec) in viewable]
        return sweep_pb2.ListSweepsResponse(sweeps=[self._sweep_pb(s) for s in shown])

    def ListTrials(
        self, request: sweep_pb2.ListTrialsRequest, context: grpc.ServicerContext
    ) -> sweep_pb2.ListTrialsResponse:
        sweep = self._sweep(request.sweep_id, LIST_TRIALS)
        return sweep_pb2.ListTrialsResponse(trials=self._trials(sweep))

    def KillSweep(
        self, request: sweep_pb2.KillSweepRequest, context: grpc.ServicerContext
    ) -> sweep_pb2.KillSweepResponse:
        sweep = self._sweep(request.sweep_id, KILL_SWEEP)
        if sweep.state == repo.RUNNING:
            self._controller.end_sweep(
                sweep.id, "KILLED", request.message or f"killed by {current_caller()}"
            )
        return sweep_pb2.KillSweepResponse(sweep=self._sweep_pb(self._sweep(sweep.id, GET_SWEEP)))

    def ReportMetrics(
        self, request: sweep_pb2.ReportMetricsRequest, context: grpc.ServicerContext
    ) -> sweep_pb2.ReportMetricsResponse:
        """Store a trial's metrics at one step. The trial's token is the credential: only its
        own tasks hold it. A value that is not a number is kept as such (README "Sweeps")."""
        if not request.job_id:
            raise InvalidArgument("job_id", "is required (PELOTON_JOB_ID)")
        if not request.metrics:
            raise InvalidArgument("metrics", "report at least one metric")
        if len(request.metrics) > MAX_METRICS:
            raise InvalidArgument("metrics", f"at most {MAX_METRICS} in one report")
        for name in request.metrics:
            if not name.isidentifier() or len(name) > MAX_METRIC_NAME:
                raise InvalidArgument(f"metrics.{name[:64]}", "a metric name is an identifier")
        with self._db.reading() as session:
            trial = repo.trial_of_job(session, request.job_id)
            sweep = None if trial is None else repo.get_sweep(session, trial.sweep_id)
        # The same answer for an unknown job and a wrong token: neither tells which jobs are
        # trials.
        if (
            trial is None
            or sweep is None
            or not hmac.compare_digest(trial.token.encode(), request.token.encode())
        ):
            raise InvalidArgument("token", "is not this job's sweep token (SWEEP_TOKEN)")
        if trial.state != repo.RUNNING or sweep.state != repo.RUNNING:
            return sweep_pb2.ReportMetricsResponse(stop=True)
        values = {k: (v if math.isfinite(v) else None) for k, v in request.metrics.items()}
        with self._db.writing() as session:
            repo.put_metrics(
                session, trial.sweep_id, trial.index, request.step, values, self._clock()
            )
        self._controller.wake()
        return sweep_pb2.ReportMetricsResponse(stop=False)

    # ------------------------------------------------------------------ answers

    def _trials(self, sweep: SweepRecord) -> list[sweep_pb2.Trial]:
        """The sweep's trials, best first (those without an objective last, by index)."""
        maximize = sweep.spec.objective.maximize
        with self._db.reading() as session:
            rows = repo.trials(session, sweep.id)
            reports = repo.metric_history(session, sweep.id, sweep.spec.objective.metric)
        out = []
        for row in rows:
            raw = reports.get(row.index, [])
            losses = [(s, loss_of(v, maximize)) for s, v in raw if v is not None]
            out.append(trial_pb(row, losses, maximize))
        out.sort(key=lambda t: (not t.HasField("best"), _rank(t, maximize), t.index))
        return out

    def _sweep_pb(self, sweep: SweepRecord) -> sweep_pb2.Sweep:
        trials = self._trials(sweep)
        with self._db.reading() as session:
            rows = repo.trials(session, sweep.id)
        out = sweep_pb2.Sweep(
            sweep_id=sweep.id,
            spec=sweep.spec,
            state=_SWEEP_STATE[sweep.state],
            reason=sweep.reason,
            owner=sweep.owner,
            created_at=convert.timestamp(sweep.created_at),
            trials=trial_counts(rows),
            reallocations=sweep.reallocations,
            total_steps=sum(t.last_step for t in trials),
        )
        if trials and trials[0].HasField("best"):
            out.best = trials[0].best
            out.best_trial = trials[0].index
        return out


def _rank(trial: sweep_pb2.Trial, maximize: bool) -> float:
    return loss_of(trial.best, maximize) if trial.HasField("best") else 0.0


def trial_pb(row: TrialRecord, losses: list[tuple[int, float]], maximize: bool) -> sweep_pb2.Trial:
    out = sweep_pb2.Trial(
        index=row.index,
        job_id=row.job_id or "",
        state=_TRIAL_STATE[row.state],
        params={k: text(v) for k, v in row.params.items()},  # type: ignore[arg-type]
        last_step=losses[-1][0] if losses else 0,
        reason=row.reason,
        size=row.size,
    )
    low = best(losses)
    if low is not None:
        out.best = loss_of(low, maximize)
        out.best_step = next(s for s, v in losses if v == low)
    return out
