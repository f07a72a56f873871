"""``peloton-run``: launch the ranks of a collective job by hand, for development.

``peloton-run -np 4 python train.py`` starts 4 ranks on this machine with the environment the
scheduler gives the tasks of a gang (``PELOTON_RANK``, ``PELOTON_GANG_SIZE``, ``PELOTON_PEERS``,
``PELOTON_LOCAL_RANK``/``SIZE``, ``PELOTON_CROSS_RANK``/``SIZE``), so the same script runs under
both. ``-H a:2,b:2`` spreads the ranks over hosts, filling each host's slots in order; hosts other
than ``localhost``/``127.0.0.1`` are reached with ssh (the same working directory must exist there).

Every line a rank prints is prefixed with ``[rank]``. If a rank exits non-zero the others are
stopped (SIGTERM, then SIGKILL after ``--kill-grace`` seconds) and peloton-run exits with that
rank's code; SIGINT and SIGTERM are forwarded to every rank. Each rank runs in its own process
group, which is killed as a whole, so nothing is left running.

``peloton-run --elastic --min 2 --max 4 -np 3 python train.py`` runs an elastic gang
(:mod:`peloton.collective.elastic`): peloton-run serves the gang's rendezvous endpoint
(:mod:`peloton.collective.rendezvous`) and gives every rank its address and token
(``PELOTON_RENDEZVOUS``, ``PELOTON_RENDEZVOUS_TOKEN``). A rank that dies is dropped from the gang
and the others go on under a new generation; peloton-run exits 0 if any rank finished with 0,
else with the first failed rank's code.

Every run gets a new gang secret (``PELOTON_GANG_SECRET``), as a scheduled gang does: only its
ranks can connect to one another. Remote ranks get it on their ssh command line, as every
variable, where the remote host's ``ps`` shows it while they run.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import IO

import click

from peloton.collective.rendezvous import RendezvousServer
from peloton.core.gangenv import (
    GANG_SECRET,
    RENDEZVOUS,
    RENDEZVOUS_TOKEN,
    TOPOLOGY_VARS,
    GangEnv,
    Rank,
    new_secret,
    topology,
)

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1"})
DEFAULT_SSH = "ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new"
EXIT_USAGE = 2
# Asks a remote host for free ports: bind them all at once (so they differ), print, release.
_REMOTE_PORTS_SCRIPT = (
    "import socket,sys;s=[socket.socket() for _ in range(int(sys.argv[1]))];"
    "[x.bind(('',0)) for x in s];print(','.join(str(x.getsockname()[1]) for x in s))"
)


class RunError(Exception):
    """A bad argument or a failed launch: peloton-run prints it as one line."""


@dataclass(frozen=True)
class HostSlots:
    """A host and how many ranks it takes."""

    host: str
    slots: int


@dataclass(frozen=True)
class RankSeat:
    """Where one rank runs and its coordinates (Horovod's local and cross ranks)."""

    rank: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def parse_hosts(spec: str) -> list[HostSlots]:
    """Parse ``host:slots,host:slots`` (``host`` alone means one slot)."""
    hosts: list[HostSlots] = []
    seen: set[str] = set()
    for item in spec.split(","):
        item = item.strip()
        host, sep, slots_text = item.rpartition(":")
        if not sep:
            host, slots_text = item, "1"
        if not host:
            raise RunError(f"-H: {item!r} has no host name (expected host:slots)")
        try:
            slots = int(slots_text)
        except ValueError:
            raise RunError(f"-H: {item!r}: slots must be a whole number") from None
        if slots < 1:
            raise RunError(f"-H: {item!r}: slots must be at least 1")
        if host in seen:
            raise RunError(f"-H: host {host} is listed twice")
        seen.add(host)
        hosts.append(HostSlots(host, slots))
    return hosts


def assign_ranks(hosts: Sequence[HostSlots], size: int) -> list[RankSeat]:
    """Fill each host's slots in order with ranks ``0..size-1``.

    Local and cross ranks are the scheduler's (:func:`peloton.core.gangenv.topology`):
    ``cross_rank`` is a rank's position among the ranks with the same ``local_rank`` (one per
    host), ``cross_size`` their number: the ring between hosts in a hierarchical allreduce.
    """
    if size < 1:
        raise RunError(f"-np: must be at least 1 (got {size})")
    total = sum(h.slots for h in hosts)
    if total < size:
        raise RunError(f"-np {size}: the hosts have only {total} slots")
    by_rank: list[str] = []
    for h in hosts:
        by_rank += [h.host] * min(h.slots, size - len(by_rank))
    return [
        RankSeat(rank, host, r.local_rank, r.local_size, r.cross_rank, r.cross_size)
        for rank, (host, r) in enumerate(zip(by_rank, topology(by_rank), strict=True))
    ]


def rank_env(
    seat: RankSeat,
    size: int,
    peers: Sequence[str],
    timeout: float | None = None,
    fusion_threshold: int | None = None,
) -> dict[str, str]:
    """The PELOTON_* variables of one rank, as the scheduler sets them (the gang contract)."""
    where = Rank(seat.local_rank, seat.local_size, seat.cross_rank, seat.cross_size)
    return GangEnv.at(
        seat.rank, size, peers, where, timeout=timeout, fusion_threshold=fusion_threshold
    ).to_env()


def is_local(host: str) -> bool:
    """Whether ``host`` is this machine (run directly, not over ssh)."""
    return host in LOCAL_HOSTS


def local_free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that are free on this machine now."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def remote_free_ports(host: str, count: int, ssh: Sequence[str]) -> list[int]:
    """``count`` free TCP ports on ``host``, asked over ssh."""
    script = f"python3 -c {shlex.quote(_REMOTE_PORTS_SCRIPT)} {count}"
    try:
        out = subprocess.run(
            [*ssh, host, script],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RunError(f"cannot reach {host} over ssh: {exc}") from None
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        raise RunError(f"cannot reach {host} over ssh: {why}")
    try:
        ports = [int(x) for x in out.stdout.strip().split(",")]
    except ValueError:
        raise RunError(
            f"{host}: unexpected answer to the free-port query: {out.stdout!r}"
        ) from None
    if len(ports) != count:
        raise RunError(f"{host}: asked for {count} free ports, got {len(ports)}")
    return ports


def peer_addresses(seats: Sequence[RankSeat], ssh: Sequence[str]) -> list[str]:
    """``host:port`` of every rank, with ports free on each host."""
    all_local = all(is_local(p.host) for p in seats)
    # Ranks on other hosts must reach this one by a name that is not loopback.
    here = "127.0.0.1" if all_local else socket.getfqdn()
    counts: dict[str, int] = {}
    for p in seats:
        counts[p.host] = counts.get(p.host, 0) + 1
    ports: dict[str, Iterator[int]] = {}
    for host, n in counts.items():
        got = local_free_ports(n) if is_local(host) else remote_free_ports(host, n, ssh)
        ports[host] = iter(got)
    return [f"{here if is_local(p.host) else p.host}:{next(ports[p.host])}" for p in seats]


def remote_command(command: Sequence[str], env: Mapping[str, str], cwd: str) -> str:
    """The shell line ssh runs for one remote rank.

    The rank runs in the background while a watcher reads the ssh channel's stdin: when
    peloton-run closes it (or dies, or the connection drops) the watcher kills the rank, so a
    remote rank never outlives its launcher.
    """
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    cmd = " ".join(shlex.quote(c) for c in command)
    return (
        f"cd {shlex.quote(cwd)} || exit 127; exec 3<&0; "
        f"env {assigns} {cmd} </dev/null & pid=$!; "
        '{ cat <&3 >/dev/null 2>&1; kill -TERM "$pid" 2>/dev/null; } >/dev/null 2>&1 & w=$!; '
        'wait "$pid"; rc=$?; kill "$w" 2>/dev/null; exit "$rc"'
    )


class _Output:
    """Copies each rank's lines to our stdout/stderr with a ``[rank]`` prefix."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def pump(self, rank: int, src: IO[bytes], dst: IO[bytes]) -> None:
        t = threading.Thread(target=self._copy, args=(rank, src, dst), daemon=True)
        t.start()
        self._threads.append(t)

    def _copy(self, rank: int, src: IO[bytes], dst: IO[bytes]) -> None:
        prefix = f"[{rank}] ".encode()
        broken = False
        with src:
            # Read to the end even when our output is gone, so the rank never blocks writing.
            for line in iter(src.readline, b""):
                if broken:
                    continue
                data = prefix + (line if line.endswith(b"\n") else line + b"\n")
                with self._lock:
                    try:
                        dst.write(data)
                        dst.flush()
                    except OSError:  # e.g. `peloton-run ... | head`
                        broken = True

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


@dataclass
class _Rank:
    seat: RankSeat
    proc: subprocess.Popen[bytes]
    exited: bool = False


class RankSupervisor:
    """Starts the ranks, watches them, and stops them all when one fails or on a signal."""

    def __init__(
        self, kill_grace: float, err: Callable[[str], None], elastic: bool = False
    ) -> None:
        self.kill_grace = kill_grace
        # Elastic: a failed rank is dropped (the gang goes on), not a reason to stop the rest.
        self.elastic = elastic
        self._succeeded = False
        self._err = err
        self._ranks: list[_Rank] = []
        self._events: queue.SimpleQueue[tuple[str, int, int]] = queue.SimpleQueue()
        self._output = _Output()

    def start(
        self, seat: RankSeat, argv: Sequence[str], env: Mapping[str, str], remote: bool
    ) -> None:
        """Start one rank in its own process group, its output prefixed."""
        try:
            proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                # A remote rank is stopped when its ssh channel's stdin closes.
                stdin=subprocess.PIPE if remote else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise RunError(f"cannot start rank {seat.rank}: {argv[0]}: {exc.strerror}") from None
        rank = _Rank(seat, proc)
        self._ranks.append(rank)
        assert proc.stdout is not None and proc.stderr is not None
        self._output.pump(seat.rank, proc.stdout, sys.stdout.buffer)
        self._output.pump(seat.rank, proc.stderr, sys.stderr.buffer)
        threading.Thread(target=self._wait, args=(seat.rank, proc), daemon=True).start()

    def _wait(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        self._events.put(("exit", rank, proc.wait()))

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """Signal handler: hand the signal to the wait loop (SimpleQueue.put is reentrant)."""
        self._events.put(("signal", signum, 0))

    def _signal_all(self, signum: int) -> None:
        for r in self._ranks:
            if not r.exited:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(r.proc.pid, signum)
                if r.proc.stdin is not None and signum in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(OSError):
                        r.proc.stdin.close()

    def wait(self) -> int:
        """Wait for every rank; the exit code of peloton-run."""
        left = len(self._ranks)
        code = 0
        deadline: float | None = None
        killed = False
        while left:
            timeout = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                kind, a, b = self._events.get(timeout=timeout)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline and not killed:
                    self._err(f"ranks still running after {self.kill_grace:g} s: killing them")
                    self._signal_all(signal.SIGKILL)
                    killed = True
                continue
            if kind == "exit":
                rank, rc = a, b
                self._ranks[rank].exited = True
                left -= 1
                if self.elastic:
                    self._succeeded = self._succeeded or rc == 0
                    if rc != 0:
                        code = code or (rc if rc > 0 else 128 - rc)
                        self._err(f"rank {rank} {_describe_exit(rc)}; the gang goes on without it")
                    if not left and self._succeeded:
                        code = 0
                    continue
                if rc != 0 and deadline is None:
                    code = rc if rc > 0 else 128 - rc
                    self._err(f"rank {rank} {_describe_exit(rc)}; stopping the other ranks")
                    self._signal_all(signal.SIGTERM)
                    deadline = time.monotonic() + self.kill_grace
            elif deadline is None:
                signum = a
                name = signal.Signals(signum).name
                self._err(f"got {name}: forwarding it to the ranks")
                code = 128 + signum
                self._signal_all(signum)
                deadline = time.monotonic() + self.kill_grace
            elif not killed:
                # A second signal while stopping: no more patience.
                self._signal_all(signal.SIGKILL)
                killed = True
        self._output.join(timeout=5.0)
        return code

    def kill_all(self) -> None:
        """Kill every rank still running (used when starting the others failed)."""
        self._signal_all(signal.SIGKILL)
        for r in self._ranks:
            r.proc.wait()


def _describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


def launch(
    command: Sequence[str],
    hosts: Sequence[HostSlots],
    size: int,
    timeout: float | None = None,
    fusion_threshold: int | None = None,
    env_names: Sequence[str] = (),
    ssh: Sequence[str] = tuple(shlex.split(DEFAULT_SSH)),
    kill_grace: float = 5.0,
    elastic: tuple[int, int] | None = None,
) -> int:
    """Run ``command`` as ``size`` ranks over ``hosts``; the exit code (see the module doc).
    ``elastic`` is (min, max): serve a rendezvous endpoint and let the gang shrink and grow."""
    seats = assign_ranks(hosts, size)
    peers = peer_addresses(seats, ssh)
    extra = _extra_env(env_names) | {GANG_SECRET: new_secret()}
    with contextlib.ExitStack() as stack:
        if elastic is not None:
            here = "127.0.0.1" if all(is_local(p.host) for p in seats) else socket.getfqdn()
            token = secrets.token_hex(16)
            server = RendezvousServer(token, elastic[0], elastic[1], size, host=here)
            stack.callback(server.close)
            extra |= {RENDEZVOUS: server.address, RENDEZVOUS_TOKEN: token}
        return _run_ranks(
            command, seats, size, peers, timeout, fusion_threshold, extra, ssh, kill_grace, elastic
        )


def _run_ranks(
    command: Sequence[str],
    seats: Sequence[RankSeat],
    size: int,
    peers: Sequence[str],
    timeout: float | None,
    fusion_threshold: int | None,
    extra: Mapping[str, str],
    ssh: Sequence[str],
    kill_grace: float,
    elastic: tuple[int, int] | None,
) -> int:
    ranks = RankSupervisor(kill_grace, _print_err, elastic=elastic is not None)
    old = {s: signal.signal(s, ranks.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            for p in seats:
                env = {**rank_env(p, size, peers, timeout, fusion_threshold), **extra}
                if is_local(p.host):
                    full = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
                    ranks.start(p, command, full, remote=False)
                else:
                    line = remote_command(command, {"PYTHONUNBUFFERED": "1", **env}, os.getcwd())
                    ranks.start(p, [*ssh, p.host, line], os.environ, remote=True)
        except RunError:
            ranks.kill_all()
            raise
        return ranks.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _extra_env(names: Sequence[str]) -> dict[str, str]:
    """``-x NAME`` copies NAME from our environment, ``-x NAME=VALUE`` sets it."""
    env: dict[str, str] = {}
    for item in names:
        name, sep, value = item.partition("=")
        if not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise RunError(f"-x: {item!r} is not a variable name")
        if name in TOPOLOGY_VARS:
            raise RunError(f"-x: {name} is set by peloton-run")
        if sep:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
    return env


def _print_err(message: str) -> None:
    sys.stderr.write(f"peloton-run: {message}\n")
    sys.stderr.flush()


@click.command(
    context_settings={
        "help_option_names": ["-h", "--help"],
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
        "max_content_width": 100,
    }
)
@click.option("-np", "--num-proc", "size", type=int, required=True, help="Number of ranks.")
@click.option(
    "-H",
    "--hosts",
    default=None,
    metavar="HOST:SLOTS,...",
    help="Hosts and their slots, filled in order. Default: localhost with -np slots.",
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Seconds a collective may stall before every rank raises (PELOTON_COLLECTIVE_TIMEOUT).",
)
@click.option(
    "--fusion-threshold",
    type=int,
    default=None,
    metavar="BYTES",
    help="Tensor fusion buffer size (PELOTON_FUSION_THRESHOLD).",
)
@click.option(
    "-x",
    "env_names",
    multiple=True,
    metavar="NAME[=VALUE]",
    help="Pass this variable to remote ranks too (local ranks get the whole environment).",
)
@click.option(
    "--elastic",
    is_flag=True,
    help="An elastic gang: serve a rendezvous endpoint; ranks may die and the gang goes on.",
)
@click.option("--min", "min_size", type=int, default=None, help="Elastic: fewest ranks (-np).")
@click.option("--max", "max_size", type=int, default=None, help="Elastic: most ranks (-np).")
@click.option("--ssh", default=DEFAULT_SSH, show_default=True, help="Command to reach hosts.")
@click.option(
    "--kill-grace",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when stopping ranks.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def cli(
    size: int,
    hosts: str | None,
    timeout: float | None,
    fusion_threshold: int | None,
    env_names: tuple[str, ...],
    elastic: bool,
    min_size: int | None,
    max_size: int | None,
    ssh: str,
    kill_grace: float,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND as -np ranks with the environment of a peloton gang.

    \b
    Examples:
      peloton-run -np 2 python examples/train_torch.py
      peloton-run -np 4 -H node1:2,node2:2 --timeout 60 python train.py
      peloton-run --elastic --min 2 --max 4 -np 3 python train_elastic.py
    """
    bounds = None
    if elastic:
        bounds = (size if min_size is None else min_size, size if max_size is None else max_size)
        if not 1 <= bounds[0] <= bounds[1]:
            raise RunError(
                f"--min {bounds[0]} --max {bounds[1]}: need 1 <= min <= max (each defaults to -np)"
            )
    elif min_size is not None or max_size is not None:
        raise RunError("--min/--max: only with --elastic")
    if timeout is not None and timeout <= 0:
        raise RunError(f"--timeout: must be positive (got {timeout:g})")
    if fusion_threshold is not None and fusion_threshold < 0:
        raise RunError(f"--fusion-threshold: must be 0 or more (got {fusion_threshold})")
    if kill_grace < 0:
        raise RunError(f"--kill-grace: must be 0 or more (got {kill_grace:g})")
    host_list = parse_hosts(hosts) if hosts is not None else [HostSlots("localhost", max(size, 1))]
    ssh_argv = shlex.split(ssh)
    if not ssh_argv:
        raise RunError("--ssh: empty command")
    code = launch(
        command,
        host_list,
        size,
        timeout,
        fusion_threshold,
        env_names,
        ssh_argv,
        kill_grace,
        bounds,
    )
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: errors become one line on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="peloton-run", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        _print_err(f"error: {exc.format_message()}")
        sys.exit(EXIT_USAGE)
    except RunError as exc:
        _print_err(f"error: {exc}")
        sys.exit(EXIT_USAGE)
    except click.Abort:
        sys.exit(130)


if __name__ == "__main__":
    main()
