"""Entry point of the ``peloton`` command: the top of the CLI, which assembles the command
modules (each imports only :mod:`peloton.cli.common`, :mod:`peloton.cli.output` and
:mod:`peloton.cli.options`) and turns every error into one line and an exit code (see
:mod:`peloton.cli.common`).
"""

from __future__ import annotations

import math
import os
import sys

import click

from peloton.cli import (
    audit,
    cluster,
    db,
    hosts,
    jobs,
    minicluster,
    pools,
    server,
    simulate,
    sweeps,
)
from peloton.cli.common import CliError, cli_error, usage_error
from peloton.client import server_addresses


def _seconds(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    """A positive, finite number of seconds (a negative or nan timeout never answers)."""
    if not math.isfinite(value) or value <= 0:
        raise click.BadParameter(f"must be a positive number of seconds (got {value})")
    return value


def _server(value: str | None) -> str | None:
    if value is None:
        return None  # the client config file's, else 127.0.0.1:5392 (common.client_settings)
    try:
        return ",".join(server_addresses(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--server",
    "-s",
    envvar="PELOTON_SERVER",
    default=None,
    show_default="PELOTON_SERVER, client.yaml's server, or 127.0.0.1:5392",
    callback=lambda _ctx, _param, value: _server(value),
    help="Address of the peloton server: HOST[:PORT], port 5392 if left out ([IPV6]:PORT); "
    "several daemons separated by commas (the next is tried while one cannot be reached).",
)
@click.option(
    "--timeout",
    default=30.0,
    show_default=True,
    callback=_seconds,
    help="Seconds to wait for each call.",
)
@click.option(
    "--ca-file",
    envvar="PELOTON_CA_FILE",
    type=click.Path(dir_okay=False),
    help="Connect over TLS, verifying the server's certificate with this CA (PEM).",
)
@click.option(
    "--cert-file",
    envvar="PELOTON_CERT_FILE",
    type=click.Path(dir_okay=False),
    help="Client certificate (PEM) for servers that require one (mutual TLS); with --key-file.",
)
@click.option(
    "--key-file",
    envvar="PELOTON_KEY_FILE",
    type=click.Path(dir_okay=False),
    help="Private key (PEM) of --cert-file.",
)
@click.option(
    "--token-file",
    envvar="PELOTON_TOKEN_FILE",
    type=click.Path(dir_okay=False),
    help="File holding a bearer token sent with every call (PELOTON_TOKEN: the token itself); "
    "only over TLS or to a loopback server.",
)
@click.version_option(package_name="peloton")
@click.pass_context
def cli(
    ctx: click.Context,
    server: str | None,
    timeout: float,
    ca_file: str | None,
    cert_file: str | None,
    key_file: str | None,
    token_file: str | None,
) -> None:
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

    Client settings not given as flags or PELOTON_* variables come from the client config file,
    PELOTON_CLIENT_CONFIG or $XDG_CONFIG_HOME/peloton/client.yaml (keys server, ca_file,
    cert_file, key_file, token_file).
    """
    ctx.obj = {
        "server": server,
        "timeout": timeout,
        "ca_file": ca_file,
        "cert_file": cert_file,
        "key_file": key_file,
        "token_file": token_file,
    }


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL."""
    from click.shell_completion import get_completion_class

    comp_cls = get_completion_class(shell)
    assert comp_cls is not None
    comp = comp_cls(cli, {}, "peloton", "_PELOTON_COMPLETE")
    click.echo(comp.source())


cli.add_command(minicluster.minicluster)
cli.add_command(jobs.job)
cli.add_command(jobs.task)
cli.add_command(pools.pool)
cli.add_command(hosts.host)
cli.add_command(server.server)
cli.add_command(db.db)
cli.add_command(cluster.cluster)
cli.add_command(audit.audit)
cli.add_command(simulate.simulate)
cli.add_command(sweeps.sweep)  # README "Sweeps"


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
