"""The minicluster: a local Mesos master (v1 scheduler HTTP API) with agents, in this process.

from peloton.minicluster import Minicluster, AgentSpec

with Minicluster(AgentSpec.uniform(2), work_dir=tmp) as mc:
    ...  # a framework subscribes to mc.address ("127.0.0.1:PORT")
    mc.wait_until(lambda: any(t.state == "TASK_RUNNING" for t in mc.tasks()), 10)
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from peloton.minicluster.agent import ProcessRunner, SimulatedRunner, TaskDuration
from peloton.minicluster.containers import Containerizer
from peloton.minicluster.http import AgentServer, MasterServer
from peloton.minicluster.images import ImageStore
from peloton.minicluster.master import FrameworkView, Master, Runner, TaskView
from peloton.minicluster.resources import format_ranges, normalize_ranges, parse_text, range_count
from peloton.minicluster.spec import AgentSpec
from peloton.minicluster.timers import Timers

log = logging.getLogger(__name__)

# A Mesos agent's default port: each real agent on its own loopback address listens on it there.
AGENT_PORT = 5051
# Loopback addresses an agent tries before it settles for a kernel-picked port.
AGENT_ADDRESS_TRIES = 1000


class Minicluster:
    """A Mesos 1.11-compatible master with agents that run tasks as real processes (or, with
    ``simulated=True``, on a clock: no processes, 10,000 agents are fine).

    ``port=0`` picks a free port. Real mode keeps sandboxes under ``work_dir`` (a temporary
    directory, removed on stop, if not given). With the default ``host`` 127.0.0.1, each real
    agent gets its own loopback address (127.0.1.1, 127.0.1.2, ...; Linux routes all of
    127.0.0.0/8 to this machine), which its offers carry and its HTTP server listens on (at
    port 5051, as a Mesos agent does): tasks on different agents may then use the same ports,
    as on separate machines. An address another minicluster's agent listens on is skipped, so
    clusters side by side never offer their tasks the same address and port.
    ``allocation_interval`` is how often free resources are re-offered (Mesos: 1 s);
    ``update_retry_interval`` is the first re-send delay of an unacknowledged status update
    (Mesos agents: 10 s, doubling).

    ``free_ports=True`` (real agents on their own loopback addresses): each agent offers as
    many ports as its spec names, but ones the kernel hands out on its address, and holds them
    (bound, not listening, with SO_REUSEADDR) while it lives. No other program on the machine
    can take them (another minicluster on the same addresses, a connection's ephemeral port),
    while a task that binds one with SO_REUSEADDR can listen on it. For tests beside others.

    As Mesos 1.11 does: agents may share a hostname (each has its own agent id and work dir
    ``agents/HOST``, ``agents/HOST.2``, ...; methods that take an agent take its id, or a
    hostname no other agent shares). Agent resources may be statically reserved for a role
    (``gpus(gpu):2``): a framework is offered the unreserved ones and those of its role, and
    must launch naming them as offered. Agents act as with ``--switch_user``: a framework user
    that is empty or unknown on this machine gets every task dropped (TASK_DROPPED,
    REASON_EXECUTOR_TERMINATED); run as root, tasks run as the framework's user (a command
    task's CommandInfo.user if set) in sandboxes it owns.

    ``docker_registry``: a directory of ``docker save`` archives (``NAME.tar``, as a Mesos agent's
    ``--docker_registry`` with ``--image_providers=docker``): a task whose ContainerInfo names an
    image runs in a container of it (see :mod:`peloton.minicluster.containers`; real agents run
    as root only). Layers are extracted once, into ``work_dir/store/docker``, for every agent.
    Without it, a task with an image fails (TASK_FAILED, "Unsupported container image type").

    ``credentials`` (secrets by principal, e.g. from :func:`~peloton.minicluster.http.
    read_credentials`): framework authentication, as a master with
    ``--authenticate_http_frameworks --http_framework_authenticators=basic --credentials=FILE``.
    Every request to the scheduler endpoint must then authenticate with HTTP Basic (else 401, with
    ``WWW-Authenticate: Basic realm="mesos-master-scheduler"``), and a framework's principal must
    be the authenticated one (else 400).
    """

    def __init__(
        self,
        agents: Sequence[AgentSpec] = (),
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        work_dir: str | Path | None = None,
        simulated: bool = False,
        heartbeat_interval: float = 15.0,
        allocation_interval: float = 1.0,
        update_retry_interval: float = 10.0,
        task_duration: TaskDuration | None = None,
        free_ports: bool = False,
        docker_registry: Path | None = None,
        credentials: Mapping[str, str] | None = None,
    ) -> None:
        self._specs = list(agents)
        self._credentials = dict(credentials) if credentials is not None else None
        self._registry = docker_registry
        self._port = port
        self._host = host
        self._work_dir = Path(work_dir) if work_dir is not None else None
        self._own_work_dir = False
        self.simulated = simulated
        self._heartbeat = heartbeat_interval
        self._allocation = allocation_interval
        self._retry = update_retry_interval
        self._task_duration = task_duration
        self._timers: Timers | None = None
        self._master: Master | None = None
        self._runner: Runner | None = None
        self._server: MasterServer | None = None
        self._agent_servers: dict[str, AgentServer] = {}
        self._real_agents = 0  # real agents ever added: the next one's loopback address
        self._agent_dirs: set[Path] = set()
        self._free_ports = free_ports
        self._held_ports: dict[str, list[socket.socket]] = {}  # per agent id, with free_ports
        self._stop_lock = threading.Lock()
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Minicluster:
        """Start the master and the agents; returns self."""
        if self._master is not None:
            raise RuntimeError("minicluster already started")
        if not self.simulated and self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="minicluster-"))
            # Tasks that run as the framework's user reach their sandboxes through it.
            self._work_dir.chmod(0o755)
            self._own_work_dir = True
        self._timers = Timers(name="minicluster-timers")
        master = Master(
            self._timers,
            heartbeat_interval=self._heartbeat,
            allocation_interval=self._allocation,
            update_retry_interval=self._retry,
        )
        self._master = master
        runner: Runner = (
            SimulatedRunner(master, self._task_duration)
            if self.simulated
            else ProcessRunner(master, Containerizer(self._image_store()))
        )
        master.runner = self._runner = runner
        try:
            self._server = MasterServer(master, self._host, self._port, self._credentials)
            master.port = self._port = self._server.port
            for spec in self._specs:
                self.add_agent(spec)
        except BaseException:
            self.stop()
            raise
        log.info(
            "minicluster started",
            extra={"address": self.address, "agents": len(self._specs), "sim": self.simulated},
        )
        return self

    def _image_store(self) -> ImageStore | None:
        if self._registry is None:
            return None
        assert self._work_dir is not None
        return ImageStore(self._registry, self._work_dir / "store" / "docker")

    def stop(self) -> None:
        """Kill every task process, stop the servers and threads. Idempotent."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        if self._runner is not None:
            self._runner.stop()
        if self._master is not None:
            self._master.stop()
        if self._server is not None:
            self._server.stop()
        for server in self._agent_servers.values():
            server.stop()
        for held in self._held_ports.values():
            _release(held)
        if self._timers is not None:
            self._timers.stop()
        if self._own_work_dir and self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)

    def __enter__(self) -> Minicluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def master(self) -> Master:
        if self._master is None:
            raise RuntimeError("minicluster not started")
        return self._master

    @property
    def address(self) -> str:
        """The master's ``host:port`` (what ``--mesos-master`` takes)."""
        return f"{self._host}:{self.master.port}"

    @property
    def work_dir(self) -> Path | None:
        return self._work_dir

    # ------------------------------------------------------------------ agents and faults

    def add_agent(self, spec: AgentSpec) -> str:
        """Register a new agent; its id."""
        master = self.master
        if self.simulated or self._work_dir is None:
            return master.add_agent(spec, self._host, master.port, None).id
        directory = self._agent_dir(spec.hostname)
        ip, server = self._serve_agent(directory)
        held: list[socket.socket] = []
        try:
            if self._free_ports and ip != "127.0.0.1":
                spec, held = _with_free_ports(spec, ip)
        except BaseException:
            server.stop()
            raise
        try:
            agent = master.add_agent(spec, ip, server.port, directory)
        except BaseException:
            server.stop()
            _release(held)
            raise
        self._agent_servers[agent.id] = server
        self._held_ports[agent.id] = held
        return agent.id

    def _agent_dir(self, hostname: str) -> Path:
        """A new agent's work dir: ``agents/HOSTNAME``, or ``agents/HOSTNAME.2``, ... when
        other agents of this cluster share the hostname."""
        assert self._work_dir is not None
        base = self._work_dir / "agents" / hostname
        directory, n = base, 1
        while directory in self._agent_dirs:
            n += 1
            directory = base.with_name(f"{hostname}.{n}")
        self._agent_dirs.add(directory)
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def _serve_agent(self, directory: Path) -> tuple[str, AgentServer]:
        """A new real agent's address and HTTP server.

        On the default host each agent has its own loopback address and listens there on the
        Mesos agent port, which claims the address machine-wide: an address whose port another
        minicluster's agent holds is skipped. So clusters side by side (a user's and a test
        suite's, or two suites) never share an address, nor the ports their tasks are offered
        on it. Should that port be taken on every address (something listens on it on all
        interfaces), the agent listens on a port the kernel picks, as agents sharing a host do.
        """
        if self._host != "127.0.0.1":
            return self._host, AgentServer(directory, self._host)
        for _ in range(AGENT_ADDRESS_TRIES):
            ip = self._next_loopback()
            try:
                return ip, AgentServer(directory, ip, AGENT_PORT)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        ip = self._next_loopback()
        return ip, AgentServer(directory, ip)

    def _next_loopback(self) -> str:
        """The next loopback address for a real agent (127.0.1.1, 127.0.1.2, ...)."""
        n, self._real_agents = self._real_agents, self._real_agents + 1
        return f"127.0.{1 + n // 250 % 255}.{1 + n % 250}"

    def agent_ids(self, hostname: str | None = None) -> list[str]:
        """The ids of the registered agents (of ``hostname`` if given), oldest first."""
        with self.master.lock:
            agents = self.master.agents.values()
            return [a.id for a in agents if hostname is None or a.hostname == hostname]

    def agent_id(self, agent: str) -> str:
        """The id of the agent ``agent`` names: its hostname (when no other agent shares it) or
        its id. KeyError otherwise, naming the agents that share the hostname."""
        with self.master.lock:
            return self.master.find_agent(agent).id

    def agent_address(self, agent: str) -> str:
        """An agent's HTTP ``host:port`` (``/files/read`` is served there in real mode);
        ``agent`` is a hostname or an agent id, as for :meth:`agent_id`."""
        with self.master.lock:
            found = self.master.find_agent(agent)
            return f"{found.ip}:{found.port}"

    def kill_agent(self, agent: str) -> None:
        """The agent dies: its processes are killed, its offers rescinded, its tasks become
        UNREACHABLE (LOST to frameworks that are not partition-aware), frameworks get FAILURE.
        ``agent`` is a hostname or an agent id, as for :meth:`agent_id`."""
        master = self.master
        with master.lock:
            found = master.find_agent(agent)
            master.remove_agent(found, "the agent was killed")
        server = self._agent_servers.pop(found.id, None)
        if server is not None:
            server.stop()
        _release(self._held_ports.pop(found.id, []))

    def drop_connections(self) -> None:
        """Close every subscriber's event stream: frameworks must resubscribe."""
        master = self.master
        with master.lock:
            for fw in master.frameworks.values():
                if fw.subscriber is not None:
                    fw.subscriber.close()

    def restart_master(self) -> None:
        """The master process restarts on the same port: it forgets frameworks and offers;
        agents re-register with their tasks (and unacknowledged updates)."""
        assert self._server is not None
        self._server.stop()
        self.master.restart()
        self._server = MasterServer(self.master, self._host, self.master.port, self._credentials)

    def rescind_offers(self) -> None:
        """Rescind every outstanding offer."""
        self.master.rescind_all()

    # ------------------------------------------------------------------ views

    def tasks(self) -> list[TaskView]:
        """Every task the agents run or ran (completed ones last)."""
        return self.master.task_views()

    def task(self, task_id: str) -> TaskView:
        """The newest view of one task; KeyError if unknown."""
        for view in self.tasks():
            if view.task_id == task_id:
                return view
        raise KeyError(f"no task {task_id}")

    def frameworks(self) -> list[FrameworkView]:
        return self.master.framework_views()

    def wait_until(self, predicate: Callable[[], object], timeout: float) -> None:
        """Return once ``predicate()`` is true; TimeoutError (with the tasks and frameworks last
        seen) after ``timeout`` seconds. Woken by every change in the cluster."""
        master = self.master
        deadline = time.monotonic() + timeout
        while True:
            with master.lock:
                generation = master.generation
            if predicate():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"condition not met within {timeout:g}s; {self._summary()}")
            with master.changed:
                if master.generation == generation:
                    # Changes outside the master (file contents) are seen within 0.1 s.
                    master.changed.wait(min(remaining, 0.1))

    def _summary(self) -> str:
        tasks = ", ".join(f"{t.task_id}={t.state}@{t.hostname}" for t in self.tasks()[:20])
        fws = ", ".join(
            f"{f.id}({'connected' if f.connected else 'disconnected'})" for f in self.frameworks()
        )
        return f"tasks: [{tasks}]; frameworks: [{fws}]"


_PORTS_ITEM = re.compile(r"^(\s*ports\s*(?:\([^)]*\))?\s*:)(.*)$")


def _with_free_ports(spec: AgentSpec, ip: str) -> tuple[AgentSpec, list[socket.socket]]:
    """``spec`` with each ``ports`` item replaced by as many ports the kernel picked on ``ip``,
    and the sockets holding them (bound with SO_REUSEADDR, not listening)."""
    held: list[socket.socket] = []
    items = []
    try:
        for item in spec.resources.split(";"):
            match = _PORTS_ITEM.match(item)
            if match is not None:
                count = range_count(parse_text(f"ports:{match.group(2)}").ranges["ports"])
                ports = []
                for _ in range(count):
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    held.append(s)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind((ip, 0))
                    port = int(s.getsockname()[1])
                    ports.append((port, port))
                item = match.group(1) + format_ranges(normalize_ranges(ports))
            items.append(item)
    except BaseException:
        _release(held)
        raise
    return dataclasses.replace(spec, resources=";".join(items)), held


def _release(held: list[socket.socket]) -> None:
    for s in held:
        s.close()
    held.clear()
