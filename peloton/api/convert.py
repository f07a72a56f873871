"""Conversions between job manager records and peloton.v1 protobuf messages."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from peloton.core.records import AttemptRecord, EventRecord, JobRecord, TaskRecord
from peloton.core.states import JobState, TaskState
from peloton.errors import InvalidArgument
from peloton.v1 import job_pb2

_JOB_PREFIX = "JOB_STATE_"
_TASK_PREFIX = "TASK_STATE_"


def timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def request_time(field: str, value: Timestamp) -> datetime:
    """A request's timestamp as a UTC datetime; INVALID_ARGUMENT naming ``field`` for one that
    is no time (nanos outside 0..999,999,999, seconds outside years 1 to 9999)."""
    try:
        return value.ToDatetime(UTC)
    except (ValueError, OverflowError) as exc:
        raise InvalidArgument(field, f"is not a valid time: {exc}") from None


def job_state_pb(state: JobState) -> job_pb2.JobState.ValueType:
    return job_pb2.JobState.Value(_JOB_PREFIX + state.value)


def task_state_pb(state: TaskState) -> job_pb2.TaskState.ValueType:
    return job_pb2.TaskState.Value(_TASK_PREFIX + state.value)


def job_state_from_pb(value: int, field: str = "states") -> JobState:
    if value == job_pb2.JOB_STATE_UNSPECIFIED or value not in job_pb2.JobState.values():
        raise InvalidArgument(field, f"unknown job state {value}")
    return JobState(job_pb2.JobState.Name(value).removeprefix(_JOB_PREFIX))  # type: ignore[arg-type]


def task_state_from_pb(value: int, field: str = "states") -> TaskState:
    if value == job_pb2.TASK_STATE_UNSPECIFIED or value not in job_pb2.TaskState.values():
        raise InvalidArgument(field, f"unknown task state {value}")
    return TaskState(job_pb2.TaskState.Name(value).removeprefix(_TASK_PREFIX))  # type: ignore[arg-type]


def job_pb(job: JobRecord) -> job_pb2.Job:
    return job_pb2.Job(
        job_id=job.id,
        spec=job.spec,
        state=job_state_pb(job.state),
        created_at=timestamp(job.created_at),
        updated_at=timestamp(job.updated_at),
        reason=job.reason,
        message=job.message,
        task_states=[
            job_pb2.TaskStateCount(state=task_state_pb(s), count=n)
            for s, n in sorted(job.task_counts.items(), key=lambda kv: list(TaskState).index(kv[0]))
        ],
        version=job.version,
        elastic=_elastic_pb(job),
        owner=job.owner,
    )


def _elastic_pb(job: JobRecord) -> job_pb2.ElasticStatus | None:
    gang = job.spec.gang
    if not gang.max_instances:
        return None
    return job_pb2.ElasticStatus(
        min_instances=gang.min_instances,
        max_instances=gang.max_instances,
        size=job.gang_size,
        generation=job.generation,
    )


def attempt_pb(attempt: AttemptRecord) -> job_pb2.Attempt:
    return job_pb2.Attempt(
        attempt_id=attempt.id,
        attempt=attempt.attempt,
        state=task_state_pb(attempt.state),
        host=attempt.host,
        reason=attempt.reason,
        message=attempt.message,
        started_at=timestamp(attempt.started_at),
        ended_at=timestamp(attempt.ended_at),
    )


def task_pb(task: TaskRecord) -> job_pb2.Task:
    return job_pb2.Task(
        job_id=task.job_id,
        instance_id=task.instance_id,
        state=task_state_pb(task.state),
        current=attempt_pb(task.current),
        history=[attempt_pb(a) for a in task.history],
        failures=task.failures,
    )


def event_pb(event: EventRecord) -> job_pb2.JobEvent:
    return job_pb2.JobEvent(
        sequence=event.sequence,
        job_id=event.job_id,
        time=timestamp(event.time),
        has_instance=event.instance_id is not None,
        instance_id=event.instance_id or 0,
        from_state=event.from_state,
        to_state=event.to_state,
        reason=event.reason,
        message=event.message,
        host=event.host,
        attempt_id=event.attempt_id,
    )
