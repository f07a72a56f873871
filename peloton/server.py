"""The peloton daemon: gRPC API, Prometheus endpoint and the components behind them."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

import grpc
from grpc_health.v1 import health_pb2
from sqlalchemy.engine import make_url

from peloton.api.audit import AuditMetrics, AuditService, AuditTrail
from peloton.api.authz import Authorizer, AuthzMetrics
from peloton.api.grpc_server import GrpcServer, ServingStatus
from peloton.api.host_service import HostService
from peloton.api.job_service import JobService
from peloton.api.pool_service import PoolService
from peloton.api.sweep_service import SweepService
from peloton.api.watches import WatchQuotas
from peloton.config import ServerConfig
from peloton.console.build import build_console
from peloton.console.build import check_exposure as check_console_exposure
from peloton.console.web import ConsoleServer
from peloton.core.states import JobState, TaskState
from peloton.elastic.endpoints import Endpoints, default_host
from peloton.elastic.metrics import ElasticMetrics
from peloton.errors import FailedPrecondition, Unavailable
from peloton.ha.elector import Elector
from peloton.ha.fence import LeaderFence
from peloton.ha.kills import LeaderKills
from peloton.ha.metrics import LeaderMetrics
from peloton.ha.sync import Sync
from peloton.hostmgr.hosts import HostRegistry
from peloton.jobmgr.expiry import ExpiryTimer
from peloton.jobmgr.manager import JobManager
from peloton.jobmgr.metrics import JobMetrics
from peloton.metrics import Metrics, StateCounts
from peloton.resmgr.admission import NO_HOSTS_YET
from peloton.resmgr.manager import ResourceManager
from peloton.resmgr.metrics import ResmgrMetrics
from peloton.security.edge import EdgeSecurity
from peloton.security.runas import RunAsMetrics, run_as_policy
from peloton.storage import jobs as job_repo
from peloton.storage import migrate
from peloton.storage.db import Database, make_engine
from peloton.storage.hosts import SqlHostStore
from peloton.storage.leases import (
    SqlLeaseStore,
    end_idle_transactions,
    require_shared_database,
)
from peloton.storage.pools import SqlPoolStore
from peloton.storage.probe import DatabaseProbe
from peloton.storage.sweeps import trials_by_state
from peloton.sweep.controller import SweepController, searchers
from peloton.sweep.metrics import SweepMetrics
from peloton.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    host_pb2,
    host_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    pool_pb2,
    pool_pb2_grpc,
    sweep_pb2,
    sweep_pb2_grpc,
)

if TYPE_CHECKING:  # pymesos is imported only when a Mesos master is configured
    from peloton.hostmgr.framework import HostManager
    from peloton.placement.launcher import Launcher

log = logging.getLogger(__name__)

# Write transactions the launcher, and the host manager, run at once on PostgreSQL: a launch
# mostly waits on round trips (its transaction, then its ACCEPTs), so more of them overlap more
# waiting (bench_e2e, 10,000 tasks: 4 -> 8 gave 479-503 -> 559-615 tasks/s, alternated).
CONCURRENT_WRITERS = 8
# How often a daemon of several reads what the others wrote (at most: the lease renewal, if
# shorter): jobs sent through a follower wait this long at most for the leader to see them.
SYNC_SECONDS = 1.0
# On shutdown, the components' last database work gets this long; then it is aborted.
DATABASE_STOP_SECONDS = 2.0
# How late, at worst, the daemon notices a SIGTERM or SIGINT that landed on another thread.
SIGNAL_POLL_SECONDS = 0.5
SERVICE_NAMES = (
    job_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
    sweep_pb2.DESCRIPTOR.services_by_name["SweepService"].full_name,
    pool_pb2.DESCRIPTOR.services_by_name["PoolService"].full_name,
    host_pb2.DESCRIPTOR.services_by_name["HostService"].full_name,
    audit_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name,
)


# The exit status of a leader that lost its lease (EX_TEMPFAIL): its supervisor starts it again,
# as a follower (see Server._deposed).
DEPOSED_EXIT = 75


# The pending reason of every gang of a daemon that has no Mesos master to launch on.
NO_MASTER = f"{NO_HOSTS_YET}: no Mesos master is configured (--mesos-master), nothing launches"


# Objects allocated before the cyclic collector runs again (Python's default: 700). The daemon
# allocates many short-lived objects per task (rows, events, messages), nearly all freed by
# reference counting; at the default the collector ran over them many times per gang (with it:
# ~6 % of the daemon's CPU in bench_e2e).
GC_YOUNG_THRESHOLD = 50_000


def _tune_gc() -> None:
    """Move what start-up made (modules, the spec pools, the servers) out of the collector's
    way, and let the young generation grow before a collection (once the daemon serves: the
    full collection first pauses every thread, for a moment)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def require_leader(leads: Callable[[], bool], what: str) -> None:
    """Refuse a change that only the leader's in-memory state may take (several daemons)."""
    if not leads():
        raise FailedPrecondition(
            f"this daemon does not lead: {what} through the leader "
            "(`peloton cluster status` names it)"
        )


class LeaderPoolService(PoolService):
    """Pools change only through the leader, whose resource manager decides with them at once,
    and are read there: their entitlements, allocations and demand are the leader's cycles'
    (a follower re-reads the pools the leader writes, for the jobs it takes, and runs none)."""

    def __init__(
        self, resmgr: ResourceManager, authz: Authorizer, leads: Callable[[], bool]
    ) -> None:
        super().__init__(resmgr, authz)
        self._leads = leads

    def CreatePool(
        self, request: pool_pb2.CreatePoolRequest, context: grpc.ServicerContext
    ) -> pool_pb2.CreatePoolResponse:
        require_leader(self._leads, "change pools")
        return super().CreatePool(request, context)

    def UpdatePool(
        self, request: pool_pb2.UpdatePoolRequest, context: grpc.ServicerContext
    ) -> pool_pb2.UpdatePoolResponse:
        require_leader(self._leads, "change pools")
        return super().UpdatePool(request, context)

    def DeletePool(
        self, request: pool_pb2.DeletePoolRequest, context: grpc.ServicerContext
    ) -> pool_pb2.DeletePoolResponse:
        require_leader(self._leads, "change pools")
        return super().DeletePool(request, context)

    def GetPool(
        self, request: pool_pb2.GetPoolRequest, context: grpc.ServicerContext
    ) -> pool_pb2.GetPoolResponse:
        require_leader(self._leads, "read pools")
        return super().GetPool(request, context)

    def ListPools(
        self, request: pool_pb2.ListPoolsRequest, context: grpc.ServicerContext
    ) -> pool_pb2.ListPoolsResponse:
        require_leader(self._leads, "read pools")
        return super().ListPools(request, context)


class LeaderHostService(HostService):
    """Hosts drain only through the leader, whose host registry places tasks; a follower
    answers reads from the database (its own registry is what the database held when it
    started: Mesos tells only the leader)."""

    def __init__(
        self,
        hosts: HostRegistry,
        jobs: JobManager,
        authz: Authorizer,
        hostmgr: HostManager | None,
        leads: Callable[[], bool],
        stored: Callable[[], HostRegistry],
    ) -> None:
        super().__init__(hosts, jobs, authz, hostmgr)
        self._leads = leads
        self._stored = stored

    def _reads(self) -> HostService:
        """What answers host reads: the leader's registry, or the database's view."""
        if self._leads():
            return HostService(self._hosts, self._jobs, self._authz, self._hostmgr)
        return HostService(self._stored(), self._jobs, self._authz)

    def ListHosts(
        self, request: host_pb2.ListHostsRequest, context: grpc.ServicerContext
    ) -> host_pb2.ListHostsResponse:
        return self._reads().ListHosts(request, context)

    def GetHost(
        self, request: host_pb2.GetHostRequest, context: grpc.ServicerContext
    ) -> host_pb2.GetHostResponse:
        return self._reads().GetHost(request, context)

    def DrainHost(
        self, request: host_pb2.DrainHostRequest, context: grpc.ServicerContext
    ) -> host_pb2.DrainHostResponse:
        require_leader(self._leads, "drain hosts")
        return super().DrainHost(request, context)

    def UndrainHost(
        self, request: host_pb2.UndrainHostRequest, context: grpc.ServicerContext
    ) -> host_pb2.UndrainHostResponse:
        require_leader(self._leads, "undrain hosts")
        return super().UndrainHost(request, context)


class Server:
    """One daemon: start() binds the ports and returns; stop() shuts down gracefully."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.db: Database | None = None
        self.jobs: JobManager | None = None
        self.expiry: ExpiryTimer | None = None
        self.resmgr: ResourceManager | None = None
        self.hosts: HostRegistry | None = None
        self.hostmgr: HostManager | None = None
        self.launcher: Launcher | None = None
        self.elastic: Endpoints | None = None
        self.sweeps: SweepController | None = None
        self.grpc_port = 0
        self.metrics_port = 0
        self.console_port = 0  # 0: no console served
        self._console: ConsoleServer | None = None
        self._grpc: GrpcServer | None = None
        self._probe: DatabaseProbe | None = None
        self._metrics_http: object | None = None
        self._security: EdgeSecurity | None = None
        self._elector: Elector | None = None
        self._sync: Sync | None = None
        self._kills: LeaderKills | None = None
        self._lease_db: Database | None = None
        # start() and stop() against a takeover that starts the scheduling components.
        self._lifecycle = threading.Lock()
        self._leader_metrics = LeaderMetrics(self.metrics.registry, self.leads)
        self._stopped = threading.Event()
        self._started = False  # start() finished: there is a running daemon to log about

    def start(self) -> None:
        # Checked first: an exposed daemon without authentication, or a certificate, key or
        # tokens file it cannot use, stops it before it opens anything.
        self._security = security = EdgeSecurity.from_config(self.config, self.metrics.registry)
        check_console_exposure(self.config)
        # Read first: a run-as file that breaks a rule stops the daemon before it opens anything.
        run_as = run_as_policy(self.config.run_as_file, RunAsMetrics(self.metrics.registry))
        url = self.config.database_url
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        db = Database.from_url(url, self.config.db_timeouts)
        try:
            migrate.ensure_current(db.engine, make_url(url).render_as_string(hide_password=True))
            if self.config.daemon_id:
                require_shared_database(db)
                # A healthy daemon's transaction never idles half a lease between statements; one
                # paused inside a transaction delays its successor by that much at most.
                end_idle_transactions(db, self.config.leader_lease_ttl_seconds / 2)
        except Exception:
            db.dispose()
            raise
        self.db = db
        self.jobs = JobManager(db, metrics=JobMetrics(self.metrics.registry))
        self.expiry = ExpiryTimer(self.jobs)
        self.resmgr = ResourceManager(
            SqlPoolStore(db),
            self.jobs,
            metrics=ResmgrMetrics(self.metrics.registry),
            no_hosts=NO_HOSTS_YET if self.config.mesos_master else NO_MASTER,
        )
        self.jobs.set_scheduler(self.resmgr)
        self.elastic = Endpoints(
            self.jobs,
            self.jobs.events,
            default_host(self.config.rendezvous_host, self.config.grpc_host),
            ElasticMetrics(self.metrics.registry),
        )
        self.jobs.set_elastic(self.elastic)
        self.jobs.events.subscribe(self.elastic.job_changed)
        self._build_hosts(db, self.jobs, self.resmgr)
        self._register_state_gauges(db)

        audit = AuditTrail(db, AuditMetrics(self.metrics.registry), self.config.daemon_id)
        self._grpc = GrpcServer(
            self.metrics,
            self.config.grpc_workers,
            WatchQuotas(self.config.max_watches, self.config.max_watches_per_client),
            self.jobs.jobs_changed_after,
            self.jobs.newest_event,
            authenticate=security.authenticator,
            audit=audit,
        )
        self.jobs.events.subscribe(self._grpc.watches.publish)
        server = self._grpc.server
        # Every daemon of several decides from the pool tree it serves (re-read from the
        # database as the leader changes it).
        authz = Authorizer(
            self.config.admin_principals, self.resmgr.pool_tree, AuthzMetrics(self.metrics.registry)
        )
        job_service = JobService(self.jobs, self._grpc.watches, run_as, authz=authz)
        job_pb2_grpc.add_JobServiceServicer_to_server(job_service, server)
        pools = (
            LeaderPoolService(self.resmgr, authz, self.leads)
            if self.config.daemon_id
            else PoolService(self.resmgr, authz)
        )
        pool_pb2_grpc.add_PoolServiceServicer_to_server(pools, server)
        assert self.hosts is not None
        hosts = (
            LeaderHostService(
                self.hosts,
                self.jobs,
                authz,
                self.hostmgr,
                self.leads,
                self._stored_hosts,
            )
            if self.config.daemon_id
            else HostService(self.hosts, self.jobs, authz, self.hostmgr)
        )
        host_pb2_grpc.add_HostServiceServicer_to_server(hosts, server)
        audit_pb2_grpc.add_AuditServiceServicer_to_server(AuditService(db, authz), server)
        # ---- sweeps (README "Sweeps"): the leader's controller runs them (_start_scheduling).
        self.sweeps = self._build_sweeps(db, self.jobs, self.resmgr)
        sweep_pb2_grpc.add_SweepServiceServicer_to_server(
            SweepService(db, self.sweeps, authz, run_as, self.resmgr.check_pool), server
        )
        # ---- end sweeps
        address = f"{self.config.grpc_host}:{self.config.grpc_port}"
        self.grpc_port = self._grpc.bind(
            address, SERVICE_NAMES, security.grpc_credentials, security.serve_reflection
        )
        metrics_address = f"{self.config.metrics_host}:{self.config.metrics_port}"
        try:
            http = self.metrics.serve(
                self.config.metrics_host, self.config.metrics_port, **security.metrics_tls()
            )
        except OSError as exc:
            raise Unavailable(f"cannot listen on {metrics_address}: {exc.strerror}") from exc
        self._metrics_http = http
        self.metrics_port = http.server_port
        if self.config.console_enabled:
            self._start_console(self._build_console(security, authz, audit, job_service, hosts))

        # Both ports are ours: rebuild the scheduling state, then take requests. With several
        # daemons only the leader schedules, from when it leads (_take_over); until then this
        # one serves the API, and checks new jobs' pools against the stored tree.
        if self.config.daemon_id:
            self.resmgr.load_pools()
        else:
            self._start_scheduling()
        security.start()
        self._grpc.start()
        self._set_health(health_pb2.HealthCheckResponse.SERVING)
        if self.config.daemon_id:
            self._start_election(url)
        self._probe = DatabaseProbe(
            url, self.config.db_timeouts, self.config.db_probe_interval_seconds, self._on_probe
        )
        self._probe.start()
        self._started = True
        log.info(
            "peloton server started",
            extra={
                "grpc": f"{self.config.grpc_host}:{self.grpc_port}",
                "metrics": f"{self.config.metrics_host}:{self.metrics_port}",
                "console": self.console_address,
                "database": db.dialect,
            },
        )
        if not self.config.mesos_master:
            log.warning("no Mesos master configured (mesos_master): jobs wait, nothing launches")

    def _build_console(
        self,
        security: EdgeSecurity,
        authz: Authorizer,
        audit: AuditTrail,
        job_service: JobService,
        host_service: HostService,
    ) -> ConsoleServer:
        assert self.db is not None and self.jobs is not None and self.resmgr is not None
        assert self.hosts is not None
        registry = self.hosts

        def hosts() -> HostRegistry:
            # As the host API answers: a daemon that does not lead reads what the leader wrote.
            return registry if self.leads() else self._stored_hosts()

        return build_console(
            self.config,
            security,
            self.metrics,
            jobs=self.jobs,
            resmgr=self.resmgr,
            registry=registry,
            hosts=hosts,
            authz=authz,
            audit=audit,
            job_service=job_service,
            host_service=host_service,
            leads=self.leads,
            db=self.db,
        )

    def _stored_hosts(self) -> HostRegistry:
        """The hosts and what tasks hold on them as the database has them now (what a daemon
        that does not lead answers with: Mesos tells only the leader)."""
        assert self.db is not None
        return HostRegistry.as_stored(SqlHostStore(self.db), lambda: datetime.now(UTC))

    @property
    def console_address(self) -> str | None:
        """The console's URL (None: none is served)."""
        if self._console is None or not self.console_port:
            return None
        return f"{self._console.scheme}://{self.config.console_host}:{self.console_port}"

    def _start_console(self, console: ConsoleServer) -> None:
        """Serve the console (its port is the daemon's as the metrics port is: one that cannot
        be had stops the daemon, in one line)."""
        c = self.config
        try:
            self.console_port = console.start(c.console_host, c.console_port)
        except OSError as exc:
            address = f"{c.console_host}:{c.console_port}"
            raise Unavailable(f"cannot listen on {address}: {exc.strerror}") from exc
        self._console = console

    def leads(self) -> bool:
        """Whether this daemon is the leader now: always without a daemon id (the only one)."""
        return self._elector is None or self._elector.leads()

    def _start_scheduling(self) -> None:
        """Rebuild the scheduling state from the database and start what decides and launches:
        at start for the only daemon, on taking the lease over for one of several."""
        assert self.resmgr is not None and self.expiry is not None
        self.resmgr.load()  # also sends placements the previous daemon left unlaunched back
        self.resmgr.start()
        self.expiry.start()
        if self.sweeps is not None:
            self.sweeps.start()
        if self.hostmgr is not None and self.launcher is not None:
            self.hostmgr.start()  # subscribes under the stored framework id: tasks run on
            self.launcher.start()

    def _start_election(self, url: str) -> None:
        """Take part in electing the leader among the daemons on this database: schedule from
        when this daemon leads, exit when it stops leading (see _deposed)."""
        c = self.config
        assert self.jobs is not None and self.resmgr is not None
        # One connection of its own: a pool exhausted by RPCs must not cost the lease.
        self._lease_db = Database(
            make_engine(url, pool_size=1, timeouts=c.db_timeouts), c.db_timeouts
        )
        store = SqlLeaseStore(self._lease_db, c.daemon_id)
        address = f"{c.grpc_host}:{self.grpc_port}"
        self._elector = Elector(
            store,
            address,
            c.leader_lease_timing,
            self._leader_metrics,
            on_change=self._on_leadership,
        )
        self.jobs.set_fence(LeaderFence(self._elector, c.daemon_id))
        self._sync = Sync(
            changes=self.jobs.jobs_changed_after,
            newest=self.jobs.newest_event,
            leads=self.leads,
            on_jobs=self._jobs_written,
            on_pools=self.resmgr.load_pools,
            interval=min(c.leader_lease_renew_seconds, SYNC_SECONDS),
        )
        self._sync.start()
        self._elector.start()

    def _jobs_written(self, job_ids: set[str]) -> None:
        """Jobs written by any daemon, polled on the leader: schedule them, and send the kills
        written through the others."""
        assert self.resmgr is not None
        for job_id in job_ids:
            self.resmgr.job_changed(job_id)
        if self._kills is not None:
            self._kills.jobs_changed(job_ids)

    def _on_leadership(self, leads: bool) -> None:
        """The election's thread saw this daemon become the leader or stop being it."""
        if leads:
            # Loading may take long: not on the election's thread, which must renew meanwhile.
            threading.Thread(target=self._take_over, name="take-over", daemon=True).start()
        else:
            self._deposed()

    def _take_over(self) -> None:
        """This daemon leads now: start scheduling, unless it is stopping."""
        with self._lifecycle:
            if self._stopped.is_set():
                return
            try:
                self._start_scheduling()
            except Exception:
                log.exception("the new leader could not start scheduling")
                self._exit()
            log.info("this daemon schedules now")

    def _deposed(self) -> None:
        """The term ended (on this daemon's clock) or a renewal was refused: stop scheduling at
        once. Decisions in flight on several threads (a cycle, launches, status updates) cannot
        all be stopped cleanly in place; exiting does, and the supervisor starts a follower.
        The fence already refuses this daemon's scheduling writes and launches meanwhile."""
        if self._stopped.is_set():
            return  # a graceful stop, which gives the lease up itself
        log.critical(
            "this daemon lost the leader lease: exiting so that its supervisor restarts it as "
            "a follower",
            extra={"exit_status": DEPOSED_EXIT},
        )
        self._exit()

    @staticmethod
    def _exit() -> NoReturn:
        """Exit now, without running anything else (no atexit, no thread joins)."""
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(DEPOSED_EXIT)

    def _set_health(self, status: ServingStatus) -> None:
        assert self._grpc is not None
        self._grpc.set_health(("", *SERVICE_NAMES), status)

    def _on_probe(self, reason: str) -> None:
        """The database stopped or started answering the probe (``reason``: why not)."""
        assert self.db is not None
        self.db.set_unreachable(reason)
        serving = health_pb2.HealthCheckResponse.SERVING
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING if reason else serving)

    def _build_hosts(self, db: Database, jobs: JobManager, resmgr: ResourceManager) -> None:
        """The host registry; with a Mesos master also the framework and the launcher (started
        once the API is up)."""
        store = SqlHostStore(db)
        c = self.config
        if not c.mesos_master:
            self.hosts = HostRegistry(store, lambda: datetime.now(UTC))
            return
        from peloton.hostmgr.framework import HostManager, MesosSettings
        from peloton.hostmgr.metrics import HostmgrMetrics
        from peloton.placement.check import HostsCheck
        from peloton.placement.launcher import Launcher
        from peloton.placement.metrics import PlacementMetrics

        settings = MesosSettings.from_config(c)
        # PostgreSQL takes writers of different jobs at once (their waits then overlap); SQLite
        # has one writer at a time, and queued writers poll for the lock.
        writers = 1 if db.dialect == "sqlite" else CONCURRENT_WRITERS
        self.hostmgr = HostManager(
            settings,
            jobs,
            store,
            HostmgrMetrics(self.metrics.registry),
            on_capacity=resmgr.set_capacity,
            writers=writers,
        )
        self.hosts = self.hostmgr.hosts
        if c.daemon_id:
            self._kills = LeaderKills(self.hostmgr, jobs, self.leads)
        jobs.set_killer(self._kills or self.hostmgr)
        self.launcher = Launcher(
            resmgr,
            self.hostmgr,
            jobs,
            metrics=PlacementMetrics(self.metrics.registry),
            workers=writers,
            rendezvous=self.elastic,
            leads=self.leads if c.daemon_id else None,
        )
        self.hostmgr.add_offer_listener(self.launcher.wake)
        resmgr.add_admission_listener(self.launcher.wake)
        resmgr.set_placement(HostsCheck(self.hostmgr))

    def _build_sweeps(
        self, db: Database, jobs: JobManager, resmgr: ResourceManager
    ) -> SweepController:
        """The sweep controller (started with scheduling), growing elastic trials through the
        resource manager's growth policy."""

        def trials() -> dict[str, int]:
            with db.reading() as session:
                return trials_by_state(session)

        host = default_host(self.config.rendezvous_host, self.config.grpc_host)
        controller = SweepController(
            db,
            jobs,
            lambda: f"{host}:{self.grpc_port}",
            searchers(self.config.database_url),
            SweepMetrics(self.metrics.registry, trials),
            grown=resmgr.job_changed,
            server_tls=bool(self.config.tls_cert_file),
        )
        resmgr.set_growth_policy(controller.growth_limit)
        return controller

    def _register_state_gauges(self, db: Database) -> None:
        def jobs() -> dict[str, int]:
            with db.reading() as session:
                return job_repo.count_jobs_by_state(session)

        def tasks() -> dict[str, int]:
            with db.reading() as session:
                return job_repo.count_tasks_by_state(session)

        self.metrics.add_collector(
            StateCounts("peloton_jobs", "Jobs by state.", jobs, [s.value for s in JobState])
        )
        self.metrics.add_collector(
            StateCounts("peloton_tasks", "Tasks by state.", tasks, [s.value for s in TaskState])
        )

    def stop(self, grace: float | None = None) -> None:
        """Stop taking RPCs, let in-flight ones finish within ``grace`` seconds, release all."""
        with self._lifecycle:  # a takeover starting the components finishes first
            if self._stopped.is_set():
                return
            self._stopped.set()
        grace = self.config.shutdown_grace_seconds if grace is None else grace
        # After a failed start() this only releases what was acquired; the caller reports why,
        # in one line, and "stopping" would only suggest the daemon had run.
        started = self._started
        if started:
            log.info("peloton server stopping", extra={"grace_seconds": grace})
        if self.jobs is not None:
            self.jobs.events.close()
        if self._sync is not None:
            self._sync.stop()
        if self._elector is not None:
            # Releases the lease: another daemon takes over at once (this one's launches and
            # scheduling writes are fenced from now on).
            self._elector.stop()
        if self._lease_db is not None:
            self._lease_db.dispose()
        if self._console is not None:
            self._console.stop()  # ends its event streams
        if self._grpc is not None:
            # Ends the watches; RPCs still running after grace are cancelled, and their
            # queries with them.
            self._grpc.stop(grace)
        if self._security is not None:
            self._security.stop()
        if self._probe is not None:
            self._probe.stop()
        if self.db is not None:
            # Bounds the components' last database work, so their threads all end.
            self.db.close_within(DATABASE_STOP_SECONDS)
        if self.launcher is not None:
            self.launcher.stop()
        if self.hostmgr is not None:
            self.hostmgr.stop()  # without TEARDOWN: the tasks run on for the next daemon
        if self.expiry is not None:
            self.expiry.stop()
        if self.sweeps is not None:
            self.sweeps.stop()
        if self.resmgr is not None:
            self.resmgr.stop()
        if self.elastic is not None:
            self.elastic.close()
        http = self._metrics_http
        if http is not None:
            http.shutdown()  # type: ignore[attr-defined]
            http.server_close()  # type: ignore[attr-defined]
        if self.db is not None:
            self.db.dispose()
        if started:
            log.info("peloton server stopped")

    def wait(self) -> None:
        self._stopped.wait()

    def run_until_signalled(self) -> None:
        """Serve until SIGTERM or SIGINT, then shut down gracefully."""
        stop_requested = threading.Event()

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("signal received", extra={"signal": signal.Signals(signum).name})
            stop_requested.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        # The process is the daemon's alone (not so for a server a test runs in its own
        # process, whose collector this leaves as it is).
        _tune_gc()
        # The kernel may hand the signal to any of our threads; Python then runs the handler
        # only once the main thread runs bytecode, and a wait without a timeout would sleep
        # through it until something else woke it. Waking every SIGNAL_POLL_SECONDS bounds that.
        while not stop_requested.wait(SIGNAL_POLL_SECONDS):
            pass
        self.stop()
