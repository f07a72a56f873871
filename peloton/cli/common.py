"""What every ``peloton`` command shares: its errors as one line and an exit code, reading a
spec file, and a client for ``--server``. The bottom of the CLI: it imports no other CLI module.

Exit codes: 0 ok; 1 the server refused or failed (not found, wrong state, unreachable); 2 usage or
validation error (bad flag, bad spec, INVALID_ARGUMENT from the server).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
import grpc
from sqlalchemy.exc import OperationalError

from peloton.client import ClientError, PelotonClient
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


def usage_error(exc: click.UsageError) -> CliError:
    """A click usage error (bad option or value, missing argument or file) as one line: click's
    message and where the help is, without the usage block."""
    message = exc.format_message().strip().rstrip(".")
    message = message[:1].lower() + message[1:]
    command = exc.ctx.command_path if exc.ctx is not None else "peloton"
    message += f" (see: {command} --help)"
    return CliError(message, EXIT_USAGE)


@contextmanager
def connect(ctx: click.Context) -> Iterator[PelotonClient]:
    """A client for the command's --server; every error becomes a one-line CliError."""
    obj = ctx.find_root().obj
    try:
        with PelotonClient(obj["server"], timeout=obj["timeout"]) as client:
            yield client
    except click.ClickException:
        raise
    except Exception as exc:
        raise cli_error(exc, obj["server"]) from None
