"""``peloton minicluster up``: serves until SIGTERM, then no task process is left."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from daemon import wait_for
from minicluster_support import RawScheduler, get, task_info


def _up(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "peloton.cli", "minicluster", "up", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_up_serves_until_sigterm_and_cleans_up(tmp_path: Path) -> None:
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        "- {hostname: big, resources: 'cpus:16;mem:65536;disk:1000;gpus:8', attributes: r:9}\n"
        "- hostname: small\n  resources: {cpus: 2, mem: 1024, disk: 100, ports: ['31000-31001']}\n"
    )
    proc = _up("--agents-file", str(agents), "--work-dir", str(tmp_path / "work"))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("minicluster master at 127.0.0.1:"), line
        address = line.split()[3]
        _, _, body = get(address, "/master/state")
        slaves = {s["hostname"]: s for s in json.loads(body)["slaves"]}
        assert slaves["big"]["resources"]["gpus"] == 8 and slaves["big"]["attributes"]["r"] == 9
        assert slaves["small"]["resources"]["ports"] == "[31000-31001]"

        sched = RawScheduler(address).subscribe()
        task = task_info("cli-task", "echo $$ > pid; exec sleep 60")
        sched.launch_group(sched.offer("big"), [task])
        sched.ack(sched.update("cli-task", "TASK_STARTING"))
        sched.update("cli-task", "TASK_RUNNING")
        pid_file = next((tmp_path / "work").rglob("cli-task")) / "pid"

        def sleeping() -> int | None:
            # The shell writes its pid, then execs sleep: wait for both (a file and /proc have no
            # event to await). Before the exec, the pid's command line is still the shell's.
            text = pid_file.read_text().strip() if pid_file.exists() else ""
            return int(text) if text and _cmdline(int(text)) == "sleep\x0060\x00" else None

        pid = wait_for(
            sleeping,
            10,
            "the task's shell to write its pid and exec sleep 60",
            state=lambda: pid_file.read_text() if pid_file.exists() else "no pid file",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "minicluster stopped" in out
    # stop() reaps its task processes before the command exits.
    assert _cmdline(pid) != "sleep\x0060\x00"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def test_bad_agents_are_one_line_usage_errors(tmp_path: Path) -> None:
    proc = _up("--resources", "cpus:lots")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert err.strip() == "error: invalid: resource cpus: 'lots' is not a number"

    bad = tmp_path / "agents.yaml"
    bad.write_text("- {hostname: a, colour: blue}\n")
    proc = _up("--agents-file", str(bad))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert err.strip() == f"error: invalid: {bad}: agents[0]: unknown key colour"


def test_up_registers_agents_that_share_a_hostname_with_their_reservations(
    tmp_path: Path,
) -> None:
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        "- {hostname: node-a, resources: 'gpus(gpu):2;cpus(gpu):4;cpus:4;mem:8192;disk:100'}\n"
        "- {hostname: node-a, resources: 'cpus:2;mem:1024;disk:100'}\n"
    )
    proc = _up("--agents-file", str(agents), "--simulated")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("minicluster master at 127.0.0.1:"), line
        _, _, body = get(line.split()[3], "/master/state")
        reserved, plain = json.loads(body)["slaves"]
        assert reserved["hostname"] == plain["hostname"] == "node-a"
        assert reserved["id"] != plain["id"]
        assert reserved["reserved_resources"] == {"gpu": {"cpus": 4, "gpus": 2}}
        assert plain["reserved_resources"] == {}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
