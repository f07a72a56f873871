"""Traces: the jobs a simulation replays, as CSV; a synthetic generator; converters for the
public Philly and Microsoft ITP traces.

**The CSV** (one job a row, a header naming the columns, in any order)::

    job_id,arrival_s,pool,priority,tasks,gpu_per_task,cpu_per_task,mem_mb_per_task,duration_s,gpu_model,preemptible
    j1,0,/default,0,2,4,16,65536,3600,,1
    j2,12.5,/research/vision,10,1,1,4,16384,600,A100,0

- ``job_id``: unique; ``arrival_s``: when the job is submitted, seconds from the start (>= 0);
- ``tasks``: the gang (every task starts together, or none); ``gpu_per_task`` (a whole number),
  ``cpu_per_task`` and ``mem_mb_per_task`` (> 0): what each task asks for;
- ``duration_s`` (> 0): how long the gang runs once started;
- optional columns: ``pool`` (a leaf pool; default ``/default``), ``priority`` (default 0),
  ``gpu_model`` (a constraint ``gpu_model eq MODEL``; empty: any model), ``preemptible`` (0 or
  1; default 1), ``name`` (the job's name, default ``job``: the resource manager learns expected
  run times per pool and name, which the BACKFILL and LAS policies use) and ``max_runtime_s``
  (the job's ``max_runtime_seconds``: its expected run time for BACKFILL and LAS, and a limit:
  a job still going that long after its first start is killed; empty or 0: none).

A row is turned into the job spec a user would submit (:func:`job_spec`) and checked by the same
validation as ``CreateJob``; an error names the file, the line and the column.

**The generator** (:func:`generate`, ``peloton simulate generate``) draws a Philly-like
workload (after Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
Workloads", ATC '19: most jobs use one GPU, few use many; run times span minutes to days):

- GPUs per job from :data:`GANG_GPUS`: 1 (60 %), 2 (12 %), 4 (12 %), 8 (9 %), 16 (4 %),
  32 (2 %), 64 (1 %);
- shape: a job of G GPUs is one task of G GPUs when G fits one host (``gpus_per_host``), else
  G / ``gpus_per_host`` tasks of ``gpus_per_host`` GPUs (one task per machine, as Philly's jobs
  ran); ``shape="gpu"`` makes G tasks of one GPU instead. Each task asks for 4 cpus and 16 GiB
  of memory per GPU;
- durations heavy-tailed, log-normal: each job runs one of :data:`MODELS` models (its name,
  ``model-07``) whose median is log-normal around :data:`MEDIAN_DURATION_S` (30 min, sigma
  :data:`MODEL_SIGMA` 1.2), and a run is log-normal around its model's median (sigma
  :data:`RUN_SIGMA` 0.9): over all jobs log-normal with median 30 min and sigma 1.5 (the mean
  is about 3x the median; 1 % of jobs run longer than 16 h), clipped to [1 min, 7 days], drawn
  independently of the size. A model's runs are alike, as reruns of one training are: what the
  resource manager learns per name is worth something;
- arrivals Poisson: exponential gaps at the rate that makes the offered load (GPU-seconds asked
  per second over the cluster's GPUs) equal ``load``, computed from the drawn jobs' own mean
  GPU-seconds, so a trace's load is exact for its jobs;
- priority 1 for a ``high_priority`` fraction of jobs (default 10 %), else 0; every job
  preemptible; pools drawn uniformly from ``pools``.

**Philly** (:func:`convert_philly`, ``peloton simulate convert --philly``): the
``cluster_job_log`` file of the Microsoft Philly trace (https://github.com/msr-fiddle/philly-traces;
unpack ``trace-data.tar.gz`` there and pass ``trace-data/cluster_job_log``), a JSON list of jobs
``{"jobid", "vc", "user", "status", "submitted_time", "attempts": [{"start_time", "end_time",
"detail": [{"ip", "gpus": ["gpu0", ...]}]}]}`` with times as ``YYYY-MM-DD HH:MM:SS``. Each job
becomes a row: arrival from ``submitted_time`` (seconds after the first job's), GPUs from the
last attempt's ``detail`` (one task per machine when every machine had the same number of GPUs,
else one task per GPU), duration from the last attempt's end minus its start, name from
``user``; cpu and memory are not in the trace (4 cpus and 16 GiB per GPU). Jobs that never ran
(no attempt with a start, an end and GPUs) are skipped and counted. Every status (Pass, Killed,
Failed) is kept: the GPUs were held all the same. ``tests/test_sim_philly_cluster_job_log.json``
is a small file of that shape.

**Microsoft ITP** (:func:`convert_itp`, ``peloton simulate convert --itp``): the job traces of
Microsoft's internal ITP GPU clusters published with ElasticFlow (ASPLOS '23),
https://github.com/microsoft/elasticflow-traces (MIT): ``data/raw-traces.tar.gz`` there holds one
CSV per cluster, ``cluster01.csv`` ... ``cluster10.csv`` (69,351 jobs over two months of 2021;
``bench/traces/elasticflow-raw-traces.tar.gz`` is a copy). The columns (:data:`ITP_COLUMNS`;
others, such as those of the repository's processed ``elasticflow-traces.tar.gz``, are
ignored)::

    job_id,submission_time,duration,num_gpu
    6b2d9ccc-6279-403c-e1a2-cfe7810d5c57,16566,3890,4

Each row becomes a job: arrival from ``submission_time`` (seconds from the start of the
collection; rebased to the first job's, so a replay starts with it), duration from ``duration``
(seconds it ran: the trace records no outcome), its ``job_id``; the gang from ``num_gpu``: one
task of G GPUs when G fits a host (``gpus_per_host``, default 8), else G / ``gpus_per_host``
tasks of ``gpus_per_host`` GPUs (one per host, as the generator's), or G tasks of one GPU when
``gpus_per_host`` does not divide G (the trace does not say how a job's GPUs were spread). The
trace names no user, model, VC or priority: every job is named ``job`` (so BACKFILL and LAS
expect what the pool's last finished jobs took), has priority 0 and goes to ``pool``; 4 cpus
and 16 GiB per GPU as for Philly. Jobs of 0 GPUs or 0 s are skipped and counted; a malformed
row (a missing column or value, a negative or non-numeric number, a fractional ``num_gpu``, a
repeated ``job_id``) is a TraceError naming the file, the line and the column.
``tests/test_sim_trace_itp_cluster.csv`` is a small file of that shape.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from peloton.core.spec import DEFAULT_POOL, MAX_GPU, validate_job_spec, with_defaults
from peloton.errors import InvalidArgument
from peloton.v1 import common_pb2, job_pb2

COLUMNS = (
    "job_id",
    "arrival_s",
    "pool",
    "priority",
    "tasks",
    "gpu_per_task",
    "cpu_per_task",
    "mem_mb_per_task",
    "duration_s",
    "gpu_model",
    "preemptible",
    "name",
    "max_runtime_s",
)
REQUIRED = (
    "job_id",
    "arrival_s",
    "tasks",
    "gpu_per_task",
    "cpu_per_task",
    "mem_mb_per_task",
    "duration_s",
)

# GPUs per job and their probabilities (Philly-like: most jobs small).
GANG_GPUS: tuple[tuple[int, float], ...] = (
    (1, 0.60),
    (2, 0.12),
    (4, 0.12),
    (8, 0.09),
    (16, 0.04),
    (32, 0.02),
    (64, 0.01),
)
MEDIAN_DURATION_S = 1800.0
SIGMA = 1.5
MIN_DURATION_S = 60.0
MAX_DURATION_S = 7 * 86_400.0
CPU_PER_GPU = 4.0
MEM_MB_PER_GPU = 16_384.0
# A job's name when the trace gives none: the resource manager learns expected run times per
# pool and name (BACKFILL and LAS use them), so unnamed jobs share one expectation.
DEFAULT_NAME = "job"
# Generated jobs are runs of this many models ("model-07"), each with its own median duration.
MODELS = 40
MODEL_SIGMA = 1.2  # of the models' medians around MEDIAN_DURATION_S
RUN_SIGMA = 0.9  # of a model's runs around its median: sqrt(1.2^2 + 0.9^2) = SIGMA


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file, line and field."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace."""

    job_id: str
    arrival_s: float
    tasks: int
    gpu_per_task: int
    cpu_per_task: float
    mem_mb_per_task: float
    duration_s: float
    pool: str = DEFAULT_POOL
    priority: int = 0
    gpu_model: str = ""
    preemptible: bool = True
    name: str = DEFAULT_NAME
    max_runtime_s: int = 0
    # The spec it is submitted as (filled in by read/for_jobs; not part of equality).
    spec: job_pb2.JobSpec | None = field(default=None, compare=False, repr=False)

    @property
    def gpus(self) -> int:
        return self.tasks * self.gpu_per_task

    def row(self) -> dict[str, str]:
        return {
            "job_id": self.job_id,
            "arrival_s": _num(self.arrival_s),
            "pool": self.pool,
            "priority": str(self.priority),
            "tasks": str(self.tasks),
            "gpu_per_task": str(self.gpu_per_task),
            "cpu_per_task": _num(self.cpu_per_task),
            "mem_mb_per_task": _num(self.mem_mb_per_task),
            "duration_s": _num(self.duration_s),
            "gpu_model": self.gpu_model,
            "preemptible": "1" if self.preemptible else "0",
            "name": self.name,
            "max_runtime_s": str(self.max_runtime_s) if self.max_runtime_s else "",
        }


def _num(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def job_spec(job: TraceJob) -> job_pb2.JobSpec:
    """The spec a user would submit for ``job``, with defaults filled in and validated
    (InvalidArgument names the field)."""
    task = job_pb2.TaskSpec(
        command=f"exec train --sim {job.duration_s:g}",
        resources=common_pb2.Resources(
            cpu=job.cpu_per_task, mem_mb=job.mem_mb_per_task, gpu=job.gpu_per_task
        ),
    )
    if job.gpu_model:
        task.constraints.append(
            job_pb2.Constraint(attribute="gpu_model", op="eq", values=[job.gpu_model])
        )
    spec = with_defaults(
        job_pb2.JobSpec(
            name=job.name,
            max_runtime_seconds=job.max_runtime_s,
            pool=job.pool,
            priority=job.priority,
            instances=job.tasks,
            task=task,
            preemption=job_pb2.PreemptionPolicy(preemptible=job.preemptible),
        )
    )
    validate_job_spec(spec)
    return spec


# ---------------------------------------------------------------------------- CSV


def read_csv(path: str | Path) -> list[TraceJob]:
    """The jobs of a trace file, by arrival (ties in file order), each with its spec."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return parse_csv(f, str(path))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text") from None


def _reader(f: TextIO, name: str, columns: Sequence[str]) -> tuple[csv.DictReader[str], list[str]]:
    """A reader of the CSV ``f`` and its header (names stripped); TraceError if it has none
    (``columns``: the header expected, for the message)."""
    reader = csv.DictReader(f)
    header = [h.strip() for h in (reader.fieldnames or [])]
    if not header:
        raise TraceError(f"{name}: empty; expected a header: {','.join(columns)}")
    reader.fieldnames = header
    return reader, header


def parse_csv(f: TextIO, name: str = "trace") -> list[TraceJob]:
    reader, header = _reader(f, name, COLUMNS)
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        raise TraceError(
            f"{name} line 1: unknown column {unknown[0]!r}; columns: {', '.join(COLUMNS)}"
        )
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise TraceError(f"{name} line 1: missing column {missing[0]!r}")
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    for row in reader:
        line = reader.line_num
        if None in row:
            raise TraceError(f"{name} line {line}: more fields than the header has columns")
        if not any((v or "").strip() for v in row.values()):
            continue  # a blank line
        job = _job_of_row(row, f"{name} line {line}")
        if job.job_id in seen:
            raise TraceError(f"{name} line {line}: job_id {job.job_id!r} appears twice")
        seen.add(job.job_id)
        jobs.append(job)
    if not jobs:
        raise TraceError(f"{name}: no jobs")
    return sorted(jobs, key=lambda j: j.arrival_s)


def _text(row: Mapping[str, str | None], column: str, default: str = "") -> str:
    return (row.get(column) or "").strip() or default


def _number(
    row: Mapping[str, str | None], column: str, where: str, *, positive: bool, default: str = ""
) -> float:
    """``column`` of ``row`` as a finite number >= 0 (> 0 if ``positive``); TraceError naming
    ``where`` and the column otherwise."""
    raw = _text(row, column, default)
    if not raw:
        raise TraceError(f"{where}: {column}: is required")
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"{where}: {column}: not a number: {raw!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise TraceError(
            f"{where}: {column}: must be a number {'>' if positive else '>='} 0 (got {raw})"
        )
    return value


def _whole(
    row: Mapping[str, str | None], column: str, where: str, *, least: int, default: str = ""
) -> int:
    """``column`` of ``row`` as a whole number >= ``least``; TraceError naming ``where`` and the
    column otherwise."""
    raw = _text(row, column, default)
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{where}: {column}: not a whole number: {raw!r}") from None
    if value < least:
        raise TraceError(f"{where}: {column}: must be at least {least} (got {value})")
    return value


def _job_of_row(row: Mapping[str, str | None], where: str) -> TraceJob:
    job_id = _text(row, "job_id")
    if not job_id:
        raise TraceError(f"{where}: job_id: is required")
    preemptible = _text(row, "preemptible", "1")
    if preemptible not in ("0", "1"):
        raise TraceError(f"{where}: preemptible: must be 0 or 1 (got {preemptible!r})")
    priority_raw = _text(row, "priority", "0")
    try:
        priority = int(priority_raw)
    except ValueError:
        raise TraceError(f"{where}: priority: not a whole number: {priority_raw!r}") from None
    job = TraceJob(
        job_id=job_id,
        arrival_s=_number(row, "arrival_s", where, positive=False),
        tasks=_whole(row, "tasks", where, least=1),
        gpu_per_task=_whole(row, "gpu_per_task", where, least=0),
        cpu_per_task=_number(row, "cpu_per_task", where, positive=True),
        mem_mb_per_task=_number(row, "mem_mb_per_task", where, positive=True),
        duration_s=_number(row, "duration_s", where, positive=True),
        pool=_text(row, "pool", DEFAULT_POOL),
        priority=priority,
        gpu_model=_text(row, "gpu_model"),
        preemptible=preemptible == "1",
        name=_text(row, "name", DEFAULT_NAME),
        max_runtime_s=_whole(row, "max_runtime_s", where, least=0, default="0"),
    )
    return with_spec(job, where)


def with_spec(job: TraceJob, where: str) -> TraceJob:
    """``job`` with its validated spec (TraceError naming ``where`` and the field)."""
    try:
        spec = job_spec(job)
    except InvalidArgument as exc:
        raise TraceError(f"{where}: {_column_of(exc.field)}: {exc.reason}") from None
    object.__setattr__(job, "spec", spec)
    return job


def _column_of(spec_field: str) -> str:
    return {
        "instances": "tasks",
        "task.resources.gpu": "gpu_per_task",
        "task.resources.cpu": "cpu_per_task",
        "task.resources.mem_mb": "mem_mb_per_task",
        "pool": "pool",
        "priority": "priority",
        "max_runtime_seconds": "max_runtime_s",
    }.get(spec_field, spec_field)


def write_csv(jobs: Iterable[TraceJob], out: TextIO) -> int:
    """Write ``jobs`` as a trace CSV; returns how many."""
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    n = 0
    for job in jobs:
        writer.writerow(job.row())
        n += 1
    return n


def to_csv_text(jobs: Iterable[TraceJob]) -> str:
    buf = io.StringIO()
    write_csv(jobs, buf)
    return buf.getvalue()


# ---------------------------------------------------------------------------- generator


def generate(
    jobs: int,
    gpus: int,
    load: float = 0.9,
    seed: int = 0,
    *,
    gpus_per_host: int = 8,
    shape: str = "host",
    pools: Sequence[str] = (DEFAULT_POOL,),
    high_priority: float = 0.1,
) -> list[TraceJob]:
    """A synthetic Philly-like trace of ``jobs`` jobs offering ``load`` of ``gpus`` GPUs (see
    the module's docstring for the distributions). Deterministic for a ``seed``."""
    if jobs < 1:
        raise ValueError(f"jobs: must be at least 1 (got {jobs})")
    if gpus < 1:
        raise ValueError(f"gpus: must be at least 1 (got {gpus})")
    if not 0 < load <= 10:
        raise ValueError(f"load: must be in (0, 10] (got {load:g})")
    if gpus_per_host < 1:
        raise ValueError(f"gpus per host: must be at least 1 (got {gpus_per_host})")
    if shape not in ("host", "gpu"):
        raise ValueError(f"shape: must be host or gpu (got {shape!r})")
    if not 0 <= high_priority <= 1:
        raise ValueError(f"high priority fraction: must be in [0, 1] (got {high_priority:g})")
    if not pools:
        raise ValueError("pools: at least one")
    rng = random.Random(seed)
    sizes = [g for g, _ in GANG_GPUS]
    weights = [w for _, w in GANG_GPUS]
    medians = [math.log(MEDIAN_DURATION_S) + rng.gauss(0.0, MODEL_SIGMA) for _ in range(MODELS)]
    drawn: list[tuple[int, float, int]] = []
    for _ in range(jobs):
        g = rng.choices(sizes, weights)[0]
        model = rng.randrange(MODELS)
        d = rng.lognormvariate(medians[model], RUN_SIGMA)
        drawn.append((g, round(min(MAX_DURATION_S, max(MIN_DURATION_S, d))), model))
    mean_gpu_seconds = sum(g * d for g, d, _ in drawn) / jobs
    rate = load * gpus / mean_gpu_seconds  # jobs per second
    out: list[TraceJob] = []
    t = 0.0
    width = len(str(jobs))
    for i, (g, d, model) in enumerate(drawn):
        if i:
            t += rng.expovariate(rate)
        if shape == "gpu":
            tasks, per = g, 1
        elif g <= gpus_per_host:
            tasks, per = 1, g
        else:
            tasks, per = math.ceil(g / gpus_per_host), gpus_per_host
        job = TraceJob(
            job_id=f"j{i + 1:0{width}d}",
            arrival_s=round(t, 3),
            tasks=tasks,
            gpu_per_task=per,
            cpu_per_task=CPU_PER_GPU * per,
            mem_mb_per_task=MEM_MB_PER_GPU * per,
            duration_s=d,
            pool=pools[rng.randrange(len(pools))],
            priority=1 if rng.random() < high_priority else 0,
            preemptible=True,
            name=f"model-{model:02d}",
        )
        out.append(job)
    return out


# ---------------------------------------------------------------------------- Philly


@dataclass(frozen=True)
class Converted:
    """A converted trace and what was left out, by why."""

    jobs: list[TraceJob]
    skipped: Mapping[str, int]


_PHILLY_TIME = "%Y-%m-%d %H:%M:%S"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")


def _philly_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or value in ("", "None"):
        return None
    try:
        return datetime.strptime(value, _PHILLY_TIME)
    except ValueError:
        return None


def convert_philly(path: str | Path, pool: str = DEFAULT_POOL) -> Converted:
    """The Philly ``cluster_job_log`` at ``path`` as trace jobs in ``pool`` (TraceError if the
    file is not such a log)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: not a JSON cluster_job_log: {exc}") from None
    if not isinstance(data, list):
        raise TraceError(f"{path}: expected a JSON list of jobs (Philly's cluster_job_log)")
    return philly_jobs(data, pool, str(path))


def philly_jobs(data: Sequence[Any], pool: str = DEFAULT_POOL, name: str = "") -> Converted:
    skipped: dict[str, int] = {}
    rows: list[tuple[datetime, str, int, int, float, str]] = []

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    for i, job in enumerate(data):
        if not isinstance(job, dict):
            raise TraceError(f"{name}: job {i}: expected an object")
        submitted = _philly_time(job.get("submitted_time"))
        if submitted is None:
            skip("no submitted_time")
            continue
        attempts = [a for a in (job.get("attempts") or []) if isinstance(a, dict)]
        ran = [
            a
            for a in attempts
            if _philly_time(a.get("start_time")) and _philly_time(a.get("end_time"))
        ]
        if not ran:
            skip("never ran")
            continue
        last = ran[-1]
        per_machine = [
            len(m.get("gpus") or [])
            for m in (last.get("detail") or [])
            if isinstance(m, dict) and m.get("gpus")
        ]
        if not per_machine:
            skip("no GPUs")
            continue
        start, end = _philly_time(last["start_time"]), _philly_time(last["end_time"])
        assert start is not None and end is not None
        duration = (end - start).total_seconds()
        if duration <= 0:
            skip("ran 0 s")
            continue
        if len(set(per_machine)) == 1:
            tasks, per = len(per_machine), per_machine[0]
        else:
            tasks, per = sum(per_machine), 1
        user = str(job.get("user") or DEFAULT_NAME)
        if not _NAME.match(user):
            user = DEFAULT_NAME
        rows.append((submitted, str(job.get("jobid") or f"job-{i}"), tasks, per, duration, user))
    if not rows:
        return Converted([], skipped)
    first = min(r[0] for r in rows)
    out: list[TraceJob] = []
    seen: set[str] = set()
    for submitted, job_id, tasks, per, duration, user in sorted(rows, key=lambda r: r[0]):
        if job_id in seen:
            skip("duplicate jobid")
            continue
        seen.add(job_id)
        out.append(
            TraceJob(
                job_id=job_id,
                arrival_s=(submitted - first).total_seconds(),
                tasks=tasks,
                gpu_per_task=per,
                cpu_per_task=CPU_PER_GPU * per,
                mem_mb_per_task=MEM_MB_PER_GPU * per,
                duration_s=duration,
                pool=pool,
                name=user,
            )
        )
    return Converted(out, skipped)


# ---------------------------------------------------------------------------- Microsoft ITP

ITP_COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")


def convert_itp(path: str | Path, pool: str = DEFAULT_POOL, gpus_per_host: int = 8) -> Converted:
    """One cluster's CSV of the Microsoft ITP trace at ``path`` (``cluster04.csv``) as trace jobs
    in ``pool`` (TraceError naming the line and the column if it is not such a file)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return itp_jobs(f, pool, gpus_per_host, str(path))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text") from None


def itp_jobs(
    f: TextIO, pool: str = DEFAULT_POOL, gpus_per_host: int = 8, name: str = "trace"
) -> Converted:
    """The ITP cluster CSV read from ``f`` (called ``name`` in errors) as trace jobs, by arrival
    (ties in file order), each with its validated spec."""
    if not 1 <= gpus_per_host <= MAX_GPU:
        raise ValueError(f"gpus per host: must be in [1, {MAX_GPU}] (got {gpus_per_host})")
    reader, header = _reader(f, name, ITP_COLUMNS)
    missing = [c for c in ITP_COLUMNS if c not in header]
    if missing:
        raise TraceError(
            f"{name} line 1: missing column {missing[0]!r}; an ITP cluster CSV has "
            f"{','.join(ITP_COLUMNS)}"
        )
    skipped: dict[str, int] = {}
    rows: list[tuple[float, str, int, float, str]] = []
    seen: set[str] = set()
    for row in reader:
        where = f"{name} line {reader.line_num}"
        if None in row:
            raise TraceError(f"{where}: more fields than the header has columns")
        if not any((v or "").strip() for v in row.values()):
            continue  # a blank line
        job_id = _text(row, "job_id")
        if not job_id:
            raise TraceError(f"{where}: job_id: is required")
        if job_id in seen:
            raise TraceError(f"{where}: job_id {job_id!r} appears twice")
        seen.add(job_id)
        submitted = _number(row, "submission_time", where, positive=False)
        duration = _number(row, "duration", where, positive=False)
        gpus = _whole(row, "num_gpu", where, least=0)
        why = "no GPUs" if gpus == 0 else "ran 0 s" if duration == 0 else ""
        if why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        rows.append((submitted, job_id, gpus, duration, where))
    if not rows:
        return Converted([], skipped)
    rows.sort(key=lambda r: r[0])  # stable: ties keep the file's order
    first = rows[0][0]
    out: list[TraceJob] = []
    for submitted, job_id, gpus, duration, where in rows:
        tasks, per = _itp_gang(gpus, gpus_per_host)
        job = TraceJob(
            job_id=job_id,
            arrival_s=submitted - first,
            tasks=tasks,
            gpu_per_task=per,
            cpu_per_task=CPU_PER_GPU * per,
            mem_mb_per_task=MEM_MB_PER_GPU * per,
            duration_s=duration,
            pool=pool,
        )
        out.append(with_spec(job, f"{where} (num_gpu {gpus})"))
    return Converted(out, skipped)


def _itp_gang(gpus: int, gpus_per_host: int) -> tuple[int, int]:
    """(tasks, GPUs per task) of a job of ``gpus`` GPUs: a task per host's share when hosts of
    ``gpus_per_host`` GPUs hold it whole, else a task per GPU."""
    if gpus <= gpus_per_host:
        return 1, gpus
    if gpus % gpus_per_host == 0:
        return gpus // gpus_per_host, gpus_per_host
    return gpus, 1
