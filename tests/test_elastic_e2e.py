"""Elastic gangs end to end: a ``peloton server`` process on PostgreSQL, a minicluster whose
agents run real processes, and elastic jobs (``gang: {min_instances, max_instances}``) whose
workers train with :mod:`peloton.collective.elastic` against the daemon's rendezvous endpoint.

The acceptance test of elastic gangs: a gang of 2 to 6 one-GPU ranks starts with 2 while another
job holds the rest of the cluster, grows to 6 when that job ends, shrinks to 4 (not restarted:
its first ranks keep their first attempt) when a higher-priority gang takes 2 GPUs, goes on at 3
from its last commit after one rank is SIGKILLed, and succeeds with exactly the parameters its
steps imply. Every change is observed, not slept through: the trainer takes steps only as far as
the test allows (a file it reads), and the test waits for the job's events, its elastic status,
and the trainer's own log. Below its minimum, an elastic gang fails with a reason instead of
hanging.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import (
    DONE,
    Peloton,
    Samples,
    run_peloton,
    scrape_metrics,
    start_minicluster,
    wait_for,
)
from elastic_support import (
    Events,
    allow,
    attempts,
    drained,
    finish,
    holder,
    out_dir,
    sigkilled,
    spec,
    starts_small_and_grows,
    stderr_of,
    steps_log,
    trained,
    wait_size,
    wait_step,
    worker,
)
from test_collective_horovod_elastic import committed_batches, padding

from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2

pytestmark = pytest.mark.parametrize("backend", ["postgresql"])

# Three agents of 2 GPUs: 6 one-GPU ranks at most, and cpu enough for every job here.
AGENT = "cpus:4;mem:8192;disk:10000;gpus:2;ports:[31000-31100]"

# The steps the test allows in each phase (of elastic_support's trainer): size 2, grown to 6,
# shrunk to 4, then (after the SIGKILL at step 14, last commit at 12) at 3 to the end.
AT_2, AT_6, AT_4 = 6, 10, 14


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    agents = [AgentSpec(f"agent-{i}", resources=AGENT) for i in range(3)]
    mc = start_minicluster(agents, tmp_path / "cluster")
    yield mc
    mc.stop()


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return out_dir(tmp_path)


def test_an_elastic_gang_grows_shrinks_survives_a_sigkill_and_ends_with_the_committed_model(
    peloton: Peloton, tmp_path: Path, out: Path
) -> None:
    # Another job holds 4 of the 6 GPUs until the test lets it end.
    release = out / "release-blocker"
    blocker = peloton.client.create_job(
        spec("blocker", holder(tmp_path, release), instances=2, gpu=2)
    ).job_id
    peloton.wait_running(blocker)

    # Preemptible (the higher-priority gang shrinks it); a failed rank may rejoin only after
    # 300 s: the gang goes on without it to the end.
    job_id = peloton.client.create_job(
        spec(
            "elastic",
            worker(tmp_path, out),
            elastic=(2, 6),
            preemptible=True,
            max_failures=1,
            backoff_seconds=300,
        )
    ).job_id
    events = Events(peloton.proc.address, job_id)
    try:
        # Only 2 fit: the gang starts with 2 (instances 0 and 1), the rest wait. The other job
        # ends: the gang grows into its GPUs, one task at a time, to 6.
        starts_small_and_grows(peloton, events, job_id, out, (2, 6), blocker, release, AT_2)
        allow(out, AT_6)
        wait_step(out, AT_6 - 1, 6, peloton, job_id)
        samples = scrape_metrics(peloton.proc.metrics_port)
        assert samples[("peloton_elastic_gang_size", (("job_id", job_id),))] == 6

        # A higher-priority gang needs 2 GPUs: the elastic gang is shrunk by its 2 highest
        # instances (drained, state kept), not restarted.
        urgent, urgent_flag = drained(peloton, events, job_id, tmp_path, out, 6, 4)
        allow(out, AT_4)
        wait_step(out, AT_4 - 1, 4, peloton, job_id)

        # SIGKILL of instance 3 between commits (the last at step 12): the survivors restore
        # it, re-form at 3 and redo steps 12 and 13.
        sigkilled(peloton, events, job_id, out, 3, 4, AT_4 - 1)
        samples = scrape_metrics(peloton.proc.metrics_port)
        assert samples[("peloton_elastic_steps_lost_total", ())] >= 2
        job = finish(peloton, job_id, out)
        urgent_flag.touch()
        assert peloton.wait_done(urgent).state == job_pb2.JOB_STATE_SUCCEEDED
    finally:
        events.close()

    trained(out)
    # Rank 0's log: each phase at its size; steps 12 and 13 applied at 4, lost, redone at 3.
    last = {step: size for _, size, step in steps_log(out)}
    assert last == {s: 2 if s < 6 else 6 if s < 10 else 4 if s < 12 else 3 for s in range(18)}
    applied = [(size, step) for _, size, step in steps_log(out)]
    assert applied.count((4, 12)) == applied.count((3, 12)) == 1, applied
    generations = [g for g, _, _ in steps_log(out)]
    assert generations == sorted(generations) and generations[0] == 1, generations

    # GetJob's elastic status is the last generation's; the first ranks never restarted.
    status = job.elastic
    assert (status.min_instances, status.max_instances, status.size) == (2, 6, 3), status
    assert status.generation == generations[-1], (status, generations)
    tasks = attempts(peloton, job_id)
    assert {i: tasks[i] for i in range(3)} == dict.fromkeys(range(3), (1, "TASK_STATE_SUCCEEDED"))
    # The slots it never grew back into were killed when it finished.
    for i in (3, 4, 5):
        task = peloton.client.get_task(job_id, i).task
        assert (task.current.state, task.current.reason) == (
            job_pb2.TASK_STATE_KILLED,
            "gang_finished",
        ), task.current
    resizes = events.resizes()
    assert resizes[0] == "started with 2 ranks (generation 1)", resizes
    assert len(resizes) == status.generation, resizes

    # The endpoint closes with the job: no size is exported for it any more.
    def closed() -> Samples | None:
        samples = scrape_metrics(peloton.proc.metrics_port)
        return None if any(k[0] == "peloton_elastic_gang_size" for k in samples) else samples

    samples = wait_for(closed, 10, "no peloton_elastic_gang_size once the job ended", 0.1)
    causes = {
        labels[0][1]: v
        for (name, labels), v in samples.items()
        if name == "peloton_elastic_resizes_total"
    }
    assert causes["started"] == causes["preempted"] == causes["task_failed"] == 1, causes
    assert causes["capacity_freed"] == status.generation - 3, causes
    assert samples[("peloton_elastic_rendezvous_seconds_count", ())] == status.generation
    assert samples[("peloton_elastic_steps_lost_total", ())] >= 2

    # The CLI: `job get` prints the gang's elastic status, `job watch` its resizes.
    got = run_peloton("job", "get", job_id, server=peloton.proc.address)
    assert got.returncode == 0, got.stderr
    assert re.search(
        rf"^Elastic: +3 ranks, generation {status.generation} \(min 2, max 6\)$",
        got.stdout,
        re.M,
    ), got.stdout
    watched = run_peloton("job", "watch", job_id, server=peloton.proc.address)
    assert watched.returncode == 0, watched.stderr
    for message in resizes:
        assert message in watched.stdout, (message, watched.stdout)


def test_an_elastic_gang_below_its_minimum_fails_with_a_reason(
    peloton: Peloton, tmp_path: Path, out: Path
) -> None:
    started = time.monotonic()
    # One rank never joins: the other waits on the endpoint for a gang of 2 for 3 s, gives up
    # (the worker-side timeout) and the gang fails.
    command = worker(tmp_path, out, "straggler")
    straggler = peloton.client.create_job(
        spec("straggler", command, elastic=(2, 2), elastic_timeout_seconds=3)
    ).job_id
    # A rank of a gang at its minimum is SIGKILLed: below the minimum, with max_failures 0, the
    # gang fails at once.
    (out / "killed").mkdir()
    killed = peloton.client.create_job(
        spec("killed", worker(tmp_path, out / "killed"), elastic=(2, 2))
    ).job_id
    # Once both runtimes are up: a rank that dies while its peers connect stalls them for the
    # collective timeout (30 s) before they notice.
    up = {"formed-0-1", "formed-1-1"}
    wait_for(
        lambda: up <= {p.name for p in (out / "killed").iterdir()},
        30,
        "both ranks of the gang to be up",
        interval=0.05,
        state=lambda: peloton.describe(killed),
    )
    victim = int((out / "killed" / "pid-1-1").read_text())
    os.kill(victim, signal.SIGKILL)

    job = peloton.wait_done(killed, timeout=30)
    assert (job.state, job.reason) == (job_pb2.JOB_STATE_FAILED, "failed"), job
    assert job.message.startswith("instance 1 failed"), job.message
    assert "the gang failed 1 times (restart.max_failures is 0)" in job.message, job.message
    assert job.elastic.size == 2 and job.elastic.generation == 1, job.elastic

    job = peloton.wait_done(straggler, timeout=30)
    assert (job.state, job.reason) == (job_pb2.JOB_STATE_FAILED, "failed"), job
    assert job.message.startswith("instance 0 failed"), job.message
    # Never formed; the worker says why it gave up.
    assert (job.elastic.size, job.elastic.generation) == (0, 0), job.elastic
    log = stderr_of(peloton, straggler, 0)
    assert "no generation of at least min=2 workers formed within 3 s" in log, log
    elapsed = time.monotonic() - started
    assert elapsed < 20, elapsed


HOROVOD_SCRIPT = Path(__file__).with_name("horovod_elastic_train.py")
HOROVOD_SAMPLES = 240


def stdout_of(p: Peloton, job_id: str, instance: int, attempt: int = 0) -> str:
    """A task's stdout (of ``attempt``; default: the latest), read from its agent."""
    data, offset = b"", 0
    while True:
        piece = p.client.get_task_logs(job_id, instance, offset=offset, attempt=attempt)
        if not piece.data:
            return data.decode(errors="replace")
        data += piece.data
        offset = piece.offset + len(piece.data)


@pytest.mark.parametrize("grows", [False, True], ids=["fixed-3", "grows-2-to-3"])
def test_a_horovod_elastic_script_runs_as_an_elastic_gang_with_only_its_import_changed(
    peloton: Peloton, tmp_path: Path, out: Path, grows: bool
) -> None:
    """tests/horovod_elastic_train.py, written as Horovod's elastic examples are (hvd.init(),
    hvd.elastic.run, TorchState with an ElasticSampler, reset callbacks), as the command of an
    elastic job: it trains every sample of each epoch across however many ranks the gang had
    (the sampler's padding aside), and succeeds. Either a gang of 3 from the start, or a gang of
    2 to 3 that starts with 2 while another job holds the other GPUs and grows to 3 in the
    middle of its first epoch when that job ends."""
    gate = out / "gate"
    command = (
        f"exec {sys.executable} {HOROVOD_SCRIPT} --out {out} --samples {HOROVOD_SAMPLES} "
        f"--epochs 2 --gate {gate} --gate-at 10"
    )
    release = out / "release-blocker"
    if grows:
        blocker = peloton.client.create_job(
            spec("blocker", holder(tmp_path, release), instances=2, gpu=2)
        ).job_id
        peloton.wait_running(blocker)
    else:
        gate.touch()
    job_id = peloton.client.create_job(
        spec("horovod-elastic", command, elastic=(2, 3) if grows else (3, 3))
    ).job_id

    def state() -> str:
        tails = {i: stderr_of(peloton, job_id, i)[-1500:] for i in range(3)}
        return f"{peloton.describe(job_id)}; stderr tails {tails}"

    if grows:
        # Started with 2, waiting at batch 10: the blocker ends, the third task starts and
        # joins, and the gang takes it in at its next commit.
        wait_size(peloton, job_id, 2)
        release.touch()
        joined = f"closed: worker {job_id}-2-"  # its attempt id, in the endpoint's log

        wait_for(
            lambda: joined in peloton.proc.stderr_path.read_text(),
            60,
            "the third task to join the gang's endpoint",
            interval=0.1,
            state=state,
        )
        gate.touch()
    job = wait_for(
        lambda: (j := peloton.client.get_job(job_id)).state in DONE and j,
        120,
        f"job {job_id} to end",
        interval=0.2,
        state=state,
    )
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, state()
    # Each task's log, its lines tagged with its instance as peloton-run tags them with a rank.
    logs = {i: stdout_of(peloton, job_id, i) for i in range(3)}
    tagged = "\n".join(f"[{i}] {line}" for i, log in logs.items() for line in log.splitlines())
    seen: dict[int, Counter[int]] = {0: Counter(), 1: Counter()}
    for i in logs:
        for epoch, index in committed_batches(tagged, str(i)):
            seen[epoch].update(index)
    extra = padding(tagged, first_size=2 if grows else 3)
    for epoch, counts in seen.items():
        assert set(counts) == set(range(HOROVOD_SAMPLES)), (epoch, counts, tagged)
        assert counts.total() - HOROVOD_SAMPLES <= extra, (epoch, counts, extra, tagged)
    assert re.search(r"^final epoch 2$", logs[0], re.M), logs[0]
    watched = run_peloton("job", "watch", job_id, server=peloton.proc.address)
    assert watched.returncode == 0, watched.stderr
    first = 2 if grows else 3
    assert re.search(rf"job +started with {first} ranks \(generation 1\)", watched.stdout), (
        watched.stdout
    )
    if grows:
        assert re.search(r"job +resized 2 -> 3 \(capacity freed\)", watched.stdout), watched.stdout
        # The third rank joined in the middle of epoch 0 and trained on part of it.
        assert re.search(r"^reset 3 lr 0.03 at 0 ([1-9]\d*)$", logs[0], re.M), logs[0]
        assert re.search(r"^batch 0 ", logs[2], re.M), logs[2]
