"""``peloton simulate ...``: replay a trace through the scheduler on a virtual clock, make
synthetic traces, convert public ones (the simulator itself: :mod:`peloton.sim`).

Needs no server, database or cluster: everything runs in this process.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from peloton.cli import output as out
from peloton.cli.common import EXIT_USAGE, CliError, cli_error, read_text_file
from peloton.core.pools import PoolConfig, QueuePolicy
from peloton.core.spec import DEFAULT_POOL, check_pool_path, load_pool_spec_yaml
from peloton.errors import InvalidArgument
from peloton.sim.policy import parse_policy, policies

if TYPE_CHECKING:
    from peloton.sim.cluster import Cluster
    from peloton.sim.trace import TraceJob

# The simulator (the resource manager, placement, the API's pool conversion) is imported by
# the commands that use it, so that every other command starts as fast as before.
_POLICIES = policies()


@click.group()
def simulate() -> None:
    """Replay a job trace through peloton's scheduler on a virtual clock (no server needed).

    The same resource manager (pools, entitlements, admission, preemption) and placement
    engine as the daemon run on simulated hosts, in one process; a run of 10,000 jobs on 512
    GPUs takes a minute or two on two cores (a few seconds per thousand jobs).

    \b
    Examples:
      peloton simulate generate --jobs 10000 --gpus 512 --load 0.9 --seed 1 -o trace.csv
      peloton simulate run --trace trace.csv --hosts 64 --gpus-per-host 8 --racks 8 \\
          --policy PRIORITY_FIFO --policy baseline-backfill --json out.json --plots plots/
      peloton simulate convert --philly trace-data/cluster_job_log -o philly.csv
      peloton simulate convert --itp cluster04.csv -o itp.csv
    """


# ---------------------------------------------------------------------------- run


def _policy(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> list[str]:
    chosen = []
    for value in values or (QueuePolicy.PRIORITY_FIFO.value,):
        try:
            chosen.append(parse_policy(value))
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return list(dict.fromkeys(chosen))


@simulate.command()
@click.option(
    "--trace",
    "trace_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The trace: a CSV of jobs (see `peloton simulate run --help`).",
)
@click.option(
    "--cluster",
    "agents_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The hosts: a minicluster agents file (YAML, as `peloton minicluster up "
    "--agents-file`); replaces --hosts, --gpus-per-host, --racks and --gpu-models.",
)
@click.option("--hosts", default=64, show_default=True, type=click.IntRange(1), help="Hosts.")
@click.option(
    "--gpus-per-host", default=8, show_default=True, type=click.IntRange(0), help="GPUs per host."
)
@click.option(
    "--racks", default=8, show_default=True, type=click.IntRange(1), help="Racks (hosts split)."
)
@click.option(
    "--gpu-models",
    default="A100",
    show_default=True,
    help="Comma-separated GPU models; hosts are split between them in blocks.",
)
@click.option(
    "--pools",
    "pools_path",
    type=click.Path(exists=True, path_type=Path),
    help="A pool file or a directory of them (*.yaml, as `peloton pool create`); default: the "
    "single pool /default.",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    callback=_policy,
    help=f"Queue policy of every pool, or the baseline: {', '.join(_POLICIES)} (any case; "
    "repeat to compare runs side by side; default PRIORITY_FIFO).",
)
@click.option(
    "--json",
    "json_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write every figure (and utilization and queue series) to this JSON file.",
)
@click.option(
    "--plots",
    "plots_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write PNG plots here: JCT and wait CDFs, utilization and queue over time, JCT by "
    "gang size (needs matplotlib).",
)
@out.output_option
@click.pass_context
def run(
    ctx: click.Context,
    trace_file: Path,
    agents_file: Path | None,
    hosts: int,
    gpus_per_host: int,
    racks: int,
    gpu_models: str,
    pools_path: Path | None,
    policies: list[str],
    json_file: Path | None,
    plots_dir: Path | None,
    fmt: str,
) -> None:
    """Replay a trace under one or more policies and compare JCT, waits and utilization.

    \b
    The trace is a CSV with a header:
      job_id,arrival_s,pool,priority,tasks,gpu_per_task,cpu_per_task,mem_mb_per_task,
      duration_s,gpu_model,preemptible
    pool (default /default), priority (0), gpu_model (empty: any), preemptible (0/1, default
    1), name (default job) and max_runtime_s (none) may be left out. A job's tasks start
    together (a gang) and run duration_s; BACKFILL and LAS expect a job to run its
    max_runtime_s, else what jobs of its name in its pool took.

    \b
    Policies: the queue policies of peloton's resource manager (every pool gets it), and
    baseline-backfill, a simulator-only baseline that is not peloton: it starts any waiting
    gang that fits now, in queue order, with no reservation for big gangs (which it starves),
    no pools and no preemption. A preempted job restarts from scratch.
    """
    from peloton.sim import report, simulator, trace
    from peloton.sim.plots import PlotsUnavailable, write_plots

    explicit = [
        name
        for name in ("hosts", "gpus_per_host", "racks", "gpu_models")
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    ]
    if agents_file is not None and explicit:
        flag = "--" + explicit[0].replace("_", "-")
        raise CliError(f"--cluster and {flag} exclude each other", EXIT_USAGE)
    try:
        jobs = trace.read_csv(trace_file)
    except trace.TraceError as exc:
        raise CliError(f"invalid: {exc}", EXIT_USAGE) from None
    cluster = _cluster(agents_file, hosts, gpus_per_host, racks, gpu_models)
    pools = _pools(pools_path) if pools_path is not None else []
    if plots_dir is not None:
        try:
            import matplotlib  # noqa: F401  (fail before the runs, not after)
        except ImportError:
            raise CliError(
                "--plots needs matplotlib, which is not installed: pip install 'matplotlib>=3.8,<4'"
            ) from None
    results = []
    for policy in policies:
        _progress(f"simulating {len(jobs)} jobs on {cluster.describe()} under {policy} ...")
        try:
            results.append(simulator.simulate(jobs, cluster, pools, policy, clock=time.monotonic))
        except (simulator.SimulationError, InvalidArgument) as exc:
            raise CliError(f"invalid: {exc}", EXIT_USAGE) from None
    summaries = [report.summarize(r) for r in results]
    pool_paths = [p.path for p in pools] or [DEFAULT_POOL]
    document = {
        "trace": str(trace_file),
        "jobs": len(jobs),
        "cluster": cluster.describe(),
        "pools": pool_paths,
        "runs": summaries,
    }
    if json_file is not None:
        _write(json_file, json.dumps(document, indent=2) + "\n")
    written: list[Path] = []
    if plots_dir is not None:
        try:
            written = write_plots(results, plots_dir)
        except PlotsUnavailable as exc:
            raise CliError(str(exc)) from None
        except OSError as exc:
            raise CliError(f"cannot write plots to {plots_dir}: {exc.strerror}") from None
    if fmt != "table":
        out.emit_data(document, fmt)
        return
    click.echo(f"Trace:   {trace_file} ({len(jobs)} jobs)")
    click.echo(f"Cluster: {cluster.describe()}")
    click.echo(f"Pools:   {', '.join(pool_paths)}")
    columns, rows = report.table_rows(summaries)
    out.console().print(out.table(columns, rows))
    if any(s["baseline"] for s in summaries):
        click.echo(
            "baseline-backfill is a simulator-only reference, not peloton's scheduler: "
            "no reservations (it starves big gangs), no pools, no preemption."
        )
    if json_file is not None:
        click.echo(f"wrote {json_file}")
    for path in written:
        click.echo(f"wrote {path}")


def _progress(line: str) -> None:
    if sys.stderr.isatty():
        click.echo(line, err=True)


def _cluster(
    agents_file: Path | None, hosts: int, gpus_per_host: int, racks: int, gpu_models: str
) -> Cluster:
    from peloton.sim import cluster as clusters

    try:
        if agents_file is not None:
            return clusters.load_agents_file(agents_file)
        models = [m.strip() for m in gpu_models.split(",") if m.strip()]
        return clusters.generate_hosts(hosts, gpus_per_host, racks, models)
    except ValueError as exc:
        raise CliError(f"invalid: {exc}", EXIT_USAGE) from None


def _pools(path: Path) -> list[PoolConfig]:
    """Pool configs from a pool file or a directory of *.yaml / *.yml files."""
    from peloton.api.pool_service import config_from_pb
    from peloton.sim.simulator import build_tree

    files = (
        sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        if path.is_dir()
        else [path]
    )
    if not files:
        raise CliError(f"invalid: {path}: no pool files (*.yaml) in it", EXIT_USAGE)
    configs = []
    for f in files:
        text = read_text_file(f)
        try:
            configs.append(config_from_pb(load_pool_spec_yaml(text)))
        except Exception as exc:
            err = cli_error(exc)
            raise CliError(f"{f}: {err.message}", err.code) from None
    try:
        build_tree(configs)
    except InvalidArgument as exc:
        raise CliError(f"invalid: {path}: {exc}", EXIT_USAGE) from None
    return configs


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror}") from None


# ---------------------------------------------------------------------------- traces


def _out_option(f: Any) -> Any:
    return click.option(
        "--out",
        "-o",
        "out_file",
        default="-",
        show_default=True,
        type=click.Path(dir_okay=False, path_type=Path, allow_dash=True),
        help="Where to write the trace CSV (- is standard output).",
    )(f)


def _emit_trace(jobs: Sequence[TraceJob], out_file: Path) -> None:
    from peloton.sim import trace

    if str(out_file) == "-":
        trace.write_csv(jobs, sys.stdout)
        return
    try:
        with open(out_file, "w", newline="", encoding="utf-8") as f:
            trace.write_csv(jobs, f)
    except OSError as exc:
        raise CliError(f"cannot write {out_file}: {exc.strerror}") from None


def _check_pools(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> Any:
    for value in values:
        try:
            check_pool_path(value, "--pool")
        except InvalidArgument as exc:
            raise click.BadParameter(exc.reason) from None
    return values


@simulate.command()
@click.option("--jobs", required=True, type=click.IntRange(1), help="How many jobs.")
@click.option(
    "--gpus",
    required=True,
    type=click.IntRange(1),
    help="GPUs of the cluster the load is computed for.",
)
@click.option(
    "--load",
    default=0.9,
    show_default=True,
    type=click.FloatRange(0, 10, min_open=True),
    help="Offered load: GPU-seconds asked per second / GPUs.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Random seed.")
@click.option(
    "--gpus-per-host",
    default=8,
    show_default=True,
    type=click.IntRange(1),
    help="Jobs bigger than this are split into tasks of this many GPUs.",
)
@click.option(
    "--shape",
    type=click.Choice(["host", "gpu"]),
    default="host",
    show_default=True,
    help="host: a task per host's share (Philly's jobs); gpu: a task per GPU.",
)
@click.option(
    "--pool",
    "pools",
    multiple=True,
    callback=_check_pools,
    help="Leaf pool of the jobs (repeat: each job draws one); default /default.",
)
@click.option(
    "--high-priority",
    default=0.1,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Fraction of jobs of priority 1 (the rest 0).",
)
@_out_option
def generate(
    jobs: int,
    gpus: int,
    load: float,
    seed: int,
    gpus_per_host: int,
    shape: str,
    pools: tuple[str, ...],
    high_priority: float,
    out_file: Path,
) -> None:
    """Write a synthetic Philly-like trace.

    \b
    GPUs per job: 1 (60 %), 2 (12 %), 4 (12 %), 8 (9 %), 16 (4 %), 32 (2 %), 64 (1 %).
    Durations: log-normal, median 30 min, sigma 1.5, within [1 min, 7 days].
    Arrivals: Poisson, at the rate that offers --load of --gpus GPUs.
    Each task asks for 4 cpus and 16 GiB per GPU; every job is preemptible.
    """
    from peloton.sim import trace
    from peloton.sim.report import duration

    made = trace.generate(
        jobs,
        gpus,
        load,
        seed,
        gpus_per_host=gpus_per_host,
        shape=shape,
        pools=pools or (DEFAULT_POOL,),
        high_priority=high_priority,
    )
    _emit_trace(made, out_file)
    if str(out_file) != "-":
        span = made[-1].arrival_s if made else 0.0
        click.echo(f"wrote {len(made)} jobs to {out_file} (arrivals over {duration(span)})")


@simulate.command()
@click.option(
    "--philly",
    "philly_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Philly's cluster_job_log (JSON), from github.com/msr-fiddle/philly-traces.",
)
@click.option(
    "--itp",
    "itp_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="One cluster's CSV of the Microsoft ITP trace (cluster04.csv), from "
    "github.com/microsoft/elasticflow-traces or bench/traces/elasticflow-raw-traces.tar.gz.",
)
@click.option(
    "--gpus-per-host",
    default=8,
    show_default=True,
    type=click.IntRange(1, 64),
    help="--itp: jobs bigger than this are split into tasks of this many GPUs.",
)
@click.option(
    "--pool",
    default=DEFAULT_POOL,
    show_default=True,
    callback=lambda ctx, param, value: _check_pools(ctx, param, (value,))[0],
    help="Leaf pool of every job.",
)
@_out_option
@click.pass_context
def convert(
    ctx: click.Context,
    philly_file: Path | None,
    itp_file: Path | None,
    gpus_per_host: int,
    pool: str,
    out_file: Path,
) -> None:
    """Convert a public trace (Microsoft Philly or ITP) to a simulator trace CSV.

    \b
    Philly (--philly): git clone https://github.com/msr-fiddle/philly-traces;
    cd philly-traces; tar xzf trace-data.tar.gz  ->  trace-data/cluster_job_log (about
    100,000 jobs). Arrival: submitted_time; GPUs: the last attempt's machines (a task per
    machine when they had as many GPUs each, else a task per GPU); duration: the last
    attempt's end - start. Jobs that never ran are skipped (counted on standard error).

    \b
    ITP (--itp): tar xzf bench/traces/elasticflow-raw-traces.tar.gz cluster04.csv (a copy of
    data/raw-traces.tar.gz of github.com/microsoft/elasticflow-traces: cluster01.csv ...
    cluster10.csv, 69,351 jobs). Columns job_id,submission_time,duration,num_gpu. Arrival:
    submission_time; duration: duration; GPUs: num_gpu, one task when they fit a host
    (--gpus-per-host), else a task per host's share (per GPU if that does not divide them).
    Every job is named "job", priority 0. Jobs of 0 GPUs or 0 s are skipped.
    """
    from peloton.sim import trace

    if philly_file is not None and itp_file is not None:
        raise CliError("--philly and --itp exclude each other", EXIT_USAGE)
    if (
        philly_file is not None
        and ctx.get_parameter_source("gpus_per_host") is ParameterSource.COMMANDLINE
    ):
        # Philly's log names the machines each job ran on: its shape is not guessed.
        raise CliError("--gpus-per-host applies to --itp only", EXIT_USAGE)
    try:
        if philly_file is not None:
            source, converted = philly_file, trace.convert_philly(philly_file, pool)
        elif itp_file is not None:
            source, converted = itp_file, trace.convert_itp(itp_file, pool, gpus_per_host)
        else:
            raise CliError("give one trace: --philly FILE or --itp FILE", EXIT_USAGE)
    except trace.TraceError as exc:
        raise CliError(f"invalid: {exc}", EXIT_USAGE) from None
    if not converted.jobs:
        raise CliError(f"invalid: {source}: no job that ran", EXIT_USAGE)
    _emit_trace(converted.jobs, out_file)
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(converted.skipped.items()))
    line = f"converted {len(converted.jobs)} jobs" + (f"; skipped {skipped}" if skipped else "")
    if str(out_file) != "-":
        line += f"; wrote {out_file}"
    click.echo(line, err=str(out_file) == "-")
