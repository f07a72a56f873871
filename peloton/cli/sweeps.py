"""``peloton sweep``: submit hyperparameter sweeps, follow their trials, kill them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from peloton.cli import output as out
from peloton.cli.common import cli_error, connect, read_text_file
from peloton.sweep.spec import plan
from peloton.sweep.yamlspec import load_sweep_spec_yaml
from peloton.v1 import sweep_pb2


def sweep_state(value: int) -> str:
    return sweep_pb2.SweepState.Name(value).removeprefix("SWEEP_STATE_")  # type: ignore[arg-type]


def trial_state(value: int) -> str:
    return sweep_pb2.TrialState.Name(value).removeprefix("TRIAL_STATE_")  # type: ignore[arg-type]


def _best(message: Any) -> str:
    return f"{message.best:.6g}" if message.HasField("best") else "-"


def _counts(s: sweep_pb2.Sweep) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(s.trials.items())) or "none yet"


@click.group()
def sweep() -> None:
    """Hyperparameter sweeps: trials of a job over a search space, weak ones stopped early,
    their GPUs given to the best (README "Sweeps").

    \b
    Examples:
      peloton sweep submit examples/sweep/lr-sweep.yaml
      peloton sweep trials SWEEP_ID
      peloton sweep get SWEEP_ID -o json
    """


@sweep.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path, allow_dash=True))
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="Print only the sweep's id (S=$(peloton sweep submit -q F)).",
)
@out.output_option
@click.pass_context
def submit(ctx: click.Context, file: Path, quiet: bool, fmt: str) -> None:
    """Submit the sweep described in FILE (YAML; - reads standard input)."""
    text = read_text_file(file)
    try:
        spec = load_sweep_spec_yaml(text)
        plan(spec)  # the server checks the same; a typo is told before connecting
    except Exception as exc:
        raise cli_error(exc) from None
    with connect(ctx) as client:
        s = client.submit_sweep(spec)
    if quiet:
        click.echo(s.sweep_id)
    elif fmt == "table":
        click.echo(f"sweep {s.sweep_id} submitted")
    else:
        out.emit_data(out.to_dict(s), fmt)


@sweep.command()
@click.argument("sweep_id")
@out.output_option
@click.pass_context
def get(ctx: click.Context, sweep_id: str, fmt: str) -> None:
    """Show one sweep: its state, trials by state, the best trial so far."""
    with connect(ctx) as client:
        s = client.get_sweep(sweep_id)
    if fmt != "table":
        out.emit_data(out.to_dict(s), fmt)
        return
    rows = [
        ("Sweep", f"{s.sweep_id} ({s.spec.name})"),
        ("State", sweep_state(s.state) + (f": {s.reason}" if s.reason else "")),
        (
            "Objective",
            f"{'maximize' if s.spec.objective.maximize else 'minimize'} {s.spec.objective.metric}",
        ),
        (
            "Trials",
            f"{_counts(s)} (max {s.spec.max_trials}, {s.spec.parallel_trials or 1} at once)",
        ),
        ("Best", f"{_best(s)} (trial {s.best_trial})" if s.HasField("best") else "-"),
        ("Steps", f"{s.total_steps} reported in all"),
        ("Reallocations", str(s.reallocations)),
    ]
    for key, value in rows:
        click.echo(f"{key + ':':<15}{value}")


@sweep.command(name="list")
@out.list_output_option
@click.pass_context
def list_(ctx: click.Context, fmt: str) -> None:
    """List sweeps, newest first."""
    with connect(ctx) as client:
        sweeps = client.list_sweeps()
    if fmt not in ("table", "wide"):
        out.emit_data({"sweeps": [out.to_dict(s) for s in sweeps]}, fmt)
        return
    rows = [
        (
            s.sweep_id,
            s.spec.name,
            sweep_state(s.state),
            _counts(s),
            _best(s),
            out.reason("", s.reason, fmt == "wide"),
        )
        for s in sweeps
    ]
    columns = ("SWEEP", "NAME", "STATE", "TRIALS", "BEST", "REASON")
    out.console(fmt == "wide").print(out.table(columns, rows))


@sweep.command()
@click.argument("sweep_id")
@out.list_output_option
@click.pass_context
def trials(ctx: click.Context, sweep_id: str, fmt: str) -> None:
    """A sweep's trials, the best so far first, with why each stopped or failed."""
    with connect(ctx) as client:
        found = client.list_trials(sweep_id)
    if fmt not in ("table", "wide"):
        out.emit_data({"trials": [out.to_dict(t) for t in found]}, fmt)
        return
    rows = [
        (
            str(t.index),
            trial_state(t.state),
            " ".join(f"{k}={v}" for k, v in sorted(t.params.items())),
            _best(t),
            str(t.last_step),
            str(t.size or "-"),
            t.job_id or "-",
            out.reason("", t.reason, fmt == "wide"),
        )
        for t in found
    ]
    columns = ("TRIAL", "STATE", "PARAMS", "BEST", "STEP", "SIZE", "JOB", "REASON")
    out.console(fmt == "wide").print(out.table(columns, rows))


@sweep.command()
@click.argument("sweep_id")
@click.option("--message", "-m", default="", help="Why; kept as the sweep's reason.")
@out.output_option
@click.pass_context
def kill(ctx: click.Context, sweep_id: str, message: str, fmt: str) -> None:
    """Kill a sweep: its running trials' jobs are killed, the trials recorded KILLED."""
    with connect(ctx) as client:
        s = client.kill_sweep(sweep_id, message)
    if fmt == "table":
        click.echo(f"sweep {s.sweep_id} {sweep_state(s.state)}")
    else:
        out.emit_data(out.to_dict(s), fmt)
