"""The console assembled from the daemon's components (called by :class:`peloton.server.Server`)."""

from __future__ import annotations

from collections.abc import Callable

from peloton.api.audit import AuditTrail
from peloton.api.authz import Authorizer
from peloton.api.host_service import HostService
from peloton.api.job_service import JobService
from peloton.config import ServerConfig
from peloton.console.api import Api
from peloton.console.feed import Feed
from peloton.console.follow import OthersWrites
from peloton.console.metrics import ConsoleMetrics
from peloton.console.sources import GpuReports, Sources
from peloton.console.web import ConsoleServer
from peloton.errors import InvalidArgument
from peloton.hostmgr.hosts import HostRegistry
from peloton.jobmgr.manager import JobManager
from peloton.metrics import Metrics
from peloton.resmgr.manager import ResourceManager
from peloton.security.edge import EdgeSecurity
from peloton.security.loopback import is_loopback
from peloton.storage.db import Database


def check_exposure(config: ServerConfig) -> None:
    """The gRPC API's rules for an address (:func:`peloton.security.edge.check_exposure`) for
    the console's: off loopback, no bearer tokens in clear text and no anonymous callers unless
    ``allow_anonymous`` says so. InvalidArgument names ``console_host``."""
    host = config.console_host
    if not config.console_enabled or is_loopback(host):
        return
    if (config.auth_tokens_file or config.jwt_issuer) and not config.tls_cert_file:
        raise InvalidArgument(
            "console_host",
            f"bearer tokens would cross the network in clear text to {host}: set tls_cert_file "
            "and tls_key_file, or bind a loopback console_host",
        )
    authenticated = config.tls_client_ca_file or config.auth_tokens_file or config.jwt_issuer
    if not authenticated and not config.allow_anonymous:
        raise InvalidArgument(
            "console_host",
            f"refusing to serve the console on {host} without authentication: set "
            "auth_tokens_file, jwt_issuer or tls_client_ca_file, or allow_anonymous: true",
        )


def build_console(
    config: ServerConfig,
    security: EdgeSecurity,
    metrics: Metrics,
    *,
    jobs: JobManager,
    resmgr: ResourceManager,
    registry: HostRegistry,
    hosts: Callable[[], HostRegistry],
    authz: Authorizer,
    audit: AuditTrail | None,
    job_service: JobService,
    host_service: HostService,
    leads: Callable[[], bool],
    db: Database,
) -> ConsoleServer:
    """The console of one daemon, not yet listening: ``registry`` is the daemon's own host
    registry (watched for changes), ``hosts`` what answers host reads now (the leader's
    registry, or the database's view on a daemon that does not lead)."""
    feed = Feed()
    jobs.events.subscribe(feed.job_changed)
    reports = GpuReports(host_service, reported=lambda: feed.publish(("cluster",)))
    sources = Sources(jobs, resmgr, hosts, reports, db)
    api = Api(
        sources,
        authz=authz,
        jobs=job_service,
        hosts=host_service,
        authenticator=security.authenticator,
        audit=audit,
        metrics=ConsoleMetrics(metrics.registry),
        leads=leads,
        generation=feed.generation,
        changed=feed.publish,
        daemon_id=config.daemon_id,
    )
    # The API's certificate and client CA (the metrics endpoint serves with them too).
    tls = security.metrics_tls()
    return ConsoleServer(
        api,
        feed,
        hosts_fingerprint=lambda: [(v.record, v.used) for v in registry.list()],
        workers=(
            reports,
            OthersWrites(
                changes=jobs.jobs_changed_after,
                newest=jobs.newest_event,
                leads=leads,
                changed=feed.job_changed,
            ),
        ),
        certfile=tls.get("certfile", ""),
        keyfile=tls.get("keyfile", ""),
        client_cafile=tls.get("client_cafile", ""),
    )
