"""Traces: the CSV format and its errors, the synthetic generator's distributions and load, and
the Philly converter on a fixture in the shape of Philly's cluster_job_log."""

from __future__ import annotations

import io
import itertools
import math
from pathlib import Path

import pytest

from peloton.sim import trace
from peloton.sim.trace import TraceError, TraceJob

PHILLY = Path(__file__).with_name("test_sim_philly_cluster_job_log.json")
HEADER = "job_id,arrival_s,tasks,gpu_per_task,cpu_per_task,mem_mb_per_task,duration_s"


def parse(text: str) -> list[TraceJob]:
    return trace.parse_csv(io.StringIO(text), "t.csv")


def test_a_minimal_trace_takes_the_documented_defaults() -> None:
    jobs = parse(f"{HEADER}\nb,5,1,1,4,1024,60\n\na,0,2,4,16,65536,3600\n")
    assert [j.job_id for j in jobs] == ["a", "b"]  # by arrival
    a = jobs[0]
    assert (a.pool, a.priority, a.gpu_model, a.preemptible) == ("/default", 0, "", True)
    assert (a.name, a.max_runtime_s, a.gpus) == ("job", 0, 8)
    assert a.spec is not None
    assert a.spec.instances == 2 and a.spec.gang.min_instances == 2  # one gang
    assert a.spec.task.resources.gpu == 4
    assert a.spec.preemption.preemptible


def test_every_column_reaches_the_spec() -> None:
    text = ",".join(trace.COLUMNS) + "\nx,1.5,/research/vision,7,1,2,8,32768,99,V100,0,resnet,600\n"
    (job,) = parse(text)
    assert job == TraceJob(
        "x", 1.5, 1, 2, 8, 32768, 99, "/research/vision", 7, "V100", False, "resnet", 600
    )
    spec = job.spec
    assert spec is not None
    assert (spec.pool, spec.priority, spec.name, spec.max_runtime_seconds) == (
        "/research/vision",
        7,
        "resnet",
        600,
    )
    assert [(c.attribute, c.op, list(c.values)) for c in spec.task.constraints] == [
        ("gpu_model", "eq", ["V100"])
    ]
    assert not spec.preemption.preemptible


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "t.csv: empty"),
        ("job_id,arrival\n", "t.csv line 1: unknown column 'arrival'"),
        ("job_id,arrival_s\n", "t.csv line 1: missing column 'tasks'"),
        (f"{HEADER}\n", "t.csv: no jobs"),
        (f"{HEADER}\na,0,1,1,4,1024\n", "t.csv line 2: duration_s: is required"),
        (f"{HEADER}\na,x,1,1,4,1024,5\n", "t.csv line 2: arrival_s: not a number: 'x'"),
        (f"{HEADER}\na,-1,1,1,4,1024,5\n", "arrival_s: must be a number >= 0 (got -1)"),
        (f"{HEADER}\na,0,0,1,4,1024,5\n", "t.csv line 2: tasks: must be at least 1 (got 0)"),
        (f"{HEADER}\na,0,1,1.5,4,1024,5\n", "gpu_per_task: not a whole number: '1.5'"),
        (f"{HEADER}\na,0,1,1,4,1024,0\n", "duration_s: must be a number > 0 (got 0)"),
        (f"{HEADER}\na,0,1,65,4,1024,5\n", "t.csv line 2: gpu_per_task: must be at most 64"),
        (f"{HEADER}\na,0,1,1,4,1024,5,9\n", "t.csv line 2: more fields than the header has"),
        (f"{HEADER}\na,0,1,1,4,1024,5\nb,0,1,1,4,1024,5\na,1,1,1,4,1024,5\n", "line 4: job_id"),
        (f"{HEADER},pool\na,0,1,1,4,1024,5,research\n", "line 2: pool: 'research' must be"),
        (f"{HEADER},preemptible\na,0,1,1,4,1024,5,yes\n", "preemptible: must be 0 or 1"),
        (f"{HEADER},name\na,0,1,1,4,1024,5,bad name\n", "line 2: name: may hold only"),
    ],
)
def test_errors_name_the_line_and_the_column(text: str, error: str) -> None:
    with pytest.raises(TraceError) as info:
        parse(text)
    assert error in str(info.value)


def test_read_csv_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nope\.csv: cannot read"):
        trace.read_csv(tmp_path / "nope.csv")
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="not UTF-8"):
        trace.read_csv(binary)


def test_written_traces_read_back_the_same() -> None:
    jobs = trace.generate(200, 64, 0.8, seed=7)
    text = trace.to_csv_text(jobs)
    assert text.splitlines()[0] == ",".join(trace.COLUMNS)
    assert parse(text) == jobs


def test_the_generator_is_deterministic_and_offers_the_load_asked() -> None:
    jobs = trace.generate(4000, 512, 0.9, seed=1)
    assert jobs == trace.generate(4000, 512, 0.9, seed=1)
    assert jobs != trace.generate(4000, 512, 0.9, seed=2)
    gpu_seconds = sum(j.gpus * j.duration_s for j in jobs)
    span = jobs[-1].arrival_s - jobs[0].arrival_s
    # Poisson arrivals at the rate load x GPUs / mean GPU-seconds: the offered load over the
    # arrival span is the target, give or take the randomness of 4,000 gaps.
    assert gpu_seconds / (span * 512) == pytest.approx(0.9, rel=0.06)
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(jobs))


def test_the_generator_draws_philly_like_jobs() -> None:
    jobs = trace.generate(6000, 512, 0.9, seed=3)
    gpus = [j.gpus for j in jobs]
    for size, p in trace.GANG_GPUS:
        assert gpus.count(size) / len(jobs) == pytest.approx(p, abs=0.02), size
    # One task per host's share: whole hosts of 8 for big jobs.
    for j in jobs:
        assert j.gpu_per_task == min(j.gpus, 8)
        assert j.tasks * j.gpu_per_task == j.gpus
        assert j.cpu_per_task == 4 * j.gpu_per_task
        assert j.mem_mb_per_task == 16384 * j.gpu_per_task
        assert trace.MIN_DURATION_S <= j.duration_s <= trace.MAX_DURATION_S
        assert j.name.startswith("model-")
    durations = sorted(j.duration_s for j in jobs)
    median = durations[len(durations) // 2]
    assert 0.5 * trace.MEDIAN_DURATION_S < median < 2 * trace.MEDIAN_DURATION_S
    # Heavy-tailed: the mean is well above the median.
    assert sum(durations) / len(durations) > 2 * median
    high = sum(1 for j in jobs if j.priority == 1) / len(jobs)
    assert high == pytest.approx(0.1, abs=0.02)


def test_the_generator_shapes_and_pools() -> None:
    jobs = trace.generate(300, 64, 0.5, seed=4, shape="gpu", pools=("/a", "/b"))
    assert all(j.gpu_per_task == 1 and j.tasks == j.gpus for j in jobs)
    assert {j.pool for j in jobs} == {"/a", "/b"}
    with pytest.raises(ValueError, match="load"):
        trace.generate(10, 64, 0)
    with pytest.raises(ValueError, match="shape"):
        trace.generate(10, 64, 0.5, shape="rack")


def test_the_philly_fixture_converts() -> None:
    converted = trace.convert_philly(PHILLY)
    rows = [
        (j.job_id[-5:], j.arrival_s, j.tasks, j.gpu_per_task, j.duration_s, j.name)
        for j in converted.jobs
    ]
    assert rows == [
        ("10500", 0.0, 1, 2, 300.0, "g7h8i9"),  # submitted first
        ("10238", 60.0, 1, 1, 3600.0, "a1b2c3"),
        # Two machines of 8 GPUs in its last attempt; duration of that attempt only.
        ("10301", 360.0, 2, 8, 7200.0, "d4e5f6"),
        # Machines of 3 and 5 GPUs: a task per GPU.
        ("10412", 2160.0, 8, 1, 100.0, "a1b2c3"),
    ]
    assert dict(converted.skipped) == {"never ran": 2, "no GPUs": 1}
    assert all(j.pool == "/default" and j.preemptible for j in converted.jobs)
    # The converted trace is a valid trace.
    assert parse(trace.to_csv_text(converted.jobs)) == converted.jobs


def test_philly_errors(tmp_path: Path) -> None:
    bad = tmp_path / "log"
    bad.write_text("{not json")
    with pytest.raises(TraceError, match="not a JSON cluster_job_log"):
        trace.convert_philly(bad)
    bad.write_text('{"jobs": []}')
    with pytest.raises(TraceError, match="expected a JSON list"):
        trace.convert_philly(bad)
    with pytest.raises(TraceError, match="cannot read"):
        trace.convert_philly(tmp_path / "missing")
    assert trace.philly_jobs([]).jobs == []
    assert math.isfinite(trace.MEDIAN_DURATION_S)
