"""Sweep repository: sweeps, their trials, and the metrics the trials report per step.

Functions take an open Session and never commit: the caller's transaction decides. A trial's
state moves only from RUNNING (:func:`end_trial`), so that two writers racing to end it (the
controller stopping it, its job ending) record one ending.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, and_, delete, func, insert, select, update
from sqlalchemy.orm import Session

from peloton.storage.models import SweepMetricRow, SweepRow, SweepTrialRow
from peloton.v1 import sweep_pb2

RUNNING = "RUNNING"
SWEEP_STATES = ("RUNNING", "SUCCEEDED", "FAILED", "KILLED")
TRIAL_STATES = ("RUNNING", "SUCCEEDED", "STOPPED", "FAILED", "KILLED")


@dataclass(frozen=True)
class SweepRecord:
    id: str
    spec: sweep_pb2.SweepSpec
    owner: str
    state: str
    created_at: datetime
    reason: str = ""
    reallocations: int = 0


@dataclass(frozen=True)
class TrialRecord:
    sweep_id: str
    index: int
    params: Mapping[str, object]
    token: str
    created_at: datetime
    job_id: str | None = None
    state: str = RUNNING
    reason: str = ""
    ref: int = -1
    size: int = 0


def _sweep(row: SweepRow) -> SweepRecord:
    return SweepRecord(
        id=row.id,
        spec=sweep_pb2.SweepSpec.FromString(row.spec),
        owner=row.owner,
        state=row.state,
        created_at=row.created_at,
        reason=row.reason,
        reallocations=row.reallocations,
    )


def _trial(row: SweepTrialRow) -> TrialRecord:
    return TrialRecord(
        sweep_id=row.sweep_id,
        index=row.index,
        params=json.loads(row.params),
        token=row.token,
        created_at=row.created_at,
        job_id=row.job_id,
        state=row.state,
        reason=row.reason,
        ref=row.ref,
        size=row.size,
    )


def insert_sweep(session: Session, sweep: SweepRecord, pool: str) -> None:
    session.execute(
        insert(SweepRow).values(
            id=sweep.id,
            name=sweep.spec.name,
            pool=pool,
            owner=sweep.owner,
            spec=sweep.spec.SerializeToString(),
            state=sweep.state,
            reason=sweep.reason,
            reallocations=0,
            created_at=sweep.created_at,
            updated_at=sweep.created_at,
        )
    )


def get_sweep(session: Session, sweep_id: str) -> SweepRecord | None:
    row = session.get(SweepRow, sweep_id)
    return None if row is None else _sweep(row)


def list_sweeps(session: Session, states: Iterable[str] = ()) -> list[SweepRecord]:
    """Sweeps, newest first (of ``states`` only, where given)."""
    query = select(SweepRow).order_by(SweepRow.created_at.desc(), SweepRow.id)
    wanted = list(states)
    if wanted:
        query = query.where(SweepRow.state.in_(wanted))
    return [_sweep(r) for r in session.scalars(query)]


def end_sweep(session: Session, sweep_id: str, state: str, reason: str, now: datetime) -> bool:
    """Move a RUNNING sweep to ``state``; False if it had ended already."""
    done = session.execute(
        update(SweepRow)
        .where(SweepRow.id == sweep_id, SweepRow.state == RUNNING)
        .values(state=state, reason=reason, updated_at=now)
    )
    return bool(done.rowcount)  # type: ignore[attr-defined]


def add_reallocations(session: Session, sweep_id: str, count: int) -> None:
    session.execute(
        update(SweepRow)
        .where(SweepRow.id == sweep_id)
        .values(reallocations=SweepRow.reallocations + count)
    )


def insert_trial(session: Session, trial: TrialRecord) -> None:
    session.execute(
        insert(SweepTrialRow).values(
            sweep_id=trial.sweep_id,
            index=trial.index,
            job_id=trial.job_id,
            state=trial.state,
            reason=trial.reason,
            params=json.dumps(dict(trial.params), sort_keys=True),
            token=trial.token,
            ref=trial.ref,
            size=trial.size,
            created_at=trial.created_at,
            updated_at=trial.created_at,
        )
    )


def _trial_where(sweep_id: str, index: int) -> ColumnElement[bool]:
    return and_(SweepTrialRow.sweep_id == sweep_id, SweepTrialRow.index == index)


def set_trial_job(session: Session, sweep_id: str, index: int, job_id: str) -> None:
    session.execute(
        update(SweepTrialRow).where(_trial_where(sweep_id, index)).values(job_id=job_id)
    )


def set_trial_size(session: Session, sweep_id: str, index: int, size: int, now: datetime) -> None:
    session.execute(
        update(SweepTrialRow).where(_trial_where(sweep_id, index)).values(size=size, updated_at=now)
    )


def end_trial(
    session: Session, sweep_id: str, index: int, state: str, reason: str, now: datetime
) -> bool:
    """Move a RUNNING trial to ``state``; False if it had ended already."""
    done = session.execute(
        update(SweepTrialRow)
        .where(_trial_where(sweep_id, index), SweepTrialRow.state == RUNNING)
        .values(state=state, reason=reason, updated_at=now)
    )
    return bool(done.rowcount)  # type: ignore[attr-defined]


def trials(session: Session, sweep_id: str) -> list[TrialRecord]:
    """The sweep's trials, by index."""
    query = select(SweepTrialRow).where(SweepTrialRow.sweep_id == sweep_id)
    return [_trial(r) for r in session.scalars(query.order_by(SweepTrialRow.index))]


def trial_of_job(session: Session, job_id: str) -> TrialRecord | None:
    row = session.scalars(select(SweepTrialRow).where(SweepTrialRow.job_id == job_id)).first()
    return None if row is None else _trial(row)


def put_metrics(
    session: Session,
    sweep_id: str,
    trial: int,
    step: int,
    metrics: Mapping[str, float | None],
    now: datetime,
) -> None:
    """Record ``metrics`` at ``step``; a metric reported again at the same step replaces the
    value before (a worker that retries after a lost answer writes it once)."""
    names = list(metrics)
    session.execute(
        delete(SweepMetricRow).where(
            SweepMetricRow.sweep_id == sweep_id,
            SweepMetricRow.trial == trial,
            SweepMetricRow.step == step,
            SweepMetricRow.name.in_(names),
        )
    )
    session.execute(
        insert(SweepMetricRow),
        [
            {
                "sweep_id": sweep_id,
                "trial": trial,
                "step": step,
                "name": name,
                "value": value,
                "reported_at": now,
            }
            for name, value in metrics.items()
        ],
    )


def metric_history(
    session: Session, sweep_id: str, name: str
) -> dict[int, list[tuple[int, float | None]]]:
    """Every trial's reports of metric ``name``: trial -> [(step, value)], in step order."""
    query = (
        select(SweepMetricRow.trial, SweepMetricRow.step, SweepMetricRow.value)
        .where(SweepMetricRow.sweep_id == sweep_id, SweepMetricRow.name == name)
        .order_by(SweepMetricRow.trial, SweepMetricRow.step)
    )
    out: dict[int, list[tuple[int, float | None]]] = {}
    for trial, step, value in session.execute(query):
        out.setdefault(trial, []).append((step, value))
    return out


def trials_by_state(session: Session) -> dict[str, int]:
    """Trials of all sweeps, by state (the metrics' gauge)."""
    query = select(SweepTrialRow.state, func.count()).group_by(SweepTrialRow.state)
    return {state: count for state, count in session.execute(query)}
