"""``peloton simulate`` as a user runs it (a subprocess): the table, JSON, plots, traces made and
converted, and one ``error:`` line with exit code 2 for bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PELOTON = str(Path(sys.executable).parent / "peloton")
ROOT = Path(__file__).resolve().parents[1]
PHILLY = Path(__file__).with_name("test_sim_philly_cluster_job_log.json")
ITP = Path(__file__).with_name("test_sim_trace_itp_cluster.csv")
TRACE = """\
job_id,arrival_s,tasks,gpu_per_task,cpu_per_task,mem_mb_per_task,duration_s
A,0,1,4,16,65536,100
B,10,2,4,16,65536,50
C,20,1,2,8,32768,30
"""


def peloton(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PELOTON, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(TRACE)
    return path


def test_run_compares_policies_in_one_table_and_writes_json(
    trace_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    result = peloton(
        "simulate",
        "run",
        "--trace",
        str(trace_file),
        "--hosts",
        "2",
        "--gpus-per-host",
        "4",
        "--racks",
        "1",
        "--policy",
        "priority_fifo",
        "--policy",
        "baseline-backfill",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"Trace:   {trace_file} (3 jobs)"
    assert lines[1] == "Cluster: 2 hosts, 8 GPUs (A100), 1 rack"
    header = next(line for line in lines if "PRIORITY_FIFO" in line)
    assert "baseline-backfill (baseline)" in header
    row = {line.split("  ")[0].strip(): line for line in lines}
    assert "3 / 3" in row["jobs completed"]
    # JCTs of the hand-worked example: (100 + 140 + 160) / 3 and (100 + 140 + 30) / 3.
    assert "2.2 min" in row["JCT mean"] and "1.5 min" in row["JCT mean"]
    assert "simulator-only reference" in result.stdout
    assert f"wrote {out}" in result.stdout
    document = json.loads(out.read_text())
    assert document["jobs"] == 3
    runs = {r["policy"]: r for r in document["runs"]}
    assert set(runs) == {"PRIORITY_FIFO", "baseline-backfill"}
    assert runs["PRIORITY_FIFO"]["jct_s"]["mean"] == pytest.approx(400 / 3)
    assert runs["baseline-backfill"]["jct_s"]["mean"] == pytest.approx(270 / 3)
    assert runs["baseline-backfill"]["baseline"] is True
    assert runs["PRIORITY_FIFO"]["series"]["gpu_utilization"]


def test_output_json_prints_the_document(trace_file: Path) -> None:
    result = peloton(
        "simulate", "run", "--trace", str(trace_file), "--hosts", "2", "--gpus-per-host", "4",
        "-o", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [r["policy"] for r in document["runs"]] == ["PRIORITY_FIFO"]
    assert document["runs"][0]["completed"] == 3


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plots_are_written(trace_file: Path, tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    result = peloton(
        "simulate", "run", "--trace", str(trace_file), "--hosts", "2", "--gpus-per-host", "4",
        "--policy", "FIFO", "--policy", "baseline-backfill", "--plots", str(plots),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in plots.iterdir())
    assert names == [
        "jct_by_size.png",
        "jct_cdf.png",
        "queue.png",
        "utilization.png",
        "wait_cdf.png",
    ]
    for p in plots.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_cluster_can_come_from_a_minicluster_agents_file(trace_file: Path) -> None:
    agents = ROOT / "examples" / "minicluster-examples.yaml"
    result = peloton("simulate", "run", "--trace", str(trace_file), "--cluster", str(agents))
    assert result.returncode == 0, result.stderr
    assert "Cluster: 5 hosts, 20 GPUs (A100, V100), 3 racks" in result.stdout


def test_pools_come_from_pool_files(tmp_path: Path) -> None:
    trace_file = tmp_path / "t.csv"
    trace_file.write_text(
        "job_id,arrival_s,pool,tasks,gpu_per_task,cpu_per_task,mem_mb_per_task,duration_s\n"
        "a,0,/research/vision,1,2,8,32768,60\n"
        "b,0,/llm,1,4,16,65536,60\n"
    )
    result = peloton(
        "simulate", "run", "--trace", str(trace_file), "--pools", str(ROOT / "examples/pools"),
        "--policy", "PRIORITY_FIFO", "--policy", "FIFO",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Pools:   /llm, /research/nlp, /research, /research/vision" in result.stdout
    assert "GPU share /research/vision (got of entitled)" in result.stdout


def test_generate_then_run(tmp_path: Path) -> None:
    out = tmp_path / "gen.csv"
    result = peloton(
        "simulate", "generate", "--jobs", "40", "--gpus", "64", "--load", "0.7", "--seed", "5",
        "-o", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote 40 jobs to {out} (arrivals over ")
    again = peloton("simulate", "generate", "--jobs", "40", "--gpus", "64", "--seed", "5")
    assert again.returncode == 0
    assert again.stdout.splitlines()[0].startswith("job_id,arrival_s,pool,")
    run = peloton(
        "simulate", "run", "--trace", str(out), "--hosts", "8", "--policy", "backfill",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "BACKFILL" in run.stdout


def test_convert_philly(tmp_path: Path) -> None:
    out = tmp_path / "philly.csv"
    result = peloton("simulate", "convert", "--philly", str(PHILLY), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"converted 4 jobs; skipped 2 never ran, 1 no GPUs; wrote {out}"
    )
    assert len(out.read_text().splitlines()) == 5
    to_stdout = peloton("simulate", "convert", "--philly", str(PHILLY), "--pool", "/philly")
    assert to_stdout.returncode == 0
    assert to_stdout.stdout.count(",/philly,") == 4
    assert to_stdout.stderr.startswith("converted 4 jobs")


def test_convert_itp(tmp_path: Path) -> None:
    out = tmp_path / "itp.csv"
    result = peloton("simulate", "convert", "--itp", str(ITP), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (f"converted 5 jobs; skipped 1 no GPUs, 1 ran 0 s; wrote {out}")
    lines = out.read_text().splitlines()
    assert lines[0].startswith("job_id,arrival_s,pool,") and len(lines) == 6
    to_stdout = peloton(
        "simulate", "convert", "--itp", str(ITP), "--pool", "/itp", "--gpus-per-host", "4"
    )  # fmt: skip
    assert to_stdout.returncode == 0, to_stdout.stderr
    assert to_stdout.stdout.count(",/itp,") == 5
    # 64 GPUs on hosts of 4: 16 tasks of 4 GPUs (16 cpus, 64 GiB each).
    assert ",/itp,0,16,4,16,65536,7200," in to_stdout.stdout
    assert to_stdout.stderr.startswith("converted 5 jobs")
    run = peloton("simulate", "run", "--trace", str(out), "--hosts", "8", "--policy", "las")
    assert run.returncode == 0, run.stderr
    assert "(5 jobs)" in run.stdout


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ([], "error: give one trace: --philly FILE or --itp FILE"),
        (["--philly", "{philly}", "--itp", "{itp}"], "error: --philly and --itp exclude each"),
        (["--philly", "{philly}", "--gpus-per-host", "4"], "error: --gpus-per-host applies to"),
        (["--itp", "{itp}", "--gpus-per-host", "0"], "error: invalid value for '--gpus-per-host'"),
        (["--itp", "{missing}"], "error: invalid: {missing}: cannot read"),
        (["--itp", "{philly}"], "error: invalid: {philly} line 1: missing column 'job_id'"),
        (["--itp", "{empty}"], "error: invalid: {empty}: no job that ran"),
        (["--itp", "{itp}", "--pool", "itp"], "error: invalid value for '--pool'"),
    ],
)
def test_convert_bad_input_is_one_error_line_and_exit_2(
    tmp_path: Path, args: list[str], error: str
) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("job_id,submission_time,duration,num_gpu\nx,0,60,0\n")
    names = {
        "philly": str(PHILLY),
        "itp": str(ITP),
        "missing": str(tmp_path / "missing.csv"),
        "empty": str(empty),
    }
    result = peloton("simulate", "convert", *(a.format(**names) for a in args))
    assert result.returncode == 2, result.stderr
    assert error.format(**names) in error_line(result)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--trace", "{missing}"], "error: invalid: {missing}: cannot read"),
        (["--trace", "{trace}", "--policy", "lottery"], "error: invalid value for '--policy'"),
        (["--trace", "{trace}", "--cluster", "{trace}", "--hosts", "3"], "exclude each other"),
        (["--trace", "{trace}", "--cluster", "{missing}"], "error: invalid: {missing}: cannot"),
        (["--trace", "{trace}", "--pools", "{pools}"], "error: invalid: job A: pool /default"),
        (["--trace", "{bad}"], "error: invalid: {bad} line 2: tasks: must be at least 1"),
        (["--trace", "{trace}", "--hosts", "0"], "error: invalid value for '--hosts'"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(
    trace_file: Path, tmp_path: Path, args: list[str], error: str
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,arrival_s,tasks,gpu_per_task,cpu_per_task,mem_mb_per_task,duration_s\n"
                   "x,0,0,1,4,1024,5\n")  # fmt: skip
    names = {
        "trace": str(trace_file),
        "missing": str(tmp_path / "missing.csv"),
        "pools": str(ROOT / "examples/pools"),
        "bad": str(bad),
    }
    result = peloton("simulate", "run", *(a.format(**names) for a in args))
    assert result.returncode == 2, result.stderr
    assert error.format(**names) in error_line(result)


def test_help_lists_the_policies() -> None:
    result = peloton("simulate", "run", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "PRIORITY_FIFO, FIFO" in text
    assert "baseline-backfill" in text
    assert "starves" in text


def test_the_readme_simulation_runs_as_written(tmp_path: Path) -> None:
    """README's "Simulating queue policies" block, typed into bash in an empty directory."""
    pytest.importorskip("matplotlib")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("\n## Simulating queue policies\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    done = subprocess.run(
        ["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "baseline-backfill (baseline)" in done.stdout, done.stdout
    data = json.loads((tmp_path / "sim.json").read_text())
    runs = data["runs"] if isinstance(data, dict) and "runs" in data else data
    assert [r["policy"] for r in runs] == ["PRIORITY_FIFO", "BACKFILL", "LAS", "baseline-backfill"]
    assert sorted(p.suffix for p in (tmp_path / "sim-plots").iterdir()) and all(
        p.suffix == ".png" for p in (tmp_path / "sim-plots").iterdir()
    )


def test_the_readme_public_trace_runs_as_written(tmp_path: Path) -> None:
    """README's second block (converting the vendored ITP trace), typed into bash where
    ``bench/traces`` is what it is at the repository root."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Simulating queue policies\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n")[2].split("```", 1)[0]
    assert "--itp" in block
    (tmp_path / "bench").symlink_to(ROOT / "bench")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    done = subprocess.run(
        ["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "converted 15802 jobs; wrote itp.csv" in done.stdout
    assert len((tmp_path / "itp.csv").read_text().splitlines()) == 15_803
    assert "Trace:   itp-2k.csv (2000 jobs)" in done.stdout
    assert "Cluster: 72 hosts, 576 GPUs (A100), 8 racks" in done.stdout
    assert "baseline-backfill (baseline)" in done.stdout
