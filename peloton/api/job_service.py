"""JobService: the public job API (proto/peloton/v1/job.proto)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import grpc

from peloton.api import convert
from peloton.api.authz import Authorizer, method_name
from peloton.api.caller import current_caller
from peloton.api.interceptor import Context
from peloton.api.watches import WatchHub
from peloton.core.records import EventRecord, JobFilter, JobRecord, TaskRecord
from peloton.core.spec import DEFAULT_POOL
from peloton.core.states import JOB_TERMINAL, JobState
from peloton.errors import InvalidArgument
from peloton.jobmgr.manager import JobManager
from peloton.security.runas import AnyUser, RunAsPolicy
from peloton.storage.jobs import encode_token
from peloton.v1 import job_pb2, job_pb2_grpc

# Most bytes of tasks in one ListTasks page: a default gRPC client receives at most 4 MiB, and
# 10,000 tasks with a long kill message would be more.
LIST_TASKS_BUDGET = 3 * 1024 * 1024
# Most bytes of a GetTask answer: the task and as many of its newest events as fit (a task's
# events, up to 10,000 with a 1 KiB message each, would exceed a default client's 4 MiB).
GET_TASK_BUDGET = 3 * 1024 * 1024

CREATE_JOB = method_name("JobService", "CreateJob")
GET_JOB = method_name("JobService", "GetJob")
LIST_JOBS = method_name("JobService", "ListJobs")
KILL_JOB = method_name("JobService", "KillJob")
RESTART_JOB = method_name("JobService", "RestartJob")
DELETE_JOB = method_name("JobService", "DeleteJob")
GET_TASK = method_name("JobService", "GetTask")
LIST_TASKS = method_name("JobService", "ListTasks")
WATCH_JOB = method_name("JobService", "WatchJob")


class JobService(job_pb2_grpc.JobServiceServicer):
    def __init__(
        self,
        jobs: JobManager,
        watches: WatchHub,
        run_as: RunAsPolicy | None = None,
        *,
        authz: Authorizer,
    ) -> None:
        self._jobs = jobs
        self._watches = watches
        self._run_as = run_as or AnyUser()
        self._authz = authz

    def _allow(self, method: str, job_id: str) -> None:
        """Refuse ``method`` on the job unless the caller may."""
        self._authz.check_job_id(method, job_id, self._jobs.get_job)

    def CreateJob(
        self, request: job_pb2.CreateJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.CreateJobResponse:
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "is required")
        self._authz.check(CREATE_JOB, pool=request.spec.pool or DEFAULT_POOL)
        caller = current_caller()
        self._run_as.check(caller, request.spec.user)
        job, created = self._jobs.create_job(request.spec, request.request_id, caller.name)
        return job_pb2.CreateJobResponse(job=convert.job_pb(job), created=created)

    def GetJob(
        self, request: job_pb2.GetJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.GetJobResponse:
        job = self._jobs.get_job(_job_id(request))
        self._authz.check_job(GET_JOB, job)
        return job_pb2.GetJobResponse(job=convert.job_pb(job))

    def ListJobs(
        self, request: job_pb2.ListJobsRequest, context: grpc.ServicerContext
    ) -> job_pb2.ListJobsResponse:
        flt = JobFilter(
            states=frozenset(convert.job_state_from_pb(s) for s in request.states),
            pool=request.pool,
            name_prefix=request.name_prefix,
            labels=dict(request.labels),
            # Only the jobs the caller may view, filtered in the query so that pages stay full.
            pools=self._authz.viewable_pools(),
        )
        if request.pool:
            self._authz.check(LIST_JOBS, pool=request.pool)
        jobs, token = self._jobs.list_jobs(flt, request.page_size, request.page_token)
        return job_pb2.ListJobsResponse(
            jobs=[convert.job_pb(j) for j in jobs], next_page_token=token
        )

    def KillJob(
        self, request: job_pb2.KillJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.KillJobResponse:
        self._allow(KILL_JOB, _job_id(request))
        job = self._jobs.kill_job(_job_id(request), request.message)
        return job_pb2.KillJobResponse(job=convert.job_pb(job))

    def RestartJob(
        self, request: job_pb2.RestartJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.RestartJobResponse:
        self._allow(RESTART_JOB, _job_id(request))
        job = self._jobs.restart_job(_job_id(request), request.message)
        return job_pb2.RestartJobResponse(job=convert.job_pb(job))

    def DeleteJob(
        self, request: job_pb2.DeleteJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.DeleteJobResponse:
        self._allow(DELETE_JOB, _job_id(request))
        self._jobs.delete_job(_job_id(request))
        return job_pb2.DeleteJobResponse()

    def GetTask(
        self, request: job_pb2.GetTaskRequest, context: grpc.ServicerContext
    ) -> job_pb2.GetTaskResponse:
        self._allow(GET_TASK, _job_id(request))
        task, events, older = self._jobs.get_task_events(_job_id(request), request.instance_id)
        return _task_answer(task, events, older)

    def ListTasks(
        self, request: job_pb2.ListTasksRequest, context: grpc.ServicerContext
    ) -> job_pb2.ListTasksResponse:
        states = frozenset(convert.task_state_from_pb(s) for s in request.states)
        self._allow(LIST_TASKS, _job_id(request))
        tasks, token = self._jobs.list_tasks(
            _job_id(request), states, request.page_size, request.page_token
        )
        return _task_page(tasks, token)

    async def WatchJob(
        self, request: job_pb2.WatchJobRequest, context: Context
    ) -> AsyncIterator[job_pb2.WatchJobResponse]:
        """Send the job's events after ``after_sequence`` as they are committed; end once the
        job is terminal and every event up to then was sent, or when the server shuts down.

        A coroutine on the server's loop (see :mod:`peloton.api.watches`): it holds no worker
        thread while it waits, only while it reads."""
        job_id = _job_id(request)
        last = request.after_sequence
        hub = self._watches
        # The job's state as of the last event sent: a job event carries it (its to_state); a
        # task event leaves it as it was. Reading it from the job instead would race with the
        # events: a job read before a batch that ends it would label its final event RUNNING.
        state: JobState | None = None
        with hub.open(job_id, context.peer()) as watch:
            while True:
                # Noted before reading: a change committed meanwhile wakes us again.
                watch.changed.clear()
                seen = hub.wakes(job_id)
                read = partial(self._job_and_events, job_id, last)
                job, batch = await hub.read_shared(job_id, last, seen, read)
                if state is None:
                    # The first read: nothing was sent before the caller's permission is known.
                    self._authz.check_job(WATCH_JOB, job)
                    # Resuming mid-history: the best known state until the next job event.
                    state = job.state
                for event in batch:
                    if event.instance_id is None:
                        state = JobState(event.to_state)
                    yield job_pb2.WatchJobResponse(
                        event=convert.event_pb(event), job_state=convert.job_state_pb(state)
                    )
                    last = event.sequence
                if batch:
                    continue
                if job.state in JOB_TERMINAL or hub.closed:
                    return
                await watch.changed.wait()

    def _job_and_events(self, job_id: str, after: int) -> tuple[JobRecord, list[EventRecord]]:
        """The job as it is and its events after ``after``: the job read first, so that a job
        seen terminal has all its events in the batch or the next."""
        job = self._jobs.get_job(job_id)
        return job, self._jobs.job_events(job_id, after=after)


def _task_page(tasks: list[TaskRecord], token: str) -> job_pb2.ListTasksResponse:
    """The page of ``tasks``, cut short (at least one task kept) where it would exceed
    LIST_TASKS_BUDGET; the token then resumes after the last task sent."""
    page = job_pb2.ListTasksResponse()
    size = 0
    for task in tasks:
        task_pb = convert.task_pb(task)
        size += task_pb.ByteSize()
        if size > LIST_TASKS_BUDGET and page.tasks:
            page.next_page_token = encode_token([page.tasks[-1].instance_id])
            return page
        page.tasks.append(task_pb)
    page.next_page_token = token
    return page


def _task_answer(
    task: TaskRecord, events: list[EventRecord], older: int
) -> job_pb2.GetTaskResponse:
    """GetTask's answer: the task and its newest ``events`` that fit in GET_TASK_BUDGET (oldest
    first, as read); ``events_omitted`` counts the others, ``older`` ones not read included."""
    answer = job_pb2.GetTaskResponse(task=convert.task_pb(task))
    # The answer's bytes: each field is a tag, a length and the message (events_omitted: at
    # most 6 bytes).
    size = _field_size(answer.task.ByteSize()) + 6
    kept: list[job_pb2.JobEvent] = []
    for event in reversed(events):
        event_pb = convert.event_pb(event)
        size += _field_size(event_pb.ByteSize())
        if size > GET_TASK_BUDGET:
            break
        kept.append(event_pb)
    answer.events.extend(reversed(kept))
    answer.events_omitted = older + len(events) - len(kept)
    return answer


def _field_size(length: int) -> int:
    """Bytes of a length-delimited field of ``length`` bytes (field number below 16)."""
    return 1 + max(1, (length.bit_length() + 6) // 7) + length


def _job_id(request: job_pb2.GetJobRequest | job_pb2.KillJobRequest | object) -> str:
    job_id: str = getattr(request, "job_id", "")
    if not job_id:
        raise InvalidArgument("job_id", "is required")
    return job_id
