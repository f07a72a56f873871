"""``peloton job ...`` and ``peloton task ...``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from peloton.cli import output as out
from peloton.cli.common import EXIT_USAGE, CliError, cli_error, connect, read_text_file
from peloton.client import ClientError, PelotonClient
from peloton.core.spec import (
    check_pool_path,
    load_job_spec_yaml,
    validate_job_spec,
    with_defaults,
)
from peloton.core.states import TASK_UNLAUNCHED, JobState, TaskState
from peloton.v1 import host_pb2, job_pb2

JOB_STATES = [s.value for s in JobState]
TASK_STATES = [s.value for s in TaskState]
TERMINAL_PB = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_KILLED)


# A whole job id; anything else is looked up as the start of one.
JOB_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Candidates an ambiguous prefix's error names at most.
SHOWN_CANDIDATES = 5


def resolve_job_id(client: PelotonClient, given: str) -> str:
    """The job id that ``given`` starts, if exactly one does (a whole id is used as it is; a
    prefix of none is passed on, so the server says it is not found). Several: a usage error
    naming them."""
    if JOB_ID.fullmatch(given) or not given:
        return given
    matches = [j for j in client.iter_jobs(page_size=1000) if j.job_id.startswith(given)]
    if len(matches) == 1:
        return matches[0].job_id
    if not matches:
        return given
    named = ", ".join(f"{j.job_id} ({j.spec.name})" for j in matches[:SHOWN_CANDIDATES])
    more = f" and {len(matches) - SHOWN_CANDIDATES} more" if len(matches) > SHOWN_CANDIDATES else ""
    raise CliError(
        f"job id prefix {given!r} is ambiguous: {len(matches)} jobs start with it: {named}{more}",
        EXIT_USAGE,
    )


def _label(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--label")
        out[key] = value
    return out


@click.group()
def job() -> None:
    """Submit, inspect, kill, restart and delete jobs.

    JOB_ID is a job's id or any prefix of it that no other job's id starts with.
    """


@job.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path, allow_dash=True))
@click.option("--pool", "-p", help="Put the job in this leaf pool (overrides the file).")
@click.option("--request-id", default="", help="Idempotency key: retrying returns the same job.")
@click.option(
    "--quiet", "-q", is_flag=True, help="Print only the job's id (JOB=$(peloton job submit -q F))."
)
@out.output_option
@click.pass_context
def submit(
    ctx: click.Context, file: Path, pool: str | None, request_id: str, quiet: bool, fmt: str
) -> None:
    """Submit the job described in FILE (YAML; - reads standard input)."""
    text = read_text_file(file)
    try:
        spec = load_job_spec_yaml(text)
        if pool is not None:
            check_pool_path(pool, "--pool")
            spec.pool = pool
        # The server checks the same, but only once the whole spec (a 10 MB command) was sent.
        validate_job_spec(with_defaults(spec))
    except Exception as exc:
        raise cli_error(exc) from None
    with connect(ctx) as client:
        response = client.create_job_ex(spec, request_id)
    if quiet:
        click.echo(response.job.job_id)
    elif fmt == "table":
        verb = "created" if response.created else "already exists (same request id)"
        click.echo(f"job {response.job.job_id} {verb}")
    else:
        out.emit_data(out.to_dict(response.job), fmt)


@job.command()
@click.argument("job_id")
@out.output_option
@click.pass_context
def get(ctx: click.Context, job_id: str, fmt: str) -> None:
    """Show one job: state, why it is in it, and its tasks' states."""
    with connect(ctx) as client:
        j = client.get_job(resolve_job_id(client, job_id))
    if fmt == "table":
        out.print_job(j)
    else:
        out.emit_data(out.to_dict(j), fmt)


@job.command(name="list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=out.StateChoice(JOB_STATES),
    metavar="STATE",
    help=f"Only jobs in this state (repeatable; any case): {', '.join(JOB_STATES)}.",
)
@click.option("--pool", "-p", default="", help="Only jobs in this pool.")
@click.option("--name", "name_prefix", default="", help="Only jobs whose name starts with this.")
@click.option(
    "--label", "-l", "labels", multiple=True, help="Only jobs with KEY=VALUE (repeatable)."
)
@click.option(
    "--limit", default=100, show_default=True, type=click.IntRange(1, 1000), help="Jobs per page."
)
@click.option("--all", "all_pages", is_flag=True, help="Fetch every page, not just the first.")
@out.list_output_option
@click.pass_context
def list_(
    ctx: click.Context,
    states: tuple[str, ...],
    pool: str,
    name_prefix: str,
    labels: tuple[str, ...],
    limit: int,
    all_pages: bool,
    fmt: str,
) -> None:
    """List jobs, newest first, with why each is in its state (REASON; whole with -o wide)."""
    filters = {
        "states": [job_pb2.JobState.Value("JOB_STATE_" + s.upper()) for s in states],
        "pool": pool,
        "name_prefix": name_prefix,
        "labels": _label(labels),
    }
    jobs: list[job_pb2.Job] = []
    more = ""
    with connect(ctx) as client:
        token = ""
        while True:
            page = client.list_jobs(page_size=limit, page_token=token, **filters)  # type: ignore[arg-type]
            jobs.extend(page.jobs)
            token = page.next_page_token
            if not token or not all_pages:
                more = token
                break
    if fmt in ("table", "wide"):
        out.print_jobs(jobs, wide=fmt == "wide")
        if more:
            click.echo("(more jobs: use --all or --limit)", err=True)
    else:
        out.emit_data({"jobs": [out.to_dict(j) for j in jobs], "next_page_token": more}, fmt)


@job.command()
@click.argument("job_id")
@click.option("--message", "-m", default="", help="Why; kept in the job's events.")
@out.output_option
@click.pass_context
def kill(ctx: click.Context, job_id: str, message: str, fmt: str) -> None:
    """Kill a job's tasks (SIGTERM, then SIGKILL after the job's grace period)."""
    with connect(ctx) as client:
        j = client.kill_job(resolve_job_id(client, job_id), message)
    _show_state(j, fmt)


@job.command()
@click.argument("job_id")
@click.option("--message", "-m", default="", help="Why; kept in the job's events.")
@out.output_option
@click.pass_context
def restart(ctx: click.Context, job_id: str, message: str, fmt: str) -> None:
    """Start a new attempt of every task of a job."""
    with connect(ctx) as client:
        j = client.restart_job(resolve_job_id(client, job_id), message)
    _show_state(j, fmt)


@job.command()
@click.argument("job_id")
@click.pass_context
def delete(ctx: click.Context, job_id: str) -> None:
    """Delete a job that has ended (SUCCEEDED, FAILED or KILLED) and its history."""
    with connect(ctx) as client:
        job_id = resolve_job_id(client, job_id)
        client.delete_job(job_id)
    click.echo(f"job {job_id} deleted")


@job.command()
@click.argument("job_id")
@out.output_option
@click.pass_context
def watch(ctx: click.Context, job_id: str, fmt: str) -> None:
    """Print a job's events as they happen until it ends.

    Exits 0 if the job SUCCEEDED, 1 if it FAILED or was KILLED (or the server stopped first).
    """
    final = job_pb2.JOB_STATE_UNSPECIFIED
    with connect(ctx) as client:
        for update in client.watch_job(resolve_job_id(client, job_id)):
            final = update.job_state
            if fmt == "table":
                click.echo(out.event_line(update.event))
            else:
                click.echo(out.one_line(out.to_dict(update), fmt))
    if final not in TERMINAL_PB:
        raise CliError("the watch ended before the job did (is the server shutting down?)")
    if final != job_pb2.JOB_STATE_SUCCEEDED:
        ctx.exit(1)


def _show_state(j: job_pb2.Job, fmt: str) -> None:
    if fmt == "table":
        click.echo(f"job {j.job_id} {out.job_state(j.state)}")
    else:
        out.emit_data(out.to_dict(j), fmt)


@click.group()
def task() -> None:
    """Inspect a job's tasks and their attempts.

    JOB_ID is a job's id or any prefix of it that no other job's id starts with.
    """


@task.command(name="list")
@click.argument("job_id")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=out.StateChoice(TASK_STATES),
    metavar="STATE",
    help=f"Only tasks in this state (repeatable; any case): {', '.join(TASK_STATES)}.",
)
@out.list_output_option
@click.pass_context
def task_list(ctx: click.Context, job_id: str, states: tuple[str, ...], fmt: str) -> None:
    """List a job's tasks with their current attempt and its REASON (whole with -o wide)."""
    values = [job_pb2.TaskState.Value("TASK_STATE_" + s.upper()) for s in states]
    with connect(ctx) as client:
        tasks = list(client.iter_tasks(resolve_job_id(client, job_id), states=values))
    if fmt in ("table", "wide"):
        out.print_tasks(tasks, wide=fmt == "wide")
    else:
        out.emit_data({"tasks": [out.to_dict(t) for t in tasks]}, fmt)


@task.command(name="get")
@click.argument("job_id")
@click.argument("instance", type=click.IntRange(0, 2**32 - 1))  # a uint32 instance id
@out.output_option
@click.pass_context
def task_get(ctx: click.Context, job_id: str, instance: int, fmt: str) -> None:
    """Show one task: its current attempt, earlier attempts and events.

    For a task that asks for GPUs, the host indices of the GPUs its current attempt sees, as the
    task reported them into its sandbox (read from its agent), or why they are not known.
    """
    with connect(ctx) as client:
        response = client.get_task(resolve_job_id(client, job_id), instance)
        gpus = task_gpus(client, response.task)
    if fmt == "table":
        out.print_task(response, gpus)
        if response.events_omitted:
            # The server keeps a task's newest events that fit in one answer (README, Limits).
            n = response.events_omitted
            click.echo(f"  ({n} older event{'s' if n != 1 else ''} not shown)")
    else:
        # events_omitted is in the data (0 when every event is there).
        out.emit_data({**out.to_dict(response), "gpus": out.gpus_data(gpus)}, fmt)


def task_gpus(client: PelotonClient, task: job_pb2.Task) -> out.TaskGpus | None:
    """The GPUs of the task's current attempt; None if it has not reached a host. An error of the
    server or the agent is part of the answer: the rest of the task is still worth showing."""
    current = task.current
    if not current.host or TaskState(out.task_state(current.state)) in TASK_UNLAUNCHED:
        return None
    try:
        answer = client.get_task_gpus(task.job_id, task.instance_id, attempt=current.attempt)
    except ClientError as exc:
        failed = host_pb2.GetTaskGpusResponse(
            reason=exc.details, task_id=current.attempt_id, attempt=current.attempt
        )
        return out.TaskGpus(failed, exc.code.name)
    return out.TaskGpus(answer)


# How often --follow asks for more output.
LOG_POLL_SECONDS = 0.5


@task.command(name="logs")
@click.argument("job_id")
@click.argument("instance", type=click.IntRange(0, 2**32 - 1))
@click.option("--stderr", is_flag=True, help="The task's stderr instead of its stdout.")
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing new output until the attempt ends."
)
@click.option(
    "--attempt",
    type=click.IntRange(1, 2**32 - 1),
    metavar="N",
    help="Attempt N (1, 2, ...: as `task get` numbers them).",
)
@click.option(
    "--previous",
    "-p",
    is_flag=True,
    help="The attempt before the current one (the run that ended for it to start).",
)
@click.pass_context
def task_logs(
    ctx: click.Context,
    job_id: str,
    instance: int,
    stderr: bool,
    follow: bool,
    attempt: int | None,
    previous: bool,
) -> None:
    """Print a task's output: an attempt's sandbox file, read from the host it ran on.

    Without --attempt or --previous, the latest attempt that reached a host: a task waiting to
    restart shows the run that ended. Ended attempts can be read while their agent keeps their
    sandboxes (until Mesos garbage-collects them).

    \b
    Examples:
      peloton task logs JOB_ID 0 -f          # follow the running attempt
      peloton task logs JOB_ID 0 --previous  # why did it restart?
      peloton task logs JOB_ID 0 --attempt 1 --stderr
    """
    import time

    if attempt is not None and previous:
        raise click.UsageError("--attempt and --previous are mutually exclusive", ctx)
    offset = 0
    with connect(ctx) as client:
        job_id = resolve_job_id(client, job_id)
        while True:
            piece = client.get_task_logs(
                job_id,
                instance,
                stderr=stderr,
                offset=offset,
                attempt=attempt or 0,
                previous=previous,
            )
            # Stay on the attempt first read, should the task restart while it is followed.
            attempt, previous = piece.attempt, False
            if piece.data:
                sys.stdout.buffer.write(piece.data)
                sys.stdout.buffer.flush()
                offset = piece.offset + len(piece.data)
                continue
            if not follow or piece.ended:
                return
            time.sleep(LOG_POLL_SECONDS)  # the agent has no push API for sandbox files
