"""``make demo``: a 4-worker gang trains a model with the bundled allreduce on a local cluster.

Starts ``peloton minicluster up`` (2 agents x 2 GPUs on racks r1 and r2) and ``peloton server`` on
embedded SQLite in ``.demo/`` (or ``--dir``), creates a pool tree, submits a gang whose workers run
:mod:`peloton.demo_train`, and shows states, placement and each worker's loss until the job ends.
Runs the real ``peloton`` commands (printed as it goes) and leaves nothing running, whatever
happens (Ctrl-C included).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from peloton.client import PelotonClient
from peloton.minicluster import AgentSpec
from peloton.v1 import job_pb2

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / ".demo"
AGENTS_FILE = "examples/minicluster-agents.yaml"  # relative to ROOT, where the commands run
POOLS = ("examples/pools/research.yaml", "examples/pools/vision.yaml")
PELOTON = [sys.executable, "-m", "peloton.cli"]
START_TIMEOUT = 30.0
JOB_TIMEOUT = 120.0
POLL_SECONDS = 0.25
WORKERS = 4
DONE = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_KILLED)
LOSS_RE = re.compile(rb"step (\d+) loss ([0-9.]+) shard loss ([0-9.]+)")

JOB_SPEC = """\
# Written by `make demo`: 4 workers, one GPU each, started together; they train with
# peloton.collective (see peloton/demo_train.py).
name: demo-logreg
pool: /research/vision
instances: {workers}
task:
  # exec: the worker itself receives a kill's SIGTERM, not a shell in between.
  command: exec {python} -m peloton.demo_train --out {out}
  resources: {{cpu: 1, mem_mb: 512, gpu: 1}}
  constraints: [{{attribute: gpu_model, op: in, values: [A100, H100]}}]
restart: {{max_failures: 1, backoff_seconds: 0}}
max_runtime_seconds: 300
"""


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


class Child:
    """A ``peloton`` subcommand running in the background, logging to ``log_dir/NAME.log``."""

    def __init__(self, name: str, args: Sequence[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        print(f"$ peloton {' '.join(args)} &   (log: {shown(self.log)})", flush=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*PELOTON, *args], env=env, stdout=log, stderr=log, cwd=ROOT
            )

    def wait_for(self, ready: Path | re.Pattern[str]) -> str:
        """Poll until ``ready`` (a file, written atomically, or a pattern in the log) appears;
        returns the file's text or the pattern's group."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if isinstance(ready, Path):
                if ready.exists():
                    return ready.read_text()
            else:
                found = ready.search(self.log.read_text(errors="replace"))
                if found:
                    return found.group(1)
            if self.proc.poll() is not None:
                raise SystemExit(f"demo failed: the {self.name} exited; see {self.log}")
            if time.monotonic() > deadline:
                raise SystemExit(f"demo failed: the {self.name} did not start; see {self.log}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        print(f"$ kill -TERM {self.proc.pid}   ({self.name})", flush=True)
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        print(f"{self.name} pid {self.proc.pid} exited with status {code}", flush=True)


class Progress:
    """Prints a line whenever the job's state, a task's state or host, or a worker's newest
    logged loss changes."""

    def __init__(
        self, client: PelotonClient, job_id: str, racks: dict[str, str], console: str
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.racks = racks
        self.console = console
        self.drawn = False  # the console's cluster page was shown holding the running gang
        # By (instance, attempt): how much of its stdout was read, and its unfinished last line.
        self.offsets: dict[tuple[int, int], int] = {}
        self.partial: dict[tuple[int, int], bytes] = {}
        self.loss: dict[int, tuple[int, str, str]] = {}
        self.last = ""
        self.start = time.monotonic()

    def _read_losses(self, tasks: Sequence[job_pb2.Task]) -> None:
        for t in tasks:
            if not t.current.host:
                continue
            i = t.instance_id
            # A restarted gang's tasks log afresh, in a new attempt's sandbox.
            run = (i, t.current.attempt)
            piece = self.client.get_task_logs(self.job_id, i, offset=self.offsets.get(run, 0))
            if not piece.data:
                continue
            self.offsets[run] = piece.offset + len(piece.data)
            text = self.partial.get(run, b"") + piece.data
            lines = text.split(b"\n")
            self.partial[run] = lines.pop()  # an unfinished last line waits for the next read
            for line in lines:
                found = LOSS_RE.search(line)
                if found:
                    self.loss[i] = (
                        int(found.group(1)),
                        found.group(2).decode(),
                        found.group(3).decode(),
                    )

    def poll(self) -> job_pb2.Job:
        job = self.client.get_job(self.job_id)
        tasks = list(self.client.list_tasks(self.job_id).tasks)
        self._read_losses(tasks)
        cells = []
        for t in tasks:
            state = job_pb2.TaskState.Name(t.state).removeprefix("TASK_STATE_")
            cell = f"rank {t.instance_id} {state}"
            if t.current.host:
                cell += f" on {t.current.host} (rack {self.racks.get(t.current.host, '?')})"
            if t.instance_id in self.loss:
                step, loss, shard = self.loss[t.instance_id]
                cell += f": step {step}, loss {loss} (on its shard {shard})"
            cells.append(cell)
        line = f"job {job_pb2.JobState.Name(job.state).removeprefix('JOB_STATE_')}"
        if line + "".join(cells) != self.last:
            self.last = line + "".join(cells)
            print(f"[{time.monotonic() - self.start:5.1f}s] {line}", flush=True)
            for cell in cells:
                print(f"          {cell}", flush=True)
        if job.state == job_pb2.JOB_STATE_RUNNING and not self.drawn:
            self.drawn = self._show_console()
        return job

    def _show_console(self) -> bool:
        """Print which GPUs the console's cluster page draws the gang on, once it draws every
        task (False until then)."""
        url = f"{self.console}/api/v1/cluster"
        with urllib.request.urlopen(url, timeout=10) as response:
            cluster = json.load(response)
        held = {
            host["hostname"]: [g["index"] for g in host["gpus"] if g["job_id"] == self.job_id]
            for rack in cluster["racks"]
            for host in rack["hosts"]
        }
        drawn = {host: gpus for host, gpus in held.items() if gpus}
        if sum(len(gpus) for gpus in drawn.values()) < WORKERS:
            return False
        where = ", ".join(f"{h} GPUs {','.join(map(str, g))}" for h, g in sorted(drawn.items()))
        print(f"$ curl -s {url}   (what {self.console}/#/cluster draws)", flush=True)
        print(f"          the gang holds {where}", flush=True)
        return True

    def until_done(self) -> job_pb2.Job:
        deadline = time.monotonic() + JOB_TIMEOUT
        while True:
            job = self.poll()
            if job.state in DONE:
                return job
            if time.monotonic() > deadline:
                raise SystemExit(f"demo failed: job {self.job_id} did not end in {JOB_TIMEOUT:g}s")
            time.sleep(POLL_SECONDS)  # the API has no stream for task logs; poll


def racks_of_agents() -> dict[str, str]:
    racks = {}
    for spec in AgentSpec.load_file(ROOT / AGENTS_FILE):
        found = re.search(r"rack:([^;]+)", spec.attributes)
        racks[spec.hostname] = found.group(1) if found else "?"
    return racks


def show_metrics(port: int) -> None:
    url = f"http://127.0.0.1:{port}/metrics"
    print(f"$ curl -s {url} | grep -E '^peloton_(gang|placement)\\w*(_total|_count)'", flush=True)
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if re.match(r"peloton_(gang|placement)\w*(_total|_count)[ {]", line):
            print(line, flush=True)


def shown(path: Path) -> str:
    """``path`` as the commands, run in ROOT, take it: relative when inside ROOT."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def final_losses(out_dir: Path) -> list[float]:
    records = [json.loads((out_dir / f"rank-{r}.json").read_text()) for r in range(WORKERS)]
    return [float(r["loss"]) for r in records]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help="Where everything goes (emptied first)."
    )
    demo_dir = parser.parse_args(argv).dir.resolve()
    out_dir = demo_dir / "out"  # where each rank writes its final parameters
    shutil.rmtree(demo_dir, ignore_errors=True)
    demo_dir.mkdir(parents=True)
    # The tasks get their own PELOTON_* from the scheduler; none of ours may leak into them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PELOTON_")}
    env["PELOTON_LOG_FORMAT"] = "json"
    children: list[Child] = []
    try:
        say("1. Start a local cluster: 2 agents x 2 GPUs (A100), on racks r1 and r2")
        print((ROOT / AGENTS_FILE).read_text().rstrip(), flush=True)
        cluster = Child(
            "minicluster",
            ["minicluster", "up", "--port", "0", "--agents-file", AGENTS_FILE,
             "--work-dir", shown(demo_dir / "cluster"), "--log-level", "warning"],
            env, demo_dir,
        )  # fmt: skip
        children.append(cluster)
        master = cluster.wait_for(re.compile(r"minicluster master at (\S+)"))

        say("2. Create the embedded SQLite database and start the daemon")
        run("db", "upgrade", "--data-dir", shown(demo_dir), env=env)
        port_file = demo_dir / "ports"
        daemon = Child(
            "server",
            ["server", "--data-dir", shown(demo_dir), "--grpc-port", "0", "--metrics-port", "0",
             "--console-port", "0", "--port-file", shown(port_file), "--mesos-master", master,
             "--offer-refuse-seconds", "1"],
            env, demo_dir,
        )  # fmt: skip
        children.append(daemon)
        grpc_port, metrics_port, console_port = daemon.wait_for(port_file).split()
        env["PELOTON_SERVER"] = f"127.0.0.1:{grpc_port}"
        console = f"http://127.0.0.1:{console_port}"
        print(f"daemon pid {daemon.proc.pid}: gRPC on {env['PELOTON_SERVER']}", flush=True)
        print(f"web console: {console}", flush=True)
        print(f"minicluster pid {cluster.proc.pid}: master at {master}", flush=True)

        say("3. Create a pool tree: /research with the leaf pool /research/vision")
        for path in POOLS:
            run("pool", "create", path, env=env)
        run("pool", "tree", env=env)

        say(f"4. Submit a {WORKERS}-worker gang that trains logistic regression with allreduce")
        spec_file = demo_dir / "train.yaml"
        spec_file.write_text(JOB_SPEC.format(workers=WORKERS, python=sys.executable, out=out_dir))
        print(spec_file.read_text().rstrip(), flush=True)
        submitted = run("job", "submit", shown(spec_file), env=env)
        job_id = submitted.split()[1]
        print(
            f"console: {console}/#/jobs/{job_id}   (open it to watch the gang on its GPUs)",
            flush=True,
        )

        say("5. Watch it: job and task states, where each rank runs, each worker's loss")
        with PelotonClient(env["PELOTON_SERVER"], timeout=10) as client:
            job = Progress(client, job_id, racks_of_agents(), console).until_done()
        run("task", "list", job_id, env=env)
        if job.state != job_pb2.JOB_STATE_SUCCEEDED:
            run("job", "get", job_id, env=env)
            raise SystemExit(f"demo failed: job {job_id} ended {job_pb2.JobState.Name(job.state)}")
        run("task", "get", job_id, "0", env=env)
        run("task", "logs", job_id, "0", env=env)

        say("6. Pools, hosts and metrics")
        run("pool", "get", "/research/vision", env=env)
        run("host", "list", env=env)
        show_metrics(int(metrics_port))
    finally:
        for child in reversed(children):
            child.stop()
    losses = final_losses(out_dir)
    where = shown(demo_dir)
    say("Done")
    print(
        f"Job {job_id} SUCCEEDED: {WORKERS} workers, final loss {losses[0]:.6f} (the ranks differ\n"
        f"by at most {max(losses) - min(losses):.1e}).\n"
        f"Final parameters of each rank: {where}/out/rank-N.json\n"
        f"Task sandboxes (stdout, stderr): {where}/cluster/\n"
        f"Logs of the daemon and the minicluster: {where}/server.log, {where}/minicluster.log\n"
        f"The database: {where}/peloton.db\n"
        "With a daemon running, look around with: peloton pool tree, peloton host list,\n"
        "peloton job list, peloton task logs JOB_ID 0, its web console (default\n"
        "http://127.0.0.1:8392) and its metrics URL (default http://127.0.0.1:9392/metrics).\n"
        "Nothing is left running.",
        flush=True,
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        # main's finally has stopped the daemon and the cluster (and with it every task).
        print("\ninterrupted; nothing is left running", flush=True)
        sys.exit(130)
