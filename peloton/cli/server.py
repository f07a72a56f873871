"""``peloton server``: run the daemon."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import click

from peloton.cli.main import cli_error
from peloton.config import ServerConfig, load_config_file
from peloton.logs import setup_logging

F = TypeVar("F", bound=Callable[..., Any])
_DEFAULTS = ServerConfig()


def _load_config(ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    """Eager: the file's values become the defaults that environment and flags override."""
    if value is not None:
        try:
            ctx.default_map = {**(ctx.default_map or {}), **load_config_file(value)}
        except Exception as exc:
            raise cli_error(exc) from None
    return value


config_option = click.option(
    "--config",
    "-c",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PELOTON_CONFIG",
    is_eager=True,
    expose_value=False,
    callback=_load_config,
    help="YAML file of options (keys as the flags, with _); flags and PELOTON_* override it.",
)


def database_options(f: F) -> F:
    f = click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=_DEFAULTS.data_dir,
        envvar="PELOTON_DATA_DIR",
        show_default=True,
        help="Directory for the embedded SQLite database.",
    )(f)
    f = click.option(
        "--db-url",
        default="",
        envvar="PELOTON_DB_URL",
        help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB [default: SQLite in the data dir].",
    )(f)
    return f


@click.command()
@config_option
@database_options
@click.option(
    "--grpc-host",
    default=_DEFAULTS.grpc_host,
    envvar="PELOTON_GRPC_HOST",
    show_default=True,
    help="Address the gRPC API listens on.",
)
@click.option(
    "--grpc-port",
    type=click.IntRange(0, 65535),
    default=_DEFAULTS.grpc_port,
    envvar="PELOTON_GRPC_PORT",
    show_default=True,
    help="gRPC API port (0: any free).",
)
@click.option(
    "--metrics-host",
    default=_DEFAULTS.metrics_host,
    envvar="PELOTON_METRICS_HOST",
    show_default=True,
    help="Address of the Prometheus /metrics endpoint.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=_DEFAULTS.metrics_port,
    envvar="PELOTON_METRICS_PORT",
    show_default=True,
    help="Prometheus /metrics port (0: any free).",
)
@click.option(
    "--grpc-workers",
    type=click.IntRange(1, 1024),
    default=_DEFAULTS.grpc_workers,
    envvar="PELOTON_GRPC_WORKERS",
    show_default=True,
    help="Threads serving unary RPCs (open watches hold none).",
)
@click.option(
    "--max-watches",
    type=click.IntRange(1),
    default=_DEFAULTS.max_watches,
    envvar="PELOTON_MAX_WATCHES",
    show_default=True,
    help="Open WatchJob streams allowed in all; beyond: RESOURCE_EXHAUSTED.",
)
@click.option(
    "--max-watches-per-client",
    type=click.IntRange(1),
    default=_DEFAULTS.max_watches_per_client,
    envvar="PELOTON_MAX_WATCHES_PER_CLIENT",
    show_default=True,
    help="Open WatchJob streams allowed per client address; beyond: RESOURCE_EXHAUSTED.",
)
@click.option(
    "--shutdown-grace-seconds",
    type=click.FloatRange(0),
    show_default=True,
    default=_DEFAULTS.shutdown_grace_seconds,
    envvar="PELOTON_SHUTDOWN_GRACE_SECONDS",
    help="Time in-flight RPCs get to finish on SIGTERM.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default=_DEFAULTS.log_level,
    envvar="PELOTON_LOG_LEVEL",
    show_default=True,
)
@click.option(
    "--log-format",
    type=click.Choice(["json", "text"]),
    default=_DEFAULTS.log_format,
    envvar="PELOTON_LOG_FORMAT",
    show_default=True,
)
@click.option(
    "--mesos-master",
    default=_DEFAULTS.mesos_master,
    envvar="PELOTON_MESOS_MASTER",
    help="Mesos master host:port or zk://HOSTS/mesos [default: none, nothing is launched].",
)
@click.option(
    "--mesos-role", default=_DEFAULTS.mesos_role, envvar="PELOTON_MESOS_ROLE", show_default=True
)
@click.option("--mesos-principal", default="", envvar="PELOTON_MESOS_PRINCIPAL")
@click.option(
    "--mesos-user",
    default=_DEFAULTS.mesos_user,
    envvar="PELOTON_MESOS_USER",
    help="User the agents run tasks as (it must exist on every agent) [default: the daemon's].",
)
@click.option(
    "--framework-name",
    default=_DEFAULTS.framework_name,
    envvar="PELOTON_FRAMEWORK_NAME",
    show_default=True,
    help="Mesos framework name; also the key of the saved framework id.",
)
@click.option(
    "--failover-timeout-seconds",
    type=click.FloatRange(0),
    default=_DEFAULTS.failover_timeout_seconds,
    envvar="PELOTON_FAILOVER_TIMEOUT_SECONDS",
    show_default=True,
    help="How long Mesos keeps the tasks of a daemon that went away.",
)
@click.option(
    "--offer-hold-seconds",
    type=click.FloatRange(0),
    default=_DEFAULTS.offer_hold_seconds,
    envvar="PELOTON_OFFER_HOLD_SECONDS",
    show_default=True,
)
@click.option(
    "--offer-refuse-seconds",
    type=click.FloatRange(0),
    default=_DEFAULTS.offer_refuse_seconds,
    envvar="PELOTON_OFFER_REFUSE_SECONDS",
    show_default=True,
)
@click.option(
    "--lease-seconds",
    type=click.FloatRange(0.1),
    default=_DEFAULTS.lease_seconds,
    envvar="PELOTON_LEASE_SECONDS",
    show_default=True,
)
@click.option(
    "--reconcile-interval-seconds",
    type=click.FloatRange(1),
    default=_DEFAULTS.reconcile_interval_seconds,
    envvar="PELOTON_RECONCILE_INTERVAL_SECONDS",
    show_default=True,
)
@click.option(
    "--host-loss-grace-seconds",
    type=click.FloatRange(0),
    default=_DEFAULTS.host_loss_grace_seconds,
    envvar="PELOTON_HOST_LOSS_GRACE_SECONDS",
    show_default=True,
    help="How long a lost agent's host still counts toward the capacity gangs must fit.",
)
@click.option(
    "--db-statement-timeout-seconds",
    type=click.FloatRange(0.001),
    default=_DEFAULTS.db_statement_timeout_seconds,
    envvar="PELOTON_DB_STATEMENT_TIMEOUT_SECONDS",
    show_default=True,
    help="Longest a database statement may run (an RPC's: at most until its deadline).",
)
@click.option(
    "--db-pool-timeout-seconds",
    type=click.FloatRange(0),
    default=_DEFAULTS.db_pool_timeout_seconds,
    envvar="PELOTON_DB_POOL_TIMEOUT_SECONDS",
    show_default=True,
    help="Longest wait for a pooled database connection.",
)
@click.option(
    "--db-connect-timeout-seconds",
    type=click.FloatRange(1),
    default=_DEFAULTS.db_connect_timeout_seconds,
    envvar="PELOTON_DB_CONNECT_TIMEOUT_SECONDS",
    show_default=True,
    help="Longest a database connect may take; keepalives find a dead peer about as soon.",
)
@click.option(
    "--db-probe-interval-seconds",
    type=click.FloatRange(0.01),
    default=_DEFAULTS.db_probe_interval_seconds,
    envvar="PELOTON_DB_PROBE_INTERVAL_SECONDS",
    show_default=True,
    help="How often health probes the database (NOT_SERVING while it does not answer).",
)
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write 'GRPC_PORT METRICS_PORT' here once listening (for scripts using port 0).",
)
def server(port_file: Path | None, **options: Any) -> None:
    """Run the peloton daemon until SIGTERM or SIGINT.

    The database must be migrated first: peloton db upgrade --db-url URL.
    """
    names = {f.name for f in fields(ServerConfig)}
    config = ServerConfig(**{k: v for k, v in options.items() if k in names})
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
        tmp.write_text(f"{daemon.grpc_port} {daemon.metrics_port}\n")
        tmp.replace(port_file)  # atomic: readers never see half a file

    daemon.start = start_and_write
