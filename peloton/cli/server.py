"""``peloton server``: run the daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from peloton.cli.common import cli_error
from peloton.cli.options import config_option, config_options
from peloton.config import ServerConfig
from peloton.logs import setup_logging


@click.command()
@config_option
@config_options()
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write 'GRPC_PORT METRICS_PORT CONSOLE_PORT' here once listening (for scripts using "
    "port 0; CONSOLE_PORT 0: no console).",
)
def server(port_file: Path | None, **options: Any) -> None:
    """Run the peloton daemon until SIGTERM or SIGINT.

    The database must be migrated first: peloton db upgrade --db-url URL.
    """
    config = ServerConfig(**options)
    setup_logging(config.log_level, config.log_format)
    from peloton.server import Server  # heavy imports only when serving

    daemon = Server(config)
    if port_file is not None:
        _announce_ports(daemon, port_file)
    try:
        daemon.run_until_signalled()
    except Exception as exc:
        daemon.stop(0)
        raise cli_error(exc) from None
    finally:
        if port_file is not None:
            # A stale file would tell a script waiting for the next start the old ports.
            port_file.unlink(missing_ok=True)


def _announce_ports(daemon: Any, port_file: Path) -> None:
    start = daemon.start

    def start_and_write() -> None:
        start()
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(f"{daemon.grpc_port} {daemon.metrics_port} {daemon.console_port}\n")
        tmp.replace(port_file)  # atomic: readers never see half a file

    daemon.start = start_and_write
