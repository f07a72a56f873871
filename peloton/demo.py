"""``make demo``: the daemon on embedded SQLite, a job submitted, and the job surviving a restart.

Runs the real ``peloton`` commands (printed as it goes) against a real daemon process in ``.demo/``
and leaves nothing running, whatever happens.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO_DIR = ROOT / ".demo"
JOB_FILE = "examples/job.yaml"  # relative to ROOT, where the commands run
PELOTON = [sys.executable, "-m", "peloton.cli"]
START_TIMEOUT = 30.0


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def run(*args: str, env: dict[str, str]) -> str:
    print(f"$ peloton {' '.join(args)}", flush=True)
    out = subprocess.run([*PELOTON, *args], env=env, text=True, capture_output=True, cwd=ROOT)
    text = out.stdout.rstrip()
    if text:
        print(text, flush=True)
    if out.returncode != 0:
        raise SystemExit(f"demo failed: peloton {' '.join(args)}: {out.stderr.strip()}")
    return text


class Daemon:
    """A ``peloton server`` process on the demo's SQLite database."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.port_file = DEMO_DIR / "ports"
        self.log = DEMO_DIR / "server.log"

    def start(self) -> int:
        self.port_file.unlink(missing_ok=True)
        cmd = [
            *PELOTON,
            "server",
            "--data-dir",
            str(DEMO_DIR),
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--port-file",
            str(self.port_file),
        ]
        print(f"$ peloton server --data-dir {DEMO_DIR.name} ...   (log: {self.log})", flush=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.port_file.exists():
            if self.proc.poll() is not None:
                raise SystemExit(f"demo failed: the daemon exited; see {self.log}")
            if time.monotonic() > deadline:
                raise SystemExit(f"demo failed: the daemon did not start; see {self.log}")
            time.sleep(0.05)
        grpc_port, metrics_port = self.port_file.read_text().split()
        print(
            f"daemon pid {self.proc.pid}: gRPC on 127.0.0.1:{grpc_port}, "
            f"metrics on http://127.0.0.1:{metrics_port}/metrics",
            flush=True,
        )
        return int(grpc_port)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        print(f"$ kill -TERM {self.proc.pid}", flush=True)
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        print(f"daemon exited with status {code}", flush=True)


def main() -> None:
    shutil.rmtree(DEMO_DIR, ignore_errors=True)
    DEMO_DIR.mkdir()
    env = {**os.environ, "PELOTON_LOG_FORMAT": "json"}
    daemon = Daemon(env)
    try:
        say("1. Create the embedded SQLite database")
        run("db", "upgrade", "--data-dir", DEMO_DIR.name, env=env)

        say("2. Start the daemon")
        env["PELOTON_SERVER"] = f"127.0.0.1:{daemon.start()}"

        say("3. Create a pool tree: /research with leaf pools /research/vision and /research/nlp")
        for name in ("research", "vision", "nlp"):
            run("pool", "create", f"examples/pools/{name}.yaml", env=env)
        run("pool", "tree", env=env)

        say("4. Submit the example job (examples/job.yaml) and see why it waits")
        submitted = run("job", "submit", JOB_FILE, "--request-id", "demo-1", env=env)
        job_id = submitted.split()[1]
        run("job", "list", env=env)
        run("task", "list", job_id, env=env)
        run("job", "get", job_id, env=env)

        say("5. Restart the daemon: the job and the pools must survive")
        daemon.stop()
        env["PELOTON_SERVER"] = f"127.0.0.1:{daemon.start()}"
        run("job", "get", job_id, env=env)
        run("job", "submit", JOB_FILE, "--request-id", "demo-1", env=env)
        run("pool", "get", "/research/vision", env=env)

        say("6. Kill it and look at its history")
        run("job", "kill", job_id, "--message", "demo over", env=env)
        run("task", "get", job_id, "0", env=env)
    finally:
        daemon.stop()
    say("Done")
    print(
        f"The job {job_id} outlived a daemon restart. Its database is {DEMO_DIR / 'peloton.db'};\n"
        f"the daemon's log is {daemon.log}. Nothing is left running.\n"
        "It waited with a reason: this demo runs no cluster, so no hosts offer capacity."
    )


if __name__ == "__main__":
    main()
