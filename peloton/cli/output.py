"""Rendering for the CLI: readable tables, or JSON/YAML for scripts (``--output``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message
from rich import box
from rich.console import Console
from rich.table import Table

from peloton.core.containers import RUNTIME_DIR, container_launch
from peloton.v1 import host_pb2, job_pb2, sweep_pb2


class StateChoice(click.Choice[str]):
    """States accepted in any case, named in errors as the tables spell them (RUNNING)."""

    def __init__(self, states: Sequence[str]) -> None:
        super().__init__(states, case_sensitive=False)

    def get_invalid_choice_message(self, value: Any, ctx: click.Context | None) -> str:
        return f"{value!r} is not one of {', '.join(map(str, self.choices))} (any case)"


FORMATS = ("table", "wide", "json", "yaml")
# A table's REASON is cut to this many characters (the whole text with ``-o wide``).
REASON_WIDTH = 60


def _table_unless_listed(ctx: click.Context, param: click.Parameter, value: str) -> str:
    # Only lists have columns to widen: elsewhere ``wide`` (say from PELOTON_OUTPUT) is the table.
    return "table" if value == "wide" else value


def _format_option(help: str, **extra: Any) -> Callable[[Any], Any]:
    return click.option(
        "--output",
        "-o",
        "fmt",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        envvar="PELOTON_OUTPUT",
        help=help,
        **extra,
    )


output_option = _format_option(
    "Output format: a table for people (wide: the same here), json or yaml for scripts.",
    callback=_table_unless_listed,
)

list_output_option = _format_option(
    f"Output format: a table for people (long reasons cut to {REASON_WIDTH} characters), "
    "wide (the table with reasons whole), json or yaml for scripts."
)


def console(wide: bool = False) -> Console:
    # Wide when piped so tables are not cut at 80 columns in logs and CI output; with -o wide,
    # as wide as the longest row (a terminal still folds what it cannot fit).
    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(width=1_000_000 if wide else 200, highlight=False)


def reason(reason: str, message: str, wide: bool = True) -> str:
    """A state's reason and message as one cell: ``-`` when neither, cut unless ``wide``."""
    text = " - ".join(x for x in (reason, message) if x) or "-"
    if wide or len(text) <= REASON_WIDTH:
        return text
    return text[: REASON_WIDTH - 1].rstrip() + "…"


# Enums whose values print as the tables spell them: RUNNING, not JOB_STATE_RUNNING.
STATE_PREFIXES = {
    job_pb2.JobState.DESCRIPTOR.full_name: "JOB_STATE_",
    job_pb2.TaskState.DESCRIPTOR.full_name: "TASK_STATE_",
    sweep_pb2.SweepState.DESCRIPTOR.full_name: "SWEEP_STATE_",
    sweep_pb2.TrialState.DESCRIPTOR.full_name: "TRIAL_STATE_",
}


def to_dict(message: Message) -> dict[str, Any]:
    """The message as JSON data: every field, zero values included (0, "", [], false), and
    states spelled as in the tables (SUCCEEDED, the spelling the watch's events use too)."""
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _plain_states(message, data)
    return data


def _plain_states(message: Message, data: Any) -> None:
    if not isinstance(data, dict):  # a well-known type written as a string (Timestamp)
        return
    for field in message.DESCRIPTOR.fields:
        if field.name not in data:
            continue
        value = getattr(message, field.name)
        if field.enum_type is not None:
            prefix = STATE_PREFIXES.get(field.enum_type.full_name)
            if prefix is None:
                continue
            names = data[field.name]
            if isinstance(names, list):
                data[field.name] = [n.removeprefix(prefix) for n in names]
            else:
                data[field.name] = names.removeprefix(prefix)
        elif field.message_type is None:
            continue
        elif field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for key, sub in data[field.name].items():
                    _plain_states(value[_map_key(field, key)], sub)
        elif field.is_repeated:
            for item, sub in zip(value, data[field.name], strict=True):
                _plain_states(item, sub)
        else:
            _plain_states(value, data[field.name])


def _map_key(field: Any, key: str) -> Any:
    # JSON map keys are strings; the message's may be numbers or booleans.
    key_type = field.message_type.fields_by_name["key"].type
    if key_type == field.TYPE_STRING:
        return key
    if key_type == field.TYPE_BOOL:
        return key == "true"
    return int(key)


def emit_data(data: Any, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


def one_line(data: Any, fmt: str) -> str:
    """One streamed item: a JSON line, or a YAML document."""
    if fmt == "json":
        return json.dumps(data)
    return "---\n" + yaml.safe_dump(data, sort_keys=False).rstrip()


def job_state(value: int) -> str:
    return job_pb2.JobState.Name(value).removeprefix("JOB_STATE_")  # type: ignore[arg-type]


def task_state(value: int) -> str:
    return job_pb2.TaskState.Name(value).removeprefix("TASK_STATE_")  # type: ignore[arg-type]


def when(ts: Any) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    value: datetime = ts.ToDatetime(tzinfo=UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def task_summary(job: job_pb2.Job) -> str:
    parts = [f"{c.count} {task_state(c.state)}" for c in job.task_states]
    return ", ".join(parts) or "-"


def table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


def print_jobs(jobs: Sequence[job_pb2.Job], wide: bool = False) -> None:
    # Jobs have owners on a daemon with authentication; elsewhere the column would be empty.
    owners = any(j.owner for j in jobs)
    rows = [
        (
            j.job_id,
            j.spec.name,
            j.spec.pool,
            *((j.owner or "-",) if owners else ()),
            job_state(j.state),
            task_summary(j),
            when(j.created_at),
            reason(j.reason, j.message, wide),
        )
        for j in jobs
    ]
    columns = (
        "JOB",
        "NAME",
        "POOL",
        *(("OWNER",) if owners else ()),
        "STATE",
        "TASKS",
        "CREATED",
        "REASON",
    )
    console(wide).print(table(columns, rows))


def print_job(job: job_pb2.Job) -> None:
    spec = job.spec
    r = spec.task.resources
    lines = [
        ("Job", job.job_id),
        ("Name", spec.name),
        ("Pool", spec.pool),
        ("Owner", job.owner or "-"),
        ("State", job_state(job.state)),
        ("Reason", reason(job.reason, job.message)),
        ("Priority", str(spec.priority)),
        ("Instances", instances_line(job)),
        *elastic_lines(job),
        ("Tasks", task_summary(job)),
        ("Resources", f"cpu {r.cpu:g}, mem {r.mem_mb:g} MB, disk {r.disk_mb:g} MB, gpu {r.gpu:g}"),
        ("Command", spec.task.command or "-"),
        ("Run as", spec.user or "the framework's user"),
        *container_lines(spec.task),
        ("Labels", ", ".join(f"{k}={v}" for k, v in sorted(spec.labels.items())) or "-"),
        ("Created", when(job.created_at)),
        ("Updated", when(job.updated_at)),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        click.echo(f"{key + ':':<{width + 1}} {value}")


def instances_line(job: job_pb2.Job) -> str:
    gang = job.spec.gang
    if gang.max_instances:
        return f"{gang.min_instances} to {gang.max_instances} (elastic gang)"
    return f"{job.spec.instances} (gang of {gang.min_instances})"


def elastic_lines(job: job_pb2.Job) -> list[tuple[str, str]]:
    """The Elastic line of ``job get``: min/current/max and generation (elastic gangs only)."""
    if not job.HasField("elastic"):
        return []
    e = job.elastic
    now = f"{e.size} ranks, generation {e.generation}" if e.generation else "not formed yet"
    return [("Elastic", f"{now} (min {e.min_instances}, max {e.max_instances})")]


def container_lines(task: job_pb2.TaskSpec) -> list[tuple[str, str]]:
    """The Image and Volumes lines of ``job get``; none for a task without a container."""
    if not task.HasField("container"):
        return []
    c = container_launch(task)
    assert c is not None
    how = [f"entrypoint {c.entrypoint}", f"/dev/shm {c.shm_mb} MiB"]
    if c.args:
        how.append("args " + " ".join(c.args))
    if c.runtime:
        how.append(f"runtime {c.runtime} at {RUNTIME_DIR}")
    lines = [("Image", f"{c.image} ({', '.join(how)})")]
    for m in c.mounts:
        source = f"image {m.image}" if m.image else m.host_path
        lines.append(
            ("Volume", f"{m.container_path} <- {source} ({'ro' if m.read_only else 'rw'})")
        )
    return lines


def print_tasks(tasks: Sequence[job_pb2.Task], wide: bool = False) -> None:
    rows = [
        (
            str(t.instance_id),
            task_state(t.state),
            str(t.current.attempt),
            t.current.host or "-",
            reason(t.current.reason, t.current.message, wide),
        )
        for t in tasks
    ]
    console(wide).print(table(("INSTANCE", "STATE", "ATTEMPT", "HOST", "REASON"), rows))


def event_line(event: job_pb2.JobEvent) -> str:
    who = f"task {event.instance_id}" if event.has_instance else "job"
    if event.from_state == event.to_state:  # not a change of state: an elastic gang's resize
        return f"{when(event.time)}  {who:<10} {event.message}".rstrip()
    change = f"{event.from_state or '-'} -> {event.to_state}"
    why = " - ".join(x for x in (event.reason, event.message) if x)
    host = f" on {event.host}" if event.host else ""
    return f"{when(event.time)}  {who:<10} {change:<24}{host}  {why}".rstrip()


@dataclass(frozen=True)
class TaskGpus:
    """What GetTaskGpus answered for a task's current attempt; with ``error`` (the status code's
    name) the call failed and ``answer`` holds only the attempt and, as its reason, why."""

    answer: host_pb2.GetTaskGpusResponse
    error: str = ""


def gpus_line(gpus: TaskGpus | None) -> str | None:
    """The GPUs line of ``task get``; None for a task that shows none (no GPUs asked for, or an
    attempt that has not reached a host)."""
    if gpus is None:
        return None
    a = gpus.answer
    if gpus.error:
        return f"unknown ({gpus.error}: {a.reason})"
    if not a.requested:
        return None
    if not a.reported:
        return f"not reported ({a.reason})"
    return ",".join(map(str, a.gpu_indices)) or "none (the task sees no GPU)"


def gpus_data(gpus: TaskGpus | None) -> dict[str, Any] | None:
    """``task get``'s ``gpus`` data: every field of the answer, and ``error`` ("" when it was
    answered; else the status code's name, ``reason`` the error's details and ``requested``
    null, as it is not known). None for an attempt that has not reached a host."""
    if gpus is None:
        return None
    data = to_dict(gpus.answer)
    if gpus.error:
        data["requested"] = None
    data["error"] = gpus.error
    return data


def print_task(response: job_pb2.GetTaskResponse, gpus: TaskGpus | None = None) -> None:
    t = response.task
    click.echo(f"Task:     {t.job_id} instance {t.instance_id}")
    click.echo(f"State:    {task_state(t.state)}")
    click.echo(f"Attempt:  {t.current.attempt_id}")
    click.echo(f"Host:     {t.current.host or '-'}")
    line = gpus_line(gpus)
    if line is not None:
        click.echo(f"GPUs:     {line}")
    click.echo(f"Failures: {t.failures}")
    click.echo(f"Reason:   {reason(t.current.reason, t.current.message)}")
    if t.history:
        click.echo("History:")
        rows = [
            (
                a.attempt_id,
                task_state(a.state),
                a.host or "-",
                when(a.started_at),
                when(a.ended_at),
                reason(a.reason, a.message),
            )
            for a in t.history
        ]
        console().print(table(("ATTEMPT", "STATE", "HOST", "STARTED", "ENDED", "REASON"), rows))
    if response.events:
        click.echo("Events:")
        for e in response.events:
            click.echo("  " + event_line(e))
