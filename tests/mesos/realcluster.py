"""Local **real** Apache Mesos 1.11 clusters for tests, from ``../shared/real-mesos``.

    from realcluster import real_cluster

    with real_cluster(agents=2, resources="cpus:4;mem:8192;disk:10000;gpus:2;ports:[31000-31100]",
                      per_agent={1: {"attributes": "rack:r2"}}) as cluster:
        cluster.master                     # host:port for pymesos, `peloton server --mesos-master`
        cluster.agents()                   # /master/state's "slaves"
        cluster.outstanding_offers(fw_id)  # offers the master holds out to that framework

The harness directory is ``$PELOTON_REAL_MESOS_DIR``, else ``<repo root>/../shared/real-mesos``
(see its README.md). Its ``setup.sh`` runs once per test process into the main home
(``$REAL_MESOS_HOME``, else ``$XDG_CACHE_HOME/real-mesos`` or ``~/.cache/real-mesos``); it is
idempotent and holds a flock, so concurrent test runs may all call it. Every cluster then gets a
home of its own: a temporary directory whose entries are symlinks to the main home's built
artefacts (``py27site``, ``lib``, ``venv``, ``setup.env``, ``.stamps``, ``downloads``), with its own
``run/`` (pids, logs, work dirs, sandboxes) and its own ``libexec/`` (``start.sh`` reinstalls the
executor stand-ins there on every start, so a shared one would be rewritten under a running
cluster). Its ports are chosen by the kernel: ``--port`` and a block ``--proxy-port``..+agents,
picked and taken by ``start.sh`` under a machine-wide lock so that clusters started at once by
several test runs never race for them; and an address of its own on the loopback interface
(``127.64.0.0/10``), so that tasks of different clusters never contend for the ports their offers
name. So any number of clusters run side by side. A cluster's agents share its address, so give
them disjoint ``ports`` ranges when tasks on several agents listen.

A cluster that does not come up raises :class:`RealClusterError` with the output of ``start.sh``
and the tail of its logs: a test needing one fails, never skips. Leaving the ``with`` block (or
:meth:`RealCluster.stop`) runs ``stop.sh``, which stops the cluster, its proxy and every process
left in its sandboxes; the home is removed afterwards unless it was put in ``base_dir``.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RESOURCES = "cpus:8;mem:16384;disk:20000;gpus:4;ports:[31000-32000]"
# Entries of the main home a cluster home links to; everything else (run/, libexec/, the setup
# lock) is the cluster's own.
SHARED_ENTRIES = ("py27site", "lib", "venv", "setup.env", ".stamps", "downloads")
# start.sh refuses a port another program took between our pick and its bind: try again.
START_ATTEMPTS = 3
LOG_TAIL_LINES = 40

_setup_lock = threading.Lock()
_setup_done: set[Path] = set()


class RealClusterError(RuntimeError):
    """A local real Mesos cluster could not be set up, started or stopped."""


def real_mesos_dir() -> Path:
    """The real-mesos harness: ``$PELOTON_REAL_MESOS_DIR``, else ``../shared/real-mesos`` beside
    this checkout, else beside the checkout it was cloned from (CI tests a clean clone of the
    main checkout, made elsewhere); the first of those that exists, else the first."""
    configured = os.environ.get("PELOTON_REAL_MESOS_DIR")
    if configured:
        return Path(configured)
    candidates = [REPO_ROOT.parent / "shared" / "real-mesos"]
    origin = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "remote", "get-url", "origin"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if origin.startswith("file://"):
        origin = origin[len("file://") :]
    if origin.startswith("/"):
        candidates.append(Path(origin).parent / "shared" / "real-mesos")
    return next((c for c in candidates if c.is_dir()), candidates[0])


def main_home() -> Path:
    """Where ``setup.sh`` builds everything (as ``lib/common.sh`` computes it)."""
    configured = os.environ.get("REAL_MESOS_HOME")
    if configured:
        return Path(configured).resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(cache) / "real-mesos").resolve()


def _harness_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the harness scripts: ours without MESOS_* (each one becomes a
    master/agent flag) or LIBPROCESS_*, plus ``extra`` and REAL_MESOS_HOME."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MESOS_", "LIBPROCESS_")) and k != "REAL_MESOS_HOME"
    }
    env.update(extra or {})
    env["REAL_MESOS_HOME"] = str(home)
    return env


def ensure_setup() -> Path:
    """Run ``setup.sh`` into the main home once per process; returns the main home."""
    home = main_home()
    with _setup_lock:
        if home in _setup_done:
            return home
        script = real_mesos_dir() / "setup.sh"
        if not script.exists():
            raise RealClusterError(
                f"no real-mesos harness at {script.parent} (set PELOTON_REAL_MESOS_DIR)"
            )
        out = subprocess.run(
            [str(script)],
            env=_harness_env(home),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if out.returncode != 0:
            raise RealClusterError(
                f"{script} failed with exit status {out.returncode}:\n{out.stdout}{out.stderr}"
            )
        _setup_done.add(home)
        return home


def _cluster_home(main: Path, base_dir: Path | None) -> Path:
    home = Path(tempfile.mkdtemp(prefix="real-mesos-", dir=base_dir))
    for name in SHARED_ENTRIES:
        target = main / name
        if not target.exists():
            raise RealClusterError(f"{target} is missing after setup.sh")
        (home / name).symlink_to(target)
    return home


def _loopback_ip() -> str:
    """A loopback address of the cluster's own, from 127.64.0.0/10 (Linux routes all of
    127.0.0.0/8 to lo; the minicluster's agents use 127.0.1.x). Tasks of different clusters then
    never contend for the ports their offers name, even when clusters run side by side."""
    rng = random.SystemRandom()
    return f"127.{rng.randint(64, 127)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"


def _port_block(ip: str, size: int) -> int:
    """A port P from the kernel such that P..P+size-1 on ``ip`` are all free right now."""
    for _ in range(100):
        held: list[socket.socket] = []
        try:
            first = socket.socket()
            held.append(first)
            first.bind((ip, 0))
            port = int(first.getsockname()[1])
            if port + size - 1 > 65535:
                continue
            for p in range(port + 1, port + size):
                s = socket.socket()
                held.append(s)
                s.bind((ip, p))
            return port
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RealClusterError(f"found no {size} consecutive free ports")


@contextmanager
def _ports_lock() -> Iterator[None]:
    """Machine-wide: picking ports and starting on them is one step for every test run."""
    path = Path(tempfile.gettempdir()) / "peloton-real-mesos-ports.lock"
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"({path}: {exc})"
    return "\n".join(text[-lines:])


@dataclass
class RealCluster:
    """A running real Mesos master and its agents (or an operator's master, see :meth:`attach`)."""

    master: str  # host:port to give pymesos / peloton (the proxy's master view)
    home: Path  # this cluster's REAL_MESOS_HOME (run/ holds logs, work dirs, sandboxes)
    keep_home: bool = field(default=True, repr=False)
    local: bool = field(default=True, repr=False)
    stopped: bool = field(default=False, repr=False)

    @classmethod
    def attach(cls, master: str) -> RealCluster:
        """An existing master (``PELOTON_TEST_MESOS_MASTER``): :meth:`stop` leaves it alone."""
        return cls(master=master, home=Path(), local=False)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://{self.master}{path}", timeout=10) as response:
            return json.loads(response.read().decode())

    def state(self) -> dict[str, Any]:
        """The master's ``/master/state``."""
        state: dict[str, Any] = self.get("/master/state")
        return state

    def agents(self) -> list[dict[str, Any]]:
        agents: list[dict[str, Any]] = self.state()["slaves"]
        return agents

    def frameworks(self) -> list[dict[str, Any]]:
        frameworks: list[dict[str, Any]] = self.state()["frameworks"]
        return frameworks

    def framework(self, framework_id: str) -> dict[str, Any]:
        """The master's record of a registered framework (KeyError naming those it has)."""
        frameworks = self.frameworks()
        for fw in frameworks:
            if fw["id"] == framework_id:
                return fw
        names = [(f["id"], f["name"]) for f in frameworks]
        raise KeyError(f"framework {framework_id} is not registered; the master has {names}")

    def outstanding_offers(self, framework_id: str) -> int:
        """How many offers the master shows as outstanding for the framework."""
        return len(self.framework(framework_id).get("offers", []))

    def framework_metrics(self, framework_id: str) -> dict[str, float]:
        """The master's metrics of a framework, by the key after its id: ``offers/sent``,
        ``offers/declined``, ``offers/accepted``, ``roles/ROLE/suppressed``, ``calls/decline``..."""
        marker = f"/{framework_id}/"
        metrics: dict[str, float] = self.get("/metrics/snapshot")
        return {
            key.split(marker, 1)[1]: value
            for key, value in metrics.items()
            if key.startswith("master/frameworks/") and marker in key
        }

    def tasks_of(self, framework_id: str) -> list[dict[str, Any]]:
        """Every task the master knows of a framework: active, unreachable and completed."""
        fw = self.framework(framework_id)
        return [*fw["tasks"], *fw.get("unreachable_tasks", []), *fw["completed_tasks"]]

    def teardown(self, framework_id: str) -> None:
        """Tear a framework down at the master (its tasks are killed); a framework the master
        no longer has is fine."""
        request = urllib.request.Request(
            f"http://{self.master}/master/teardown",
            data=f"frameworkId={framework_id}".encode(),
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code != 400:  # 400: no such framework (already gone)
                raise

    # ------------------------------------------------------------ a local cluster's processes

    def task_sandbox(self, task_id: str) -> Path:
        """The sandbox of a task of a task group (``<executor sandbox>/tasks/<task_id>``, a link
        to its container's directory, where its processes run)."""
        self._local_only("task_sandbox")
        pattern = f"agents/*/work/slaves/*/frameworks/*/executors/*/runs/latest/tasks/{task_id}"
        found = sorted((self.home / "run" / "work").glob(pattern))
        if not found:
            raise AssertionError(f"no sandbox of task {task_id} under {self.home / 'run/work'}")
        return found[0].resolve()

    def processes_in(self, directory: Path) -> list[int]:
        """The pids of the processes whose working directory is ``directory``."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cwd = (proc / "cwd").resolve(strict=True)
            except OSError:
                continue
            if cwd == directory:
                pids.append(int(proc.name))
        return pids

    def task_processes(self, task_id: str) -> list[int]:
        """The processes of a running task (the task's command and what it started)."""
        return self.processes_in(self.task_sandbox(task_id))

    def executor_processes(self, task_id: str) -> list[int]:
        """The processes of the executor that runs ``task_id`` (the default executor)."""
        return self.processes_in(self.task_sandbox(task_id).parent.parent)

    def _local_only(self, what: str) -> None:
        if not self.local:
            raise RealClusterError(f"{what} needs a local cluster, not the master {self.master}")

    def mark_agent_gone(self, agent_id: str) -> None:
        """The operator API's MARK_AGENT_GONE: the master shuts the agent down for good and its
        tasks end TASK_GONE_BY_OPERATOR (a lost agent, as partition-aware frameworks see it)."""
        call = {"type": "MARK_AGENT_GONE", "mark_agent_gone": {"agent_id": {"value": agent_id}}}
        request = urllib.request.Request(
            f"http://{self.master}/api/v1",
            data=json.dumps(call).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200, response.read()

    @property
    def logs(self) -> Path:
        return self.home / "run" / "logs"

    def log_tail(self) -> str:
        """The last lines of the cluster's and the proxy's logs (for failure messages)."""
        return "\n".join(
            f"--- {p} (last {LOG_TAIL_LINES} lines) ---\n{_tail(p)}"
            for p in (self.logs / "mesos.log", self.logs / "proxy.log")
        )

    def stop(self) -> None:
        """``stop.sh``: the cluster, its proxy and anything left in its sandboxes. Idempotent."""
        if self.stopped or not self.local:
            return
        self.stopped = True
        out = subprocess.run(
            [str(real_mesos_dir() / "stop.sh")],
            env=_harness_env(self.home),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if out.returncode != 0:
            raise RealClusterError(
                f"stop.sh failed with exit status {out.returncode}:\n{out.stdout}{out.stderr}"
            )
        if not self.keep_home:
            shutil.rmtree(self.home, ignore_errors=True)


def _start_args(
    agents: int,
    resources: str,
    attributes: str,
    hostname: str | None,
    per_agent: Mapping[int, Mapping[str, str]] | None,
    timeout: float,
) -> list[str]:
    args = ["--agents", str(agents), "--resources", resources, "--timeout", f"{timeout:g}"]
    if attributes:
        args += ["--attributes", attributes]
    if hostname:
        args += ["--hostname", hostname]
    for index, flags in sorted((per_agent or {}).items()):
        for key, value in flags.items():
            args += ["--agent", f"{index}:{key}={value}"]
    return args


def start_real_cluster(
    agents: int = 1,
    resources: str = DEFAULT_RESOURCES,
    attributes: str = "",
    hostname: str | None = None,
    per_agent: Mapping[int, Mapping[str, str]] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    *,
    base_dir: Path | None = None,
) -> RealCluster:
    """Start a cluster (see :func:`real_cluster`); the caller must :meth:`RealCluster.stop` it."""
    main = ensure_setup()
    args = _start_args(agents, resources, attributes, hostname, per_agent, timeout)
    failures: list[str] = []
    for _ in range(START_ATTEMPTS):
        home = _cluster_home(main, base_dir)
        cluster = RealCluster(master="", home=home, keep_home=base_dir is not None)
        with _ports_lock():
            ip = _loopback_ip()
            port = _port_block(ip, 1)
            proxy = _port_block(ip, agents + 1)
            while port in range(proxy, proxy + agents + 1):
                port = _port_block(ip, 1)
            ports = ["--ip", ip, "--port", str(port), "--proxy-port", str(proxy)]
            try:
                out = subprocess.run(
                    [str(real_mesos_dir() / "start.sh"), *args, *ports],
                    env=_harness_env(home, env),
                    capture_output=True,
                    text=True,
                    timeout=timeout + 60,
                    check=False,
                )
                stdout, output, code = out.stdout, out.stdout + out.stderr, out.returncode
            except subprocess.TimeoutExpired as exc:
                stdout, output, code = "", f"{exc.stdout!r} {exc.stderr!r}", -1
        lines = stdout.strip().splitlines() if code == 0 else []
        if code == 0 and lines and lines[-1].startswith("MESOS_MASTER="):
            cluster.master = lines[-1].split("=", 1)[1]
            return cluster
        failure = (
            f"start.sh {' '.join(args)} {' '.join(ports)} "
            f"(REAL_MESOS_HOME={home}) exited with {code}:\n{output}\n{cluster.log_tail()}"
        )
        failures.append(failure)
        try:
            cluster.stop()  # whatever start.sh left behind
        except RealClusterError as exc:
            failures.append(str(exc))
        if "in use" not in failure:  # another program took a port first: worth a retry
            break
    raise RealClusterError("the local real Mesos cluster did not start:\n" + "\n".join(failures))


@contextmanager
def real_cluster(
    agents: int = 1,
    resources: str = DEFAULT_RESOURCES,
    attributes: str = "",
    hostname: str | None = None,
    per_agent: Mapping[int, Mapping[str, str]] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    *,
    base_dir: Path | None = None,
) -> Iterator[RealCluster]:
    """A started local real Mesos cluster, stopped (nothing left running) when the block ends.

    ``agents`` agents with ``resources``/``attributes``/``hostname`` each (``--resources`` etc.
    of start.sh, e.g. static reservations ``gpus(gpu):2;cpus(gpu):4;cpus:4;...``);
    ``per_agent={1: {"attributes": "rack:r2", "hostname": "node-b"}}`` overrides agent 1 (keys
    resources, attributes, hostname); ``env`` adds MESOS_* master/agent flags. ``timeout``: how
    long start.sh waits for the agents to register. ``base_dir``: keep the cluster's home (logs,
    sandboxes) in a new directory there instead of removing it afterwards.
    """
    cluster = start_real_cluster(
        agents, resources, attributes, hostname, per_agent, env, timeout, base_dir=base_dir
    )
    try:
        yield cluster
    finally:
        cluster.stop()
