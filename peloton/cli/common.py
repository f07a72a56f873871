"""What every ``peloton`` command shares: its errors as one line and an exit code, reading a
spec file, and a client for ``--server`` with its credentials. The bottom of the CLI: it imports
no other CLI module.

Where the client's settings come from, first found wins: the global flags (``--server``,
``--ca-file``, ``--cert-file``, ``--key-file``, ``--token-file``), their PELOTON_* variables
(``PELOTON_SERVER``, ``PELOTON_CA_FILE``, ...; ``PELOTON_TOKEN`` holds a token itself, after
``--token-file`` and ``PELOTON_TOKEN_FILE``), then the client config file
(``PELOTON_CLIENT_CONFIG``, else ``$XDG_CONFIG_HOME/peloton/client.yaml``, read if it exists;
keys ``server``, ``ca_file``, ``cert_file``, ``key_file``, ``token_file``; relative paths are
relative to the file), then 127.0.0.1:5392 without TLS or token.

Exit codes: 0 ok; 1 the server refused or failed (not found, wrong state, unreachable); 2 usage or
validation error (bad flag, bad spec, INVALID_ARGUMENT from the server).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import grpc
import yaml
from sqlalchemy.exc import OperationalError

from peloton.client import DEFAULT_SERVER, ClientError, PelotonClient, Tls, server_addresses
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


CLIENT_CONFIG_KEYS = ("server", "ca_file", "cert_file", "key_file", "token_file")


def client_config_path() -> Path:
    """Where the client config file is: PELOTON_CLIENT_CONFIG, else
    ``$XDG_CONFIG_HOME/peloton/client.yaml`` (``~/.config`` without XDG_CONFIG_HOME)."""
    given = os.environ.get("PELOTON_CLIENT_CONFIG")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "peloton" / "client.yaml"


def load_client_config(path: Path) -> dict[str, str]:
    """The settings of a client config file ({} if there is none; PELOTON_CLIENT_CONFIG naming a
    missing file is an error), file paths made absolute; unknown keys are errors naming them."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        if os.environ.get("PELOTON_CLIENT_CONFIG"):
            raise CliError(f"client config {path} does not exist (PELOTON_CLIENT_CONFIG)") from None
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read the client config {path}: {exc}", EXIT_USAGE) from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        raise CliError(f"client config {path} is not valid YAML", EXIT_USAGE) from None
    if not isinstance(data, dict):
        raise CliError(f"client config {path} must be a mapping of key: value", EXIT_USAGE)
    settings: dict[str, str] = {}
    for key, value in data.items():
        if key not in CLIENT_CONFIG_KEYS:
            raise CliError(
                f"client config {path}: unknown key {key!r}; "
                f"known: {', '.join(CLIENT_CONFIG_KEYS)}",
                EXIT_USAGE,
            )
        if not isinstance(value, str) or not value:
            raise CliError(f"client config {path}: {key} must be a non-empty string", EXIT_USAGE)
        settings[key] = value if key == "server" else str(path.parent / Path(value).expanduser())
    return settings


def _read_token(path: str, source: str) -> str:
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise CliError(
            f"cannot read the token file {path} ({source}): {reason}", EXIT_USAGE
        ) from None
    if not token:
        raise CliError(f"the token file {path} ({source}) is empty", EXIT_USAGE)
    return token


def client_settings(obj: Mapping[str, Any]) -> tuple[str, Tls | None, str | None]:
    """The server, TLS and token a command connects with, from the global options in ``obj``
    (None where not given) and the client config file (see the module's docstring)."""
    given = {key: obj.get(key) for key in CLIENT_CONFIG_KEYS}
    settings = {key: value for key, value in given.items() if value}
    if len(settings) < len(CLIENT_CONFIG_KEYS):
        settings = {**load_client_config(client_config_path()), **settings}
    server = settings.get("server") or DEFAULT_SERVER
    try:
        server = ",".join(server_addresses(server))
    except ValueError as exc:
        raise CliError(f"invalid: server: {exc}", EXIT_USAGE) from None
    ca, cert, key = (settings.get(k) for k in ("ca_file", "cert_file", "key_file"))
    tls = Tls.from_files(ca, cert, key) if ca or cert or key else None
    token = None
    if given["token_file"]:
        token = _read_token(str(given["token_file"]), "--token-file")
    elif os.environ.get("PELOTON_TOKEN"):
        token = os.environ["PELOTON_TOKEN"].strip()
    elif settings.get("token_file"):
        token = _read_token(settings["token_file"], "client config token_file")
    return server, tls, token


@contextmanager
def connect(ctx: click.Context) -> Iterator[PelotonClient]:
    """A client for the command's --server with its credentials; every error becomes a
    one-line CliError."""
    obj = ctx.find_root().obj
    server = obj.get("server") or ""
    try:
        server, tls, token = client_settings(obj)
        with PelotonClient(server, timeout=obj["timeout"], tls=tls, token=token) as client:
            yield client
    except click.ClickException:
        raise
    except Exception as exc:
        raise cli_error(exc, server) from None
