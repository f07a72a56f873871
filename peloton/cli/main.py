"""Entry point of the ``peloton`` command: errors become one line and an exit code.

Exit codes: 0 ok; 1 the server refused or failed (not found, wrong state, unreachable); 2 usage or
validation error (bad flag, bad spec, INVALID_ARGUMENT from the server).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import click
import grpc

from peloton.client import ClientError, default_server, server_address
from peloton.errors import InvalidArgument, PelotonError

EXIT_SERVER = 1
EXIT_USAGE = 2


class CliError(click.ClickException):
    """A one-line error; ``code`` is the process exit code."""

    def __init__(self, message: str, code: int = EXIT_SERVER) -> None:
        super().__init__(message)
        self.code = code

    def show(self, file: object = None) -> None:
        # One line whatever the cause said (driver errors span several).
        text = " ".join(line.strip() for line in self.message.splitlines() if line.strip())
        click.echo(f"error: {text}", err=True)


def cli_error(exc: Exception, server: str = "") -> CliError:
    """The one-line message and exit code for an error."""
    if isinstance(exc, ClientError):
        if exc.code == grpc.StatusCode.INVALID_ARGUMENT:
            return CliError(f"invalid: {exc.details}", EXIT_USAGE)
        if exc.code == grpc.StatusCode.UNAVAILABLE:
            return CliError(f"cannot reach the peloton server at {server}: {exc.details}")
        if exc.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return CliError(f"the peloton server at {server} did not answer in time")
        return CliError(f"{exc.code.name.lower().replace('_', ' ')}: {exc.details}")
    if isinstance(exc, InvalidArgument):
        return CliError(f"invalid: {exc}", EXIT_USAGE)
    if isinstance(exc, PelotonError):
        return CliError(str(exc))
    from sqlalchemy.exc import OperationalError

    if isinstance(exc, OperationalError):
        # The driver's first line says why (refused, no such database, bad password).
        cause = str(exc.orig).strip().splitlines()
        return CliError(f"cannot use the database: {cause[0] if cause else 'unavailable'}")
    return CliError(f"internal error: {exc.__class__.__name__}: {exc}")


def read_text_file(file: Path) -> str:
    """The UTF-8 text of a spec FILE (- is standard input); a file that cannot be read or is
    not UTF-8 (binary, latin-1, UTF-16) is a usage error."""
    try:
        data = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
    except OSError as exc:
        raise click.BadParameter(f"cannot read {file}: {exc.strerror}", param_hint="FILE") from None
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise CliError(
            f"{file}: not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x}); "
            "save it as UTF-8",
            EXIT_USAGE,
        ) from None


def _seconds(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    """A positive, finite number of seconds (a negative or nan timeout never answers)."""
    if not math.isfinite(value) or value <= 0:
        raise click.BadParameter(f"must be a positive number of seconds (got {value})")
    return value


def usage_error(exc: click.UsageError) -> CliError:
    """A click usage error (bad option or value, missing argument or file) as one line: click's
    message and where the help is, without the usage block."""
    message = exc.format_message().strip().rstrip(".")
    message = message[:1].lower() + message[1:]
    command = exc.ctx.command_path if exc.ctx is not None else "peloton"
    message += f" (see: {command} --help)"
    return CliError(message, EXIT_USAGE)


def _server(value: str) -> str:
    try:
        return server_address(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--server",
    "-s",
    default=default_server,
    show_default="PELOTON_SERVER or 127.0.0.1:5392",
    callback=lambda _ctx, _param, value: _server(value),
    help="Address of the peloton server: HOST[:PORT], port 5392 if left out ([IPV6]:PORT).",
)
@click.option(
    "--timeout",
    default=30.0,
    show_default=True,
    callback=_seconds,
    help="Seconds to wait for each call.",
)
@click.version_option(package_name="peloton")
@click.pass_context
def cli(ctx: click.Context, server: str, timeout: float) -> None:
    """peloton: a GPU gang scheduler for distributed deep learning on Apache Mesos.

    \b
    Examples:
      peloton job submit examples/job.yaml
      peloton job list --state RUNNING -o json
      peloton job watch JOB_ID
      peloton pool create examples/pools/vision.yaml
      peloton pool tree
      peloton server --db-url postgresql://peloton@db/peloton

    Shell completion: eval "$(peloton completion bash)"
    """
    ctx.obj = {"server": server, "timeout": timeout}


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL."""
    from click.shell_completion import get_completion_class

    comp_cls = get_completion_class(shell)
    assert comp_cls is not None
    comp = comp_cls(cli, {}, "peloton", "_PELOTON_COMPLETE")
    click.echo(comp.source())


def _register() -> None:
    from peloton.cli import db, hosts, jobs, minicluster, pools, server

    cli.add_command(minicluster.minicluster)
    cli.add_command(jobs.job)
    cli.add_command(jobs.task)
    cli.add_command(pools.pool)
    cli.add_command(hosts.host)
    cli.add_command(server.server)
    cli.add_command(db.db)


_register()


def main() -> None:
    try:
        # Without standalone mode click *returns* the code of a ctx.exit(code) (e.g. `job watch`
        # of a job that did not succeed) instead of raising Exit; it must reach the shell.
        code = cli.main(prog_name="peloton", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except CliError as exc:
        exc.show()
        sys.exit(exc.code)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()  # `peloton` or `peloton job` alone: the help, as asked
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        err = usage_error(exc)
        err.show()
        sys.exit(err.code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("PELOTON_DEBUG"):
            raise
        err = cli_error(exc)
        err.show()
        sys.exit(err.code)
    sys.exit(code if isinstance(code, int) else 0)
