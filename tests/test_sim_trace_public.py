"""The Microsoft ITP trace reader: on a small fixture of its shape, on malformed input, and on the
copy of the public trace that bench_sim replays (bench/traces/elasticflow-raw-traces.tar.gz)."""

from __future__ import annotations

import collections
import csv
import hashlib
import io
import itertools
import tarfile
from pathlib import Path

import pytest

from peloton.sim import trace
from peloton.sim.trace import TraceError

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).with_name("test_sim_trace_itp_cluster.csv")
ARCHIVE = ROOT / "bench/traces/elasticflow-raw-traces.tar.gz"
HEADER = ",".join(trace.ITP_COLUMNS)
# Of data/raw-traces.tar.gz at github.com/microsoft/elasticflow-traces commit 277ed24.
SHA256 = "67398e1a89245c50ae0881bf997e6cda0c95f9f47980af5bc56d67998965669f"


def itp(text: str, **kwargs: int) -> trace.Converted:
    return trace.itp_jobs(io.StringIO(text), name="c.csv", **kwargs)


def cluster(name: str) -> io.StringIO:
    """One cluster's CSV out of the vendored archive."""
    with tarfile.open(ARCHIVE) as archive:
        member = archive.extractfile(name)
        assert member is not None
        return io.StringIO(member.read().decode("utf-8"), newline="")


def test_the_fixture_converts() -> None:
    converted = trace.convert_itp(FIXTURE)
    rows = [
        (j.job_id[-2:], j.arrival_s, j.tasks, j.gpu_per_task, j.duration_s) for j in converted.jobs
    ]
    assert rows == [
        ("06", 0.0, 8, 8, 7200.0),  # submitted first though written late: 64 GPUs, 8 hosts
        ("01", 110.0, 2, 8, 288476.0),
        ("02", 113.0, 1, 1, 3600.0),  # a tie: file order
        ("03", 113.0, 1, 8, 600.0),
        ("07", 1300.0, 12, 1, 900.0),  # 12 GPUs do not fill hosts of 8: a task per GPU
    ]
    assert dict(converted.skipped) == {"no GPUs": 1, "ran 0 s": 1}
    for j in converted.jobs:
        assert (j.pool, j.priority, j.name, j.preemptible, j.gpu_model) == (
            "/default", 0, "job", True, ""
        )  # fmt: skip
        assert (j.cpu_per_task, j.mem_mb_per_task) == (4 * j.gpu_per_task, 16384 * j.gpu_per_task)
        assert j.spec is not None and j.spec.instances == j.tasks
    # The converted trace is a valid trace.
    assert trace.parse_csv(io.StringIO(trace.to_csv_text(converted.jobs))) == converted.jobs


def test_pool_host_size_and_extra_columns() -> None:
    text = f"{HEADER},model_name,deadline\nx,0,60,16,bert,99\ny,5,60,3,gpt,99\n"
    converted = itp(text, gpus_per_host=4)
    assert [(j.tasks, j.gpu_per_task) for j in converted.jobs] == [(4, 4), (1, 3)]
    (job,) = trace.itp_jobs(io.StringIO(f"{HEADER}\nz,7,60,2\n"), "/research/vision").jobs
    assert job.pool == "/research/vision" and job.arrival_s == 0
    assert itp(f"{HEADER}\nz,7,60,0\n") == trace.Converted([], {"no GPUs": 1})
    with pytest.raises(ValueError, match="gpus per host"):
        itp(text, gpus_per_host=0)
    with pytest.raises(ValueError, match="gpus per host"):
        itp(text, gpus_per_host=65)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "c.csv: empty; expected a header: job_id,submission_time,duration,num_gpu"),
        ("job_id,submission_time,duration\n", "c.csv line 1: missing column 'num_gpu'"),
        (f"{HEADER}\n,0,60,1\n", "c.csv line 2: job_id: is required"),
        (f"{HEADER}\na,x,60,1\n", "c.csv line 2: submission_time: not a number: 'x'"),
        (f"{HEADER}\na,0,,1\n", "c.csv line 2: duration: is required"),
        (f"{HEADER}\na,0,-5,1\n", "c.csv line 2: duration: must be a number >= 0 (got -5)"),
        (f"{HEADER}\na,0,inf,1\n", "c.csv line 2: duration: must be a number >= 0 (got inf)"),
        (f"{HEADER}\na,0,60,1.5\n", "c.csv line 2: num_gpu: not a whole number: '1.5'"),
        (f"{HEADER}\na,0,60,-1\n", "c.csv line 2: num_gpu: must be at least 0 (got -1)"),
        (f"{HEADER}\na,0,60,1,9\n", "c.csv line 2: more fields than the header has columns"),
        (f"{HEADER}\na,0,60,1\n\na,1,60,1\n", "c.csv line 4: job_id 'a' appears twice"),
        # Past what a job spec may ask for (100,000 tasks): the line and the GPUs are named.
        (f"{HEADER}\na,0,60,1\nb,0,60,200001\n", "c.csv line 3 (num_gpu 200001): tasks: must"),
    ],
)
def test_errors_name_the_line_and_the_column(text: str, error: str) -> None:
    with pytest.raises(TraceError) as info:
        itp(text)
    assert error in str(info.value)


def test_files_that_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nope\.csv: cannot read"):
        trace.convert_itp(tmp_path / "nope.csv")
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="not UTF-8"):
        trace.convert_itp(binary)


def test_the_vendored_archive_is_the_published_one() -> None:
    """Byte for byte the file bench/traces/README.md names (its sha256), with its ten clusters."""
    assert hashlib.sha256(ARCHIVE.read_bytes()).hexdigest() == SHA256
    assert SHA256 in (ROOT / "bench/traces/README.md").read_text()
    with tarfile.open(ARCHIVE) as archive:
        names = sorted(archive.getnames())
    assert names == ["LICENSE", *(f"cluster{i:02d}.csv" for i in range(1, 11))]
    total = 0
    for name in names[1:]:
        rows = list(csv.DictReader(cluster(name)))
        assert list(rows[0]) == list(trace.ITP_COLUMNS)
        total += len(rows)
    assert total == 69_351  # as the trace's README says


def test_the_public_cluster_bench_sim_replays() -> None:
    converted = trace.itp_jobs(cluster("cluster04.csv"), name="cluster04.csv")
    jobs = converted.jobs
    assert len(jobs) == 15_802 and not converted.skipped
    assert len({j.job_id for j in jobs}) == len(jobs)
    # Mostly one GPU, a long tail of multi-host gangs up to 64 GPUs.
    sizes = collections.Counter(j.gpus for j in jobs)
    assert sizes == {1: 11_924, 2: 125, 4: 532, 8: 2_779, 16: 182, 32: 254, 64: 6}
    assert all(
        j.gpu_per_task == min(j.gpus, 8) and j.tasks * j.gpu_per_task == j.gpus for j in jobs
    )
    assert jobs[0].arrival_s == 0
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(jobs))
    assert jobs[-1].arrival_s / 86_400 == pytest.approx(59.45, abs=0.01)
    # Jobs under 10 minutes are not in the trace; the longest ran over 14 days.
    durations = sorted(j.duration_s for j in jobs)
    assert durations[0] >= 600 and durations[-1] > 14 * 86_400
    assert 2 * 3600 < durations[len(durations) // 2] < 3 * 3600
    # What bench_sim's cluster size rests on: 495 GPUs asked for on average over the span.
    gpu_seconds = sum(j.gpus * j.duration_s for j in jobs)
    assert gpu_seconds / jobs[-1].arrival_s == pytest.approx(495, abs=1)
