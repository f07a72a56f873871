"""Every file in examples/ is valid, and every job example runs as written on the cluster the
README tells a user to start for them (examples/minicluster-examples.yaml), through a daemon: the
pools created from examples/pools, each job file's own command run from the virtualenv (as after
``. .venv/bin/activate``), to the end its comment promises, placed as it says, with the workers'
output in the task logs. tests/mesos/test_real_examples.py runs the same checks on real Mesos.
The container example needs the cluster's image store (README "Task containers", whose commands
tests/test_readme_containers.py runs: it submits that example and checks its end); the local real
Mesos cluster has no image support, so it runs on the minicluster only. The elastic example's
trainer is a script of the checkout, which its command finds through the activated virtualenv (a
local cluster's tasks inherit the environment): it too runs on the minicluster only."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import yaml
from daemon import Peloton, run_peloton, start_minicluster, wait_for

from peloton.client import PelotonClient
from peloton.core.spec import load_job_spec_yaml, validate_job_spec, with_defaults
from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# The cluster the README starts for the examples (the demo's own is minicluster-agents.yaml).
AGENTS_FILE = EXAMPLES / "minicluster-examples.yaml"
JOB_FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("minicluster-"))
POOL_FILES = sorted(EXAMPLES.glob("pools/*.yaml"))
# Parents before children, as `peloton pool create` needs them (the README's order).
POOL_ORDER = ("research", "vision", "nlp", "llm")
# The loss of the demo's model trained in one process on all the data (tests/test_demo.py checks
# that a gang of any size ends there too); every worker of the examples prints it at the end.
FINAL_LOSS = "0.311601"
SWEEP_RATES = ("0.01", "0.03", "0.1", "0.3", "0.5", "1", "2", "4")


def load_job(name: str) -> job_pb2.JobSpec:
    return load_job_spec_yaml((EXAMPLES / name).read_text())


def agents() -> list[AgentSpec]:
    return AgentSpec.load_file(AGENTS_FILE)


def attribute(agent: AgentSpec, name: str) -> str:
    found = re.search(rf"\b{name}:([^;]+)", agent.attributes)
    assert found is not None, agent
    return found.group(1)


RACK = {a.hostname: attribute(a, "rack") for a in agents()}
MODEL = {a.hostname: attribute(a, "gpu_model") for a in agents()}


def test_every_example_is_there() -> None:
    assert JOB_FILES == [
        "container-allreduce.yaml",
        "elastic-torch.yaml",
        "gang-8gpu.yaml",
        "job.yaml",
        "multi-rack-gang.yaml",
        "preemptible-borrow.yaml",
        "single-gpu.yaml",
    ]
    assert sorted(p.stem for p in POOL_FILES) == sorted(POOL_ORDER)


@pytest.mark.parametrize("name", JOB_FILES)
def test_job_example_is_valid_and_says_where_it_runs(name: str) -> None:
    spec = load_job(name)
    validate_job_spec(with_defaults(spec))  # as `peloton job submit` and the daemon do
    assert spec.pool in pool_paths()
    assert AGENTS_FILE.name in (EXAMPLES / name).read_text()


def pool_paths() -> list[str]:
    # The pool files themselves are checked by the daemon: the cluster test creates them all.
    return sorted(yaml.safe_load(p.read_text())["path"] for p in POOL_FILES)


def test_pool_and_agent_examples_load() -> None:
    assert pool_paths() == ["/llm", "/research", "/research/nlp", "/research/vision"]
    demo = AgentSpec.load_file(EXAMPLES / "minicluster-agents.yaml")
    assert [a.hostname for a in demo] == ["gpu-r1-1", "gpu-r2-1"]
    assert RACK == {
        "gpu-r1-1": "r1",
        "gpu-r1-2": "r1",
        "gpu-r2-1": "r2",
        "gpu-r2-2": "r2",
        "gpu-r3-v100": "r3",
    }


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Minicluster]:
    # The agents pass their environment on to tasks: the virtualenv's python first on PATH and
    # VIRTUAL_ENV set, as in a shell where the README's `. .venv/bin/activate` ran.
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent), prepend=":")
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    mc = start_minicluster(agents(), tmp_path / "cluster")
    yield mc
    mc.stop()


def task_log(client: PelotonClient, job_id: str, instance: int, stderr: bool = False) -> str:
    """The whole stdout (or stderr) of the task's latest attempt, read from its agent."""
    data, offset = b"", 0
    while True:
        piece = client.get_task_logs(job_id, instance, offset=offset, stderr=stderr)
        if not piece.data:
            return data.decode(errors="replace")
        data += piece.data
        offset = piece.offset + len(piece.data)


def wait_for_log(client: PelotonClient, job_id: str, instance: int, text: str) -> None:
    """Until ``text`` is in the task's stdout (the log shown on timeout)."""
    wait_for(
        lambda: text in task_log(client, job_id, instance),
        30,
        f"{text!r} in the log of instance {instance}",
        interval=0.2,
        state=lambda: task_log(client, job_id, instance),
    )


def hosts_of(peloton: Peloton, job_id: str) -> dict[int, str]:
    return {t.instance_id: t.current.host for t in peloton.client.list_tasks(job_id).tasks}


def submit(peloton: Peloton, name: str, env: Mapping[str, str]) -> str:
    spec = load_job(name)
    spec.task.env.update(env)
    return peloton.client.create_job(spec).job_id


def succeeds(peloton: Peloton, name: str, env: Mapping[str, str]) -> tuple[str, dict[int, str]]:
    """Submit an example and wait for it to succeed; its id and each instance's host."""
    job_id = submit(peloton, name, env)
    job = peloton.wait_done(job_id, timeout=120)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, (name, peloton.describe(job_id))
    return job_id, hosts_of(peloton, job_id)


def assert_ranks_trained(peloton: Peloton, job_id: str, size: int) -> None:
    for rank in range(size):  # rank i is instance i
        log = task_log(peloton.client, job_id, rank)
        assert f"rank {rank}/{size} step 0 loss" in log, log
        assert log.rstrip().endswith(f"rank {rank} done: final loss {FINAL_LOSS}"), log


def run_every_example(
    peloton: Peloton, *, env: Mapping[str, str] | None = None, gpus_isolated: bool = True
) -> None:
    """Create the example pools and run every job example to its documented end, checking the
    placement its comment promises and its workers' output. ``env``: variables added to each job
    (its command unchanged); ``gpus_isolated``: the agents hand each task its GPU devices."""
    env = env or {}
    for name in POOL_ORDER:
        created = run_peloton(
            "pool", "create", str(EXAMPLES / "pools" / f"{name}.yaml"), server=peloton.proc.address
        )
        assert created.returncode == 0, created.stderr

    # One trial on one GPU, which it names.
    job_id, hosts = succeeds(peloton, "single-gpu.yaml", env)
    assert list(hosts) == [0]
    log = task_log(peloton.client, job_id, 0)
    gpus = r"GPUs [0-3]\n" if gpus_isolated else r"GPUs not isolated"
    assert re.search(rf"^trial 0 of job {job_id}: rank 0 of 1, {gpus}", log, re.M), log
    assert f"PELOTON_JOB_ID={job_id}\n" in log, log
    assert log.rstrip().endswith(f"trial 0 done: lr 0.5, final loss {FINAL_LOSS}"), log

    # Packed: 8 one-GPU ranks on two 4-GPU A100 hosts of one rack.
    job_id, hosts = succeeds(peloton, "gang-8gpu.yaml", env)
    per_host = sorted(list(hosts.values()).count(h) for h in set(hosts.values()))
    assert per_host == [4, 4], hosts
    assert {MODEL[h] for h in hosts.values()} == {"A100"}, hosts
    assert len({RACK[h] for h in hosts.values()}) == 1, hosts
    assert_ranks_trained(peloton, job_id, 8)

    # Spread: one 2-GPU rank on each A100 host of racks r1 and r2, none on the V100 of r3.
    job_id, hosts = succeeds(peloton, "multi-rack-gang.yaml", env)
    assert sorted(hosts.values()) == ["gpu-r1-1", "gpu-r1-2", "gpu-r2-1", "gpu-r2-2"], hosts
    assert_ranks_trained(peloton, job_id, 4)

    # Every field: 4 one-GPU ranks packed on one A100 host of rack r1.
    job_id, hosts = succeeds(peloton, "job.yaml", env)
    (host,) = set(hosts.values())
    assert (RACK[host], MODEL[host], len(hosts)) == ("r1", "A100", 4), hosts
    assert_ranks_trained(peloton, job_id, 4)

    # The sweep runs on 8 GPUs in a pool that reserves 4: it borrows what the idle pools lend.
    job_id = submit(peloton, "preemptible-borrow.yaml", env)
    peloton.wait_running(job_id, timeout=60)
    hosts = hosts_of(peloton, job_id)
    assert len(set(hosts.values())) == 2, hosts
    gpu = peloton.client.get_pool("/research/vision").status["gpu"]
    assert (gpu.reservation, gpu.allocation, gpu.borrowed) == (4, 8, 4), gpu
    tree = run_peloton("pool", "tree", "--kind", "gpu", server=peloton.proc.address)
    assert re.search(r"^   └─ vision .*▲ borrows 4 *$", tree.stdout, re.M), tree.stdout
    assert re.search(r"^├─ llm .*▽ lends", tree.stdout, re.M), tree.stdout
    for i, rate in enumerate(SWEEP_RATES):
        wait_for_log(peloton.client, job_id, i, f"trial {i} lr {rate} step 0 loss")
    killed = run_peloton("job", "kill", job_id, "-m", "enough", server=peloton.proc.address)
    assert killed.returncode == 0, killed.stderr
    job = peloton.wait_done(job_id, timeout=60)
    assert job.state == job_pb2.JOB_STATE_KILLED, peloton.describe(job_id)
    for i in range(len(SWEEP_RATES)):
        log = task_log(peloton.client, job_id, i)
        assert re.search(rf"^trial {i}: SIGTERM at step \d+: stopping$", log, re.M), log

    # Not preemptible, the sweep could only run within the reservation, which is too small.
    spec = load_job("preemptible-borrow.yaml")
    spec.preemption.preemptible = False
    job_id = peloton.client.create_job(spec).job_id
    job = peloton.wait_done(job_id, timeout=30)
    assert (job.state, job.reason) == (job_pb2.JOB_STATE_FAILED, "gang_infeasible"), job


@pytest.mark.parametrize("backend", ["sqlite"])
def test_job_examples_run_on_the_documented_cluster_as_described(peloton: Peloton) -> None:
    run_every_example(peloton)


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_elastic_example_starts_with_two_grows_to_four_and_trains(peloton: Peloton) -> None:
    for name in POOL_ORDER:
        created = run_peloton(
            "pool", "create", str(EXAMPLES / "pools" / f"{name}.yaml"), server=peloton.proc.address
        )
        assert created.returncode == 0, created.stderr
    job_id, hosts = succeeds(peloton, "elastic-torch.yaml", {})
    assert sorted(hosts) == [0, 1, 2, 3], hosts
    assert {MODEL[h] for h in hosts.values()} == {"A100"}, hosts

    # It started as soon as 2 ran, and grew to 4 as the other two joined.
    watched = run_peloton("job", "watch", job_id, server=peloton.proc.address)
    assert watched.returncode == 0, watched.stderr
    assert "started with 2 ranks (generation 1)" in watched.stdout, watched.stdout
    assert re.search(r"resized [23] -> 4 \(capacity freed\)", watched.stdout), watched.stdout
    elastic = peloton.client.get_job(job_id).elastic
    assert (elastic.min_instances, elastic.max_instances, elastic.size) == (2, 4, 4), elastic
    got = run_peloton("job", "get", job_id, server=peloton.proc.address)
    assert f"4 ranks, generation {elastic.generation} (min 2, max 4)" in got.stdout, got.stdout

    # Every rank trained at 4 with 4 times the learning rate of one, and ended with the model.
    started_at_2 = 0
    for i in range(4):
        log = task_log(peloton.client, job_id, i)
        sizes = [int(n) for n in re.findall(r"^rank \d/(\d): lr ", log, re.M)]
        assert sizes and sizes[-1] == 4, log
        for n, lr in re.findall(r"^rank \d/(\d): lr (\S+)$", log, re.M):
            assert float(lr) == pytest.approx(0.02 * int(n)), log
        started_at_2 += sizes[0] == 2
        assert re.search(r"^epoch 4 loss \d\.\d{4} \(4 ranks\)$", log, re.M), log
        done = re.search(r"rank \d done: 5 epochs, loss (\S+), accuracy (\S+)$", log.rstrip())
        assert done is not None, log
        assert float(done.group(1)) < 0.3 and float(done.group(2)) > 0.85, log
    assert started_at_2 == 2
