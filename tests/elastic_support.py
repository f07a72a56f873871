"""The elastic trainer of the elastic-gang tests, and the helpers that drive it and watch its
gang (tests/test_elastic_e2e.py on a minicluster, tests/mesos/test_elastic_mesos.py on real Mesos):
the jobs' specs, their resize events (WatchJob), GetJob's elastic status, the trainer's own log,
and the phases of a gang's life the tests go through (started small and grown, drained by a
higher-priority gang, a rank SIGKILLed, finished), each checked as it happens.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
from daemon import Peloton, wait_for

from peloton.client import PelotonClient
from peloton.v1 import job_pb2

RUNNING = "TASK_STATE_RUNNING"
PENDING = "TASK_STATE_PENDING"

# The elastic trainer. Deterministic integer training: every step, each rank contributes
# grad(step, params) (the same on every rank: they hold rank 0's parameters) and the parameters
# move by the gang's sum divided by its size, so the result of every step is independent of the
# gang's size, and depends on the parameters: a step lost or applied twice changes the end.
# It takes only the steps the test allows (the number in out/allow, agreed by the ranks as their
# minimum); while it may not step it waits on the endpoint for a membership change and checks
# for one (no commit: what the last commit holds is what a failure rolls back to). Rank 0 logs
# "<generation> <size> <step>" for every step it applies; every worker writes its pid to
# out/pid-<instance>-<attempt> when it starts and out/formed-<instance>-<generation> once its
# runtime is up in a generation; rank 0 writes out/final.json at the end.
# ``straggler``: instance 1 never joins the endpoint (it sleeps), so instance 0 is below the
# minimum until its PELOTON_ELASTIC_TIMEOUT.
WORKER = r"""
import json, os, sys, time
import numpy as np
import peloton.collective as pc
from peloton.collective import elastic

out, total, commit_every, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
instance = int(os.environ["PELOTON_INSTANCE_ID"])
attempt = int(os.environ["PELOTON_ATTEMPT_ID"].rsplit("-", 1)[1])
with open(os.path.join(out, f"pid-{instance}-{attempt}"), "w") as f:
    f.write(str(os.getpid()))
if mode == "straggler" and instance == 1:
    time.sleep(120)
    sys.exit(0)
DIM = 8


def grad(step, params):
    return (params * 3 + step * 7 + np.arange(DIM)) % 11 - 5


def allowed():
    try:
        with open(os.path.join(out, "allow")) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def generation():
    return elastic.membership().generation


state = elastic.State(params=np.zeros(DIM, dtype=np.int64), step=0)


@elastic.run
def train(state):
    with open(os.path.join(out, f"formed-{instance}-{generation()}"), "w"):
        pass
    while state.step < total:
        limit = int(pc.allreduce(np.array([allowed()], dtype=np.int64), op="min", name="allow")[0])
        if state.step >= limit:
            elastic.wait_for_change(timeout=0.2)
            state.check_host_updates()
            continue
        g = grad(state.step, state.params)
        summed = pc.allreduce(g, op="sum", name=f"grad.{state.step}")
        assert (summed == g * pc.size()).all(), (summed, g, pc.size())
        state.params = state.params + summed // pc.size()
        if pc.rank() == 0:
            with open(os.path.join(out, "steps.log"), "a") as f:
                f.write(f"{generation()} {pc.size()} {state.step}\n")
        state.step += 1
        if state.step % commit_every == 0 or state.step == total:
            state.commit()
    return pc.rank()


if train(state) == 0:
    with open(os.path.join(out, "final.tmp"), "w") as f:
        json.dump({"params": [int(x) for x in state.params], "step": state.step}, f)
    os.replace(os.path.join(out, "final.tmp"), os.path.join(out, "final.json"))
"""

# A task that holds its resources until out/<name> exists.
HOLD = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"

DIM = 8
COMMIT_EVERY = 4
# The steps every trainer takes in all.
TOTAL = 18


def replay(steps: int) -> list[int]:
    """The parameters after ``steps`` steps, in one process."""
    params = np.zeros(DIM, dtype=np.int64)
    for step in range(steps):
        params = params + (params * 3 + step * 7 + np.arange(DIM)) % 11 - 5
    return [int(x) for x in params]


def spec(
    name: str,
    command: str,
    *,
    instances: int = 0,
    elastic: tuple[int, int] | None = None,
    gpu: float = 1,
    priority: int = 0,
    preemptible: bool = False,
    max_failures: int = 0,
    backoff_seconds: int = 0,
    elastic_timeout_seconds: int = 0,
) -> job_pb2.JobSpec:
    s = job_pb2.JobSpec(name=name, instances=instances, priority=priority)
    s.task.command = command
    s.task.resources.cpu = 0.5
    s.task.resources.mem_mb = 256
    s.task.resources.gpu = gpu
    if elastic is not None:
        s.gang.min_instances, s.gang.max_instances = elastic
        s.gang.elastic_timeout_seconds = elastic_timeout_seconds
    s.preemption.preemptible = preemptible
    s.preemption.kill_grace_seconds = 10
    s.restart.max_failures = max_failures
    s.restart.backoff_seconds = backoff_seconds
    return s


def worker(tmp_path: Path, out: Path, mode: str = "train") -> str:
    script = tmp_path / "elastic_worker.py"
    script.write_text(WORKER)
    # exec: the worker itself gets the scheduler's SIGTERM and the test's SIGKILL.
    return f"exec {sys.executable} {script} {out} {TOTAL} {COMMIT_EVERY} {mode}"


def holder(tmp_path: Path, flag: Path) -> str:
    script = tmp_path / "hold.py"
    script.write_text(HOLD)
    return f"exec {sys.executable} {script} {flag}"


class Events:
    """A job's events as ``peloton job watch`` gets them (WatchJob), collected by a thread."""

    def __init__(self, address: str, job_id: str) -> None:
        self.job_id = job_id
        self._client = PelotonClient(address, timeout=10)
        self._lock = threading.Lock()
        self.events: list[job_pb2.JobEvent] = []
        threading.Thread(target=self._read, daemon=True, name="watch").start()

    def _read(self) -> None:
        try:
            for response in self._client.watch_job(self.job_id):
                with self._lock:
                    self.events.append(response.event)
        except Exception as exc:  # the stream ends with the job, or the client is closed
            with self._lock:
                self.events.append(job_pb2.JobEvent(reason="watch-ended", message=repr(exc)))

    def resizes(self) -> list[str]:
        """The messages of the job's resize events (job events whose state did not change)."""
        with self._lock:
            return [
                e.message
                for e in self.events
                if not e.has_instance and e.reason == "resized" and e.from_state == e.to_state
            ]

    def wait(self, pattern: str, timeout: float, describe: Callable[[], object]) -> str:
        """Until a resize event matches ``pattern``; the match (on timeout: the resizes seen
        and ``describe()``)."""

        def found() -> str | None:
            return next((m for m in self.resizes() if re.search(pattern, m)), None)

        return wait_for(
            found,
            timeout,
            f"a resize event of job {self.job_id} matching {pattern!r}",
            interval=0.05,
            state=lambda: f"resizes {self.resizes()}; {describe()}",
        )

    def close(self) -> None:
        self._client.close()


def steps_log(out: Path) -> list[tuple[int, int, int]]:
    """Rank 0's (generation, size, step) lines."""
    path = out / "steps.log"
    text = path.read_text() if path.exists() else ""
    return [tuple(int(x) for x in line.split()) for line in text.splitlines()]  # type: ignore[misc]


def allow(out: Path, steps: int) -> None:
    tmp = out / "allow.tmp"
    tmp.write_text(str(steps))
    tmp.replace(out / "allow")


def wait_step(out: Path, step: int, size: int, p: Peloton, job_id: str) -> None:
    """Until rank 0 logged ``step`` applied by a gang of ``size``."""
    wait_for(
        lambda: any(s == step and n == size for _, n, s in steps_log(out)),
        30,
        f"step {step} applied at size {size}",
        interval=0.05,
        state=lambda: f"log {steps_log(out)[-6:]}; {p.describe(job_id)}",
    )


def wait_size(p: Peloton, job_id: str, size: int, timeout: float = 30) -> job_pb2.ElasticStatus:
    """Until GetJob's elastic status reports ``size`` ranks; that status."""

    def sized() -> job_pb2.ElasticStatus | None:
        e = p.client.get_job(job_id).elastic
        return e if e.size == size else None

    return wait_for(
        sized,
        timeout,
        f"job {job_id}'s elastic status at size {size}",
        interval=0.05,
        state=lambda: f"{p.client.get_job(job_id).elastic}; {p.describe(job_id)}",
    )


def stderr_of(p: Peloton, job_id: str, instance: int, attempt: int = 0) -> str:
    """A task's stderr (of ``attempt``; default: the latest), read from its agent."""
    data, offset = b"", 0
    while True:
        piece = p.client.get_task_logs(
            job_id, instance, stderr=True, offset=offset, attempt=attempt
        )
        if not piece.data:
            return data.decode(errors="replace")
        data += piece.data
        offset = piece.offset + len(piece.data)


def attempts(p: Peloton, job_id: str) -> dict[int, tuple[int, str]]:
    return {
        t.instance_id: (t.current.attempt, job_pb2.TaskState.Name(t.current.state))
        for t in p.client.list_tasks(job_id).tasks
    }


def out_dir(tmp_path: Path) -> Path:
    """The trainer's directory (``out``): what the test allows, and what the trainer writes."""
    d = tmp_path / "out"
    d.mkdir()
    return d


def describer(p: Peloton, job_id: str, out: Path) -> Callable[[], str]:
    """What a wait on the gang prints when it times out: rank 0's last steps and the job."""
    return lambda: f"log {steps_log(out)[-6:]}; {p.describe(job_id)}"


def starts_small_and_grows(
    p: Peloton,
    events: Events,
    job_id: str,
    out: Path,
    bounds: tuple[int, int],
    blocker: str,
    release: Path,
    steps: int,
) -> None:
    """Job ``blocker`` (ended by ``release``) holds all but ``bounds[0]`` (the minimum) of the
    GPUs: the gang starts with that many ranks, instances 0 and up, the rest wait; it applies
    ``steps`` steps at that size. Then the blocker ends: the gang grows into its GPUs, one task
    at a time, to ``bounds[1]``, none of its ranks restarted."""
    least, most = bounds
    state = describer(p, job_id, out)
    assert events.wait(r"^started with \d+ ranks", 30, state) == (
        f"started with {least} ranks (generation 1)"
    )
    status = wait_size(p, job_id, least)
    assert (status.min_instances, status.max_instances, status.generation) == (*bounds, 1)
    tasks = attempts(p, job_id)
    assert {i for i, (_, s) in tasks.items() if s == RUNNING} == set(range(least)), tasks
    assert {s for i, (_, s) in tasks.items() if i >= least} == {PENDING}, tasks
    allow(out, steps)
    wait_step(out, steps - 1, least, p, job_id)

    release.touch()
    assert p.wait_done(blocker).state == job_pb2.JOB_STATE_SUCCEEDED
    status = wait_size(p, job_id, most)
    assert status.generation >= 2, status
    events.wait(rf"^resized \d+ -> {most} \(capacity freed\)$", 10, state)
    assert all(a == 1 for a, _ in attempts(p, job_id).values())


def drained(
    p: Peloton, events: Events, job_id: str, tmp_path: Path, out: Path, before: int, after: int
) -> tuple[str, Path]:
    """A gang of priority 100 needs ``before - after`` GPUs: the elastic gang (preemptible, at
    ``before`` ranks) is shrunk to ``after`` by its highest instances (drained, state kept), not
    restarted; the drained ranks left gracefully and wait (a new attempt) to grow back. The
    urgent job's id, and the file that ends it."""
    flag = out / "release-urgent"
    urgent = p.client.create_job(
        spec("urgent", holder(tmp_path, flag), instances=before - after, priority=100)
    ).job_id
    shrunk = events.wait(rf"^shrunk {before} -> {after} ", 30, describer(p, job_id, out))
    assert re.fullmatch(
        rf"shrunk {before} -> {after} \(preempted: job {urgent} of priority 100 needs .*\)",
        shrunk,
    ), shrunk
    wait_size(p, job_id, after)
    p.wait_running(urgent)
    tasks = attempts(p, job_id)
    kept = range(after)
    assert {i: tasks[i] for i in kept} == dict.fromkeys(kept, (1, RUNNING)), tasks
    for i in range(after, before):
        first = p.client.get_task(job_id, i).task.history[0]
        # KILLED, or SUCCEEDED if it left before the kill reached it: never FAILED.
        assert first.attempt == 1, first
        assert first.state in (job_pb2.TASK_STATE_KILLED, job_pb2.TASK_STATE_SUCCEEDED), first
        log = stderr_of(p, job_id, i, attempt=1)
        assert f"drained by the scheduler (job {urgent} of priority 100" in log, log
    assert {tasks[i] for i in range(after, before)} == {(2, PENDING)}, tasks
    return urgent, flag


def sigkilled(
    p: Peloton, events: Events, job_id: str, out: Path, victim: int, size: int, step: int
) -> None:
    """SIGKILL of instance ``victim`` (its first attempt) of a gang of ``size`` that applied
    ``step`` (between commits): the survivors restore the last commit, re-form without it and
    redo the steps since, up to ``step``."""
    os.kill(int((out / f"pid-{victim}-1").read_text()), signal.SIGKILL)
    state = describer(p, job_id, out)
    lost = events.wait(rf"^shrunk {size} -> {size - 1} ", 30, state)
    assert re.fullmatch(rf"shrunk {size} -> {size - 1} \(instance {victim} failed: .*\)", lost), (
        lost
    )
    wait_size(p, job_id, size - 1)
    wait_step(out, step, size - 1, p, job_id)
    log = stderr_of(p, job_id, 0)
    since = (step + 1) % COMMIT_EVERY
    assert re.search(rf"failed \(.*\): restoring the last commit \({since} steps lost\)", log), log


def finish(p: Peloton, job_id: str, out: Path) -> job_pb2.Job:
    """The trainer may take every step: the job succeeds (the job, ended)."""
    allow(out, TOTAL)
    job = p.wait_done(job_id, timeout=60)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, p.describe(job_id)
    return job


def trained(out: Path) -> None:
    """The model rank 0 wrote: exactly the TOTAL steps, each once, whatever the sizes it was
    trained at."""
    final = json.loads((out / "final.json").read_text())
    assert final == {"params": replay(TOTAL), "step": TOTAL}, final
