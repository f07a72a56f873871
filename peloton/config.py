"""Daemon configuration: defaults < config file (YAML) < PELOTON_* environment < flags.

:class:`ServerConfig` is the one declaration of every option of ``peloton server``: each field's
:class:`Flag` metadata gives its help, its value range or choices and, where it has one, the
:class:`~peloton.hostmgr.framework.MesosSettings` field it sets. The CLI generates the flag
(``--grpc-port``) and the environment variable (``PELOTON_GRPC_PORT``) from the field's name and
applies the precedence (click reads flags and environment and takes the file as its defaults); the
config file uses the field names as keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from peloton.core.access import Principal, parse_admins
from peloton.core.containers import DEFAULT_RUNTIME_IMAGE, parse_image
from peloton.core.term import LeaseTiming
from peloton.errors import InvalidArgument
from peloton.storage.db import DbTimeouts, default_sqlite_url

ENV_PREFIX = "PELOTON_"


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "peloton"


@dataclass(frozen=True)
class Flag:
    """How a :class:`ServerConfig` field is offered as a flag and a PELOTON_* variable."""

    help: str = ""
    # Inclusive bounds of a number (None: unbounded).
    min: float | None = None
    max: float | None = None
    # The only values a string may take.
    choices: tuple[str, ...] = ()
    # Whether --help shows the default (False where the help says what empty means).
    show_default: bool = True
    # The MesosSettings field that this option sets ("": none).
    mesos: str = ""


def option(default: Any, **flag: Any) -> Any:
    """A :class:`ServerConfig` field with its :class:`Flag`."""
    return field(default=default, metadata={"flag": Flag(**flag)})


def flag_of(name: str) -> str:
    """``grpc_port`` -> ``--grpc-port``."""
    return "--" + name.replace("_", "-")


def env_var_of(name: str) -> str:
    """``grpc_port`` -> ``PELOTON_GRPC_PORT``."""
    return ENV_PREFIX + name.upper()


@dataclass(frozen=True)
class ServerConfig:
    """Every option of ``peloton server``, in the order ``--help`` lists them; the config file
    uses these names as keys."""

    db_url: str = option(
        "",
        help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB [default: SQLite in the data dir].",
        show_default=False,
    )
    # Directory for the embedded database and other local state.
    data_dir: Path = field(
        default_factory=default_data_dir,
        metadata={"flag": Flag(help="Directory for the embedded SQLite database.")},
    )
    grpc_host: str = option("127.0.0.1", help="Address the gRPC API listens on.")
    grpc_port: int = option(5392, help="gRPC API port (0: any free).", min=0, max=65535)
    metrics_host: str = option("127.0.0.1", help="Address of the Prometheus /metrics endpoint.")
    metrics_port: int = option(
        9392, help="Prometheus /metrics port (0: any free).", min=0, max=65535
    )
    # The web console (docs/console-api.md): the daemon serves it on a port of its own.
    console_enabled: bool = option(True, help="Serve the web console.")
    console_host: str = option("127.0.0.1", help="Address the web console listens on.")
    console_port: int = option(8392, help="Web console port (0: any free).", min=0, max=65535)
    rendezvous_host: str = option(
        "",
        help="Address the rendezvous endpoints of elastic gangs listen on; their tasks connect "
        "there [default: grpc-host, or this host's address if that is a wildcard].",
        show_default=False,
    )
    # WatchJob streams wait on the event loop and hold no thread.
    grpc_workers: int = option(
        32, help="Threads serving unary RPCs (open watches hold none).", min=1, max=1024
    )
    max_watches: int = option(
        10_000, help="Open WatchJob streams allowed in all; beyond: RESOURCE_EXHAUSTED.", min=1
    )
    max_watches_per_client: int = option(
        2_000,
        help="Open WatchJob streams allowed per client address; beyond: RESOURCE_EXHAUSTED.",
        min=1,
    )
    shutdown_grace_seconds: float = option(
        10.0, help="Time in-flight RPCs get to finish on SIGTERM.", min=0
    )
    log_level: str = option(
        "info",
        help="Least severe log records written.",
        choices=("debug", "info", "warning", "error"),
    )
    log_format: str = option(
        "json",
        help="Log records on stderr: one JSON object a line, or text.",
        choices=("json", "text"),
    )
    # Mesos master: host:port or zk://host:port,.../mesos. Empty: no Mesos (nothing launches).
    mesos_master: str = option(
        "",
        help="Mesos master host:port or zk://HOSTS/mesos [default: none, nothing is launched].",
        show_default=False,
        mesos="master",
    )
    mesos_role: str = option(
        "*", help="Mesos role whose resources peloton is offered.", mesos="role"
    )
    mesos_principal: str = option(
        "",
        help="Mesos principal of the framework [default: none].",
        show_default=False,
        mesos="principal",
    )
    # The secret is read from a file at start (never from a flag: /proc/PID/cmdline is public).
    mesos_secret_file: str = option(
        "",
        help="File holding the secret of mesos_principal, for a master that authenticates "
        "frameworks (HTTP Basic); others must not be able to read it [default: none, no "
        "authentication].",
        show_default=False,
        mesos="secret_file",
    )
    # FrameworkInfo.user: agents (--switch_user, their default) run tasks as this user, who must
    # exist on every agent. Empty: the user the daemon runs as.
    mesos_user: str = option(
        "",
        help="User the agents run tasks as (it must exist on every agent) [default: the daemon's].",
        show_default=False,
        mesos="user",
    )
    framework_name: str = option(
        "peloton",
        help="Mesos framework name; also the key of the saved framework id.",
        mesos="framework_name",
    )
    # Mesos keeps the tasks this long for a restarted daemon to take over (failover).
    failover_timeout_seconds: float = option(
        7 * 24 * 3600.0,
        help="How long Mesos keeps the tasks of a daemon that went away.",
        min=0,
        mesos="failover_timeout_seconds",
    )
    offer_hold_seconds: float = option(
        30.0,
        help="Offers are held this long while gangs wait, then declined for fresh ones.",
        min=0,
        mesos="offer_hold_seconds",
    )
    offer_refuse_seconds: float = option(
        30.0,
        help="Declines when nothing waits ask Mesos not to re-offer for this long (REVIVE "
        "overrides).",
        min=0,
        mesos="refuse_seconds",
    )
    lease_seconds: float = option(
        60.0,
        help="A placement's claim on a host expires if the gang was not launched within this.",
        min=0.1,
        mesos="lease_seconds",
    )
    reconcile_interval_seconds: float = option(
        300.0,
        help="Period of explicit and implicit task reconciliation (also on every subscription).",
        min=1,
        mesos="reconcile_interval_seconds",
    )
    # Agents pull it from their image store (docker_registry) for tasks with runtime "peloton".
    runtime_image: str = option(
        DEFAULT_RUNTIME_IMAGE,
        help="Image of peloton's collective runtime bundle, mounted at /opt/peloton in task "
        'containers with runtime "peloton".',
        mesos="runtime_image",
    )
    # As Mesos waits agent_reregister_timeout: agents come back from reboots.
    host_loss_grace_seconds: float = option(
        600.0,
        help="How long a lost agent's host still counts toward the capacity gangs must fit.",
        min=0,
        mesos="host_loss_grace_seconds",
    )
    # Database bounds; keepalives find a dead peer about as soon as a connect times out.
    db_statement_timeout_seconds: float = option(
        30.0,
        help="Longest a database statement may run (an RPC's: at most until its deadline).",
        min=0.001,
    )
    db_pool_timeout_seconds: float = option(
        5.0, help="Longest wait for a pooled database connection.", min=0
    )
    db_connect_timeout_seconds: float = option(
        5.0,
        help="Longest a database connect may take; keepalives find a dead peer about as soon.",
        min=1,
    )
    db_probe_interval_seconds: float = option(
        2.0,
        help="How often health probes the database (NOT_SERVING while it does not answer).",
        min=0.01,
    )
    # Several daemons on one PostgreSQL database elect the one that schedules by a lease row.
    daemon_id: str = option(
        "",
        help="This daemon's id among several on one PostgreSQL database; with one, the daemon "
        "takes part in electing the leader, and schedules (and subscribes to Mesos) only while "
        "it leads; a leader that loses the lease exits with status 75 [default: none, the only "
        "daemon, always the leader].",
        show_default=False,
    )
    leader_lease_ttl_seconds: float = option(
        12.0,
        help="With a daemon id: how long the leader lease lasts on the database's clock unless "
        "renewed; a leader that cannot renew stops leading a fifth of it earlier.",
        min=0.1,
    )
    leader_lease_renew_seconds: float = option(
        4.0,
        help="With a daemon id: how often the lease is renewed (and a follower asks for it); "
        "less than four fifths of the lease's time to live.",
        min=0.01,
    )
    # ---- security: TLS and identity (README "Security")
    # TLS on the gRPC API and /metrics; both files or neither.
    tls_cert_file: str = option(
        "",
        help="PEM certificate (chain) the gRPC API and /metrics serve TLS with [default: no TLS].",
        show_default=False,
    )
    tls_key_file: str = option("", help="PEM private key of tls_cert_file.", show_default=False)
    # Mutual TLS: every connection must show a certificate this CA signed (health included).
    tls_client_ca_file: str = option(
        "",
        help="PEM CA bundle; clients must show a certificate it signed (mutual TLS), whose "
        "subject CN is the user and OUs the groups [default: no client certificates].",
        show_default=False,
    )
    auth_tokens_file: str = option(
        "",
        help="YAML file of bearer tokens (their SHA-256) with each one's user and groups; "
        "re-read when it changes [default: none].",
        show_default=False,
    )
    jwt_issuer: str = option(
        "",
        help="Accept JWTs (OIDC ID or access tokens) from this issuer (iss) [default: none].",
        show_default=False,
    )
    jwt_audience: str = option(
        "", help="The audience (aud) JWTs must name; required with jwt_issuer.", show_default=False
    )
    jwt_jwks_url: str = option(
        "",
        help="URL of the issuer's JWKS (fetched in the background and refreshed); or "
        "jwt_keys_file.",
        show_default=False,
    )
    jwt_keys_file: str = option(
        "",
        help="Local JWKS (JSON) or PEM public key that JWTs are verified with.",
        show_default=False,
    )
    jwt_jwks_refresh_seconds: float = option(
        300.0, help="How often jwt_jwks_url is fetched again (key rotation).", min=1
    )
    jwt_user_claim: str = option("sub", help="JWT claim that names the user.")
    jwt_groups_claim: str = option("groups", help="JWT claim that lists the user's groups.")
    reflection_open: bool = option(
        False,
        help="With authentication on: serve gRPC reflection to anyone (else not at all). "
        "Without authentication reflection is always served.",
    )
    allow_anonymous: bool = option(
        False,
        help="Serve without authentication on an address other than loopback (refused otherwise).",
    )
    # ---- security: authorization
    # Admin on every pool and on the cluster (hosts, top-level pools, the audit trail); other
    # callers have what pool grants give them (README "Pools and permissions").
    admins: str = option(
        "",
        help="Cluster admins: comma-separated user:NAME and group:NAME (user:ops,group:sre) "
        "[default: none].",
        show_default=False,
    )
    # ---- security: run-as users
    # Who may run tasks as which Unix user (JobSpec.user); empty: anyone as anyone, as Mesos
    # without a run_tasks ACL. Re-read when it changes.
    run_as_file: str = option(
        "",
        help="YAML allow-list of the Unix users each caller may run tasks as "
        "[default: none, any user is allowed].",
        show_default=False,
    )
    # ---- end of security

    def __post_init__(self) -> None:
        # A config file gives strings; the rest of peloton wants a Path.
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        try:
            parse_image(self.runtime_image)
        except ValueError as exc:
            raise InvalidArgument("runtime_image", str(exc)) from None
        try:
            LeaseTiming(self.leader_lease_ttl_seconds, self.leader_lease_renew_seconds)
        except ValueError as exc:
            raise InvalidArgument("leader_lease_renew_seconds", str(exc)) from None
        parse_admins(self.admins)  # InvalidArgument names the entry: admins[i]

    @property
    def admin_principals(self) -> frozenset[Principal]:
        """The cluster admins the ``admins`` option names."""
        return parse_admins(self.admins)

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

    @property
    def leader_lease_timing(self) -> LeaseTiming:
        return LeaseTiming(self.leader_lease_ttl_seconds, self.leader_lease_renew_seconds)

    def mesos_values(self) -> dict[str, Any]:
        """The options that set a MesosSettings field, by that field's name."""
        return {
            flag.mesos: getattr(self, f.name)
            for f in fields(self)
            if (flag := f.metadata["flag"]).mesos
        }


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
