"""peloton-run: rank placement (properties), the environment of each rank, output, failure and
signal handling with real processes, and remote ranks through a stand-in for ssh."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peloton.collective.run import (
    HostSlots,
    RunError,
    assign_ranks,
    parse_hosts,
    remote_command,
)

RUN = [sys.executable, "-m", "peloton.collective.run"]
DEADLINE_S = 30.0

# A rank that reports its environment as one JSON line.
PRINT_ENV = (
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith('PELOTON_') or k == 'EXTRA'}))"
)
# A rank that records its pid and a child's, says so, then waits to be stopped.
HANG = (
    "import os, subprocess, sys, time; d = sys.argv[1]; "
    "c = subprocess.Popen(['sleep', '300']); "
    "f = os.path.join(d, os.environ['PELOTON_RANK']); "
    "open(f + '.tmp', 'w').write(f'{os.getpid()} {c.pid}'); os.replace(f + '.tmp', f); "
    "time.sleep(300)"
)


def run(*args: str, timeout: float = DEADLINE_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RUN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for init to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def recorded_pids(directory: Path, n: int) -> list[int]:
    return [int(p) for r in range(n) for p in (directory / str(r)).read_text().split()]


def env_lines(stdout: str) -> dict[int, dict[str, str]]:
    """The JSON each rank printed, by the rank in its ``[rank]`` prefix."""
    out: dict[int, dict[str, str]] = {}
    for line in stdout.splitlines():
        prefix, _, rest = line.partition("] ")
        out[int(prefix.lstrip("["))] = json.loads(rest)
    return out


# ---- placement: pure logic ------------------------------------------------------------------


host_lists = st.lists(st.integers(1, 5), min_size=1, max_size=5).map(
    lambda slots: [HostSlots(f"h{i}", s) for i, s in enumerate(slots)]
)


@given(hosts=host_lists, data=st.data())
def test_assign_ranks_fills_slots_in_order_with_consistent_coordinates(
    hosts: list[HostSlots], data: st.DataObject
) -> None:
    size = data.draw(st.integers(1, sum(h.slots for h in hosts)))
    placed = assign_ranks(hosts, size)
    assert [p.rank for p in placed] == list(range(size))
    # Host order is kept and no host gets more ranks than slots.
    order = [h.host for h in hosts]
    assert [order.index(p.host) for p in placed] == sorted(order.index(p.host) for p in placed)
    for h in hosts:
        mine = [p for p in placed if p.host == h.host]
        assert len(mine) <= h.slots
        assert [p.local_rank for p in mine] == list(range(len(mine)))
        assert all(p.local_size == len(mine) for p in mine)
    # Ranks with the same local rank form the cross ring: 0..k-1 in host order.
    for local in {p.local_rank for p in placed}:
        ring = [p for p in placed if p.local_rank == local]
        assert [p.cross_rank for p in ring] == list(range(len(ring)))
        assert all(p.cross_size == len(ring) for p in ring)


def test_assign_ranks_refuses_more_ranks_than_slots() -> None:
    with pytest.raises(RunError, match="only 3 slots"):
        assign_ranks([HostSlots("a", 1), HostSlots("b", 2)], 4)


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("a:0", "at least 1"),
        ("a:x", "whole number"),
        (":2", "no host name"),
        ("a:1,a:2", "listed twice"),
    ],
)
def test_parse_hosts_errors(spec: str, error: str) -> None:
    with pytest.raises(RunError, match=error):
        parse_hosts(spec)


def test_parse_hosts() -> None:
    assert parse_hosts("a:2, b ,10.0.0.1:3") == [
        HostSlots("a", 2),
        HostSlots("b", 1),
        HostSlots("10.0.0.1", 3),
    ]


# ---- the command with real processes --------------------------------------------------------


def test_each_rank_gets_the_gang_environment_and_prefixed_output() -> None:
    proc = run("-np", "3", "-x", "EXTRA=yes", sys.executable, "-c", PRINT_ENV)
    assert proc.returncode == 0, proc.stderr
    envs = env_lines(proc.stdout)
    assert sorted(envs) == [0, 1, 2]
    peers = envs[0]["PELOTON_PEERS"].split(",")
    assert len(peers) == 3 and len(set(peers)) == 3
    assert all(p.startswith("127.0.0.1:") for p in peers)
    # One new gang secret for the run, the same for every rank.
    secrets = {env.pop("PELOTON_GANG_SECRET") for env in envs.values()}
    assert len(secrets) == 1 and re.fullmatch(r"[0-9a-f]{64}", secrets.pop())
    for r, env in envs.items():
        assert env == {
            "PELOTON_RANK": str(r),
            "PELOTON_GANG_SIZE": "3",
            "PELOTON_PEERS": ",".join(peers),
            "PELOTON_LOCAL_RANK": str(r),
            "PELOTON_LOCAL_SIZE": "3",
            "PELOTON_CROSS_RANK": "0",
            "PELOTON_CROSS_SIZE": "1",
            "EXTRA": "yes",
        }


def test_stderr_is_prefixed_and_timeout_is_passed() -> None:
    code = "import os, sys; print(os.environ['PELOTON_COLLECTIVE_TIMEOUT'], file=sys.stderr)"
    proc = run("-np", "2", "--timeout", "7.5", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stderr.splitlines()) == ["[0] 7.5", "[1] 7.5"]
    assert proc.stdout == ""


def test_a_failing_rank_fails_the_run_and_nothing_is_left_running(tmp_path: Path) -> None:
    # Rank 2 exits 3 once the other ranks (and their children) have recorded their pids.
    code = (
        "import os, sys, time\n"
        "if os.environ['PELOTON_RANK'] == '2':\n"
        "    while not all(os.path.exists(os.path.join(sys.argv[1], r)) for r in '01'):\n"
        "        time.sleep(0.01)\n"
        "    sys.exit(3)\n"
        f"exec({HANG!r})\n"
    )
    proc = run("-np", "3", "--kill-grace", "10", sys.executable, "-c", code, str(tmp_path))
    assert proc.returncode == 3, proc.stderr
    assert "rank 2 exited with code 3; stopping the other ranks" in proc.stderr
    pids = recorded_pids(tmp_path, 2)
    assert len(pids) == 4
    wait_for(lambda: not any(alive(p) for p in pids), "the ranks and their children to end")


def test_a_rank_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(os.path.join(sys.argv[1], os.environ['PELOTON_RANK']), 'w').write(str(os.getpid()))\n"
        "if os.environ['PELOTON_RANK'] == '0':\n"
        "    while len(os.listdir(sys.argv[1])) < 2: time.sleep(0.01)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(300)\n"
    )
    started = time.monotonic()
    proc = run("-np", "2", "--kill-grace", "1", sys.executable, "-c", code, str(tmp_path))
    assert proc.returncode == 128 + signal.SIGKILL
    assert "rank 0 was killed by SIGKILL" in proc.stderr
    assert "killing them" in proc.stderr
    assert time.monotonic() - started < DEADLINE_S
    assert not alive(int((tmp_path / "1").read_text()))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded_and_nothing_is_left_running(
    signum: signal.Signals, tmp_path: Path
) -> None:
    launcher = subprocess.Popen(
        [*RUN, "-np", "2", sys.executable, "-c", HANG, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: all((tmp_path / r).exists() for r in "01"), "both ranks to start")
        pids = recorded_pids(tmp_path, 2)
        launcher.send_signal(signum)
        _, err = launcher.communicate(timeout=DEADLINE_S)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signum
    assert f"got {signum.name}: forwarding it to the ranks" in err
    wait_for(lambda: not any(alive(p) for p in pids), "the ranks and their children to end")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["-np", "0", "true"], "-np: must be at least 1"),
        (["-np", "x", "true"], "'x' is not a valid integer"),
        (["true"], "Missing option '-np'"),
        (["-np", "2"], "Missing argument"),
        (["-np", "3", "-H", "localhost:2", "true"], "-np 3: the hosts have only 2 slots"),
        (["-np", "2", "-H", "a:b", "true"], "-H: 'a:b': slots must be a whole number"),
        (["-np", "2", "--timeout", "0", "true"], "--timeout: must be positive"),
        (["-np", "2", "-x", "1BAD", "true"], "-x: '1BAD' is not a variable name"),
        (["-np", "2", "-x", "PELOTON_RANK=3", "true"], "-x: PELOTON_RANK is set by peloton-run"),
        (["-np", "1", "/nonexistent/program"], "cannot start rank 0: /nonexistent/program"),
        (["-np", "2", "--min", "2", "true"], "--min/--max: only with --elastic"),
        (["--elastic", "--min", "3", "-np", "2", "true"], "--min 3 --max 2: need 1 <= min"),
        (["--elastic", "--min", "0", "-np", "2", "true"], "--min 0 --max 2: need 1 <= min"),
    ],
)
def test_bad_arguments_are_one_line_errors(args: list[str], error: str) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("peloton-run: error: "), proc.stderr
    assert error in lines[0]


# ---- remote hosts, through a stand-in for ssh -----------------------------------------------


@pytest.fixture
def fake_ssh(tmp_path: Path) -> Path:
    """An "ssh" that runs the remote line here, in a session of its own as sshd would, so
    killing the local ssh process does not reach it; only the closed channel does."""
    script = tmp_path / "fake-ssh"
    script.write_text('#!/bin/sh\nfor a; do last=$a; done\nexec setsid -w sh -c "$last"\n')
    script.chmod(0o755)
    return script


def test_remote_ranks_get_their_environment_over_ssh(fake_ssh: Path) -> None:
    proc = run(
        "-np",
        "3",
        "-H",
        "localhost:1,nodeb:2",
        "--ssh",
        str(fake_ssh),
        "-x",
        "EXTRA=yes",
        sys.executable,
        "-c",
        PRINT_ENV,
    )
    assert proc.returncode == 0, proc.stderr
    envs = env_lines(proc.stdout)
    peers = envs[0]["PELOTON_PEERS"].split(",")
    assert [p.rpartition(":")[0] for p in peers[1:]] == ["nodeb", "nodeb"]
    keys = ("LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")
    coords = {r: tuple(int(e[f"PELOTON_{k}"]) for k in keys) for r, e in envs.items()}
    # localhost takes rank 0, nodeb ranks 1 and 2; local rank 0 exists on both hosts.
    assert coords == {0: (0, 1, 0, 2), 1: (0, 2, 1, 2), 2: (1, 2, 0, 1)}
    assert all(e["EXTRA"] == "yes" and e["PELOTON_PEERS"] == ",".join(peers) for e in envs.values())


def test_remote_ranks_are_stopped_when_the_run_fails(fake_ssh: Path, tmp_path: Path) -> None:
    out = tmp_path / "pids"
    out.mkdir()
    code = (
        "import os, sys, time; d = sys.argv[1]\n"
        "open(os.path.join(d, os.environ['PELOTON_RANK']), 'w').write(str(os.getpid()))\n"
        "if os.environ['PELOTON_RANK'] == '0':\n"
        "    while len(os.listdir(d)) < 3: time.sleep(0.01)\n"
        "    sys.exit(5)\n"
        "time.sleep(300)\n"
    )
    proc = run(
        "-np", "3", "-H", "localhost:1,nodeb:2", "--ssh", str(fake_ssh),
        sys.executable, "-c", code, str(out),
    )  # fmt: skip
    assert proc.returncode == 5, proc.stderr
    pids = [int((out / r).read_text()) for r in "12"]
    wait_for(lambda: not any(alive(p) for p in pids), "the remote ranks to end")


def test_remote_command_quotes_everything() -> None:
    line = remote_command(["echo", "a b", "$HOME"], {"K": "v w"}, "/some dir")
    assert line.startswith("cd '/some dir' || exit 127;")
    assert "env K='v w' echo 'a b' '$HOME'" in line
