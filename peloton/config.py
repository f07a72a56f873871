"""Daemon configuration: defaults < config file (YAML) < PELOTON_* environment < flags.

The precedence is applied by the CLI (click reads flags and environment and takes the file as its
defaults); this module defines the options, their defaults and the file format.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from peloton.errors import InvalidArgument
from peloton.storage.db import DbTimeouts, default_sqlite_url


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "peloton"


@dataclass(frozen=True)
class ServerConfig:
    """Every option of ``peloton server``; the config file uses these names as keys."""

    # Database URL: sqlite:///PATH or postgresql://USER@HOST:PORT/DB. Empty: SQLite in data_dir.
    db_url: str = ""
    # Directory for the embedded database and other local state.
    data_dir: Path = field(default_factory=default_data_dir)
    # Address and port of the gRPC API.
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 5392
    # Address and port of the Prometheus /metrics endpoint.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9392
    # Threads serving unary RPCs (WatchJob streams wait on the event loop and hold none).
    grpc_workers: int = 32
    # Open WatchJob streams allowed in all and per client address; beyond: RESOURCE_EXHAUSTED.
    max_watches: int = 10_000
    max_watches_per_client: int = 2_000
    # Seconds in-flight RPCs may take to finish on SIGTERM.
    shutdown_grace_seconds: float = 10.0
    # Logging: debug, info, warning, error; json or text.
    log_level: str = "info"
    log_format: str = "json"
    # Mesos master: host:port or zk://host:port,.../mesos. Empty: no Mesos (nothing launches).
    mesos_master: str = ""
    mesos_role: str = "*"
    # FrameworkInfo.user: agents (--switch_user, their default) run tasks as this user, who must
    # exist on every agent. Empty: the user the daemon runs as.
    mesos_user: str = ""
    mesos_principal: str = ""
    framework_name: str = "peloton"
    # Mesos keeps the tasks this long for a restarted daemon to take over (failover).
    failover_timeout_seconds: float = 7 * 24 * 3600.0
    # Offers are held this long while gangs wait, then declined for fresh ones.
    offer_hold_seconds: float = 30.0
    # Declines when nothing waits ask Mesos not to re-offer for this long (REVIVE overrides).
    offer_refuse_seconds: float = 30.0
    # A placement's claim on a host expires if the gang was not launched within this.
    lease_seconds: float = 60.0
    # Explicit + implicit task reconciliation period (also on every (re)subscription).
    reconcile_interval_seconds: float = 300.0
    # Database bounds: the longest a statement may run (an RPC's: at most until its deadline),
    # a wait for a pooled connection, and a connect (also how soon keepalives find a dead peer).
    db_statement_timeout_seconds: float = 30.0
    db_pool_timeout_seconds: float = 5.0
    db_connect_timeout_seconds: float = 5.0
    # How often health probes the database (NOT_SERVING while it does not answer).
    db_probe_interval_seconds: float = 2.0
    # A lost agent's host still counts toward the capacity that decides a gang can never fit
    # for this long (agents come back from reboots), as Mesos waits agent_reregister_timeout.
    host_loss_grace_seconds: float = 600.0

    def __post_init__(self) -> None:
        # A config file gives strings; the rest of peloton wants a Path.
        object.__setattr__(self, "data_dir", Path(self.data_dir))

    @property
    def database_url(self) -> str:
        return self.db_url or default_sqlite_url(self.data_dir)

    @property
    def db_timeouts(self) -> DbTimeouts:
        return DbTimeouts(
            statement_seconds=self.db_statement_timeout_seconds,
            pool_seconds=self.db_pool_timeout_seconds,
            connect_seconds=self.db_connect_timeout_seconds,
        )


CONFIG_KEYS = tuple(f.name for f in fields(ServerConfig))


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML config file; unknown keys and wrong shapes are errors naming the key."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidArgument("config", f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise InvalidArgument("config", f"{path} is not valid YAML") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgument("config", f"{path} must be a mapping of option: value")
    for key in data:
        if key not in CONFIG_KEYS:
            raise InvalidArgument(
                f"config.{key}", f"unknown option; known: {', '.join(CONFIG_KEYS)}"
            )
    return data
