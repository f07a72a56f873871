"""Every file in examples/ is valid, and the job examples run as written (but for their command)
on a minicluster through a daemon, placed as their comments say."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from daemon import Peloton, run_peloton, start_minicluster

from peloton.jobmgr.spec import load_job_spec_yaml, validate_job_spec
from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
JOB_FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml") if p.name != "minicluster-agents.yaml")
POOL_FILES = sorted(EXAMPLES.glob("pools/*.yaml"))
# Parents before children, as `peloton pool create` needs them.
POOL_ORDER = ("research", "vision", "nlp", "llm")

AGENT = "cpus:32;mem:262144;disk:100000;gpus:2;ports:[31000-31100]"
# (hostname, rack, GPU model): gpu-r3 is outside multi-rack-gang.yaml's racks and gpu-v100 has
# the wrong GPU model, so that gang may use only the other six.
HOSTS = [
    ("gpu-r1-a", "r1", "A100"),
    ("gpu-r1-b", "r1", "H100"),
    ("gpu-r1-v100", "r1", "V100"),
    ("gpu-r2-a", "r2", "A100"),
    ("gpu-r2-b", "r2", "A100"),
    ("gpu-r2-c", "r2", "H100"),
    ("gpu-r3-a", "r3", "A100"),
    ("gpu-r1-c", "r1", "A100"),
]
RACK = {host: rack for host, rack, _ in HOSTS}
MODEL = {host: model for host, _, model in HOSTS}


def load_job(name: str) -> job_pb2.JobSpec:
    return load_job_spec_yaml((EXAMPLES / name).read_text())


def test_every_example_is_there() -> None:
    assert JOB_FILES == [
        "gang-8gpu.yaml",
        "job.yaml",
        "multi-rack-gang.yaml",
        "preemptible-borrow.yaml",
        "single-gpu.yaml",
    ]
    assert sorted(p.stem for p in POOL_FILES) == sorted(POOL_ORDER)


@pytest.mark.parametrize("name", JOB_FILES)
def test_job_example_is_valid_and_its_pool_is_an_example(name: str) -> None:
    spec = load_job(name)
    validate_job_spec(spec)
    assert spec.pool in pool_paths()


def pool_paths() -> list[str]:
    # The pool files themselves are checked by the daemon: the cluster test creates them all.
    return sorted(yaml.safe_load(p.read_text())["path"] for p in POOL_FILES)


def test_pool_and_agent_examples_load() -> None:
    assert pool_paths() == ["/llm", "/research", "/research/nlp", "/research/vision"]
    agents = AgentSpec.load_file(EXAMPLES / "minicluster-agents.yaml")
    assert [a.hostname for a in agents] == ["gpu-r1-1", "gpu-r2-1"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    agents = [
        AgentSpec(host, resources=AGENT, attributes=f"rack:{rack};gpu_model:{model}")
        for host, rack, model in HOSTS
    ]
    mc = start_minicluster(agents, tmp_path / "cluster")
    yield mc
    mc.stop()


def run_example(peloton: Peloton, spec: job_pb2.JobSpec) -> dict[int, str]:
    """Submit ``spec`` with a command that just exits 0; returns each instance's host once the
    job has SUCCEEDED."""
    spec.task.command = f"exec {sys.executable} -c pass"
    job_id = peloton.client.create_job(spec).job_id
    job = peloton.wait_done(job_id, timeout=60)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, (job.reason, job.message)
    return {t.instance_id: t.current.host for t in peloton.client.list_tasks(job_id).tasks}


@pytest.mark.parametrize("backend", ["sqlite"])
def test_job_examples_run_on_a_cluster_as_described(peloton: Peloton) -> None:
    for name in POOL_ORDER:
        created = run_peloton(
            "pool", "create", str(EXAMPLES / "pools" / f"{name}.yaml"), server=peloton.proc.address
        )
        assert created.returncode == 0, created.stderr

    hosts = run_example(peloton, load_job("single-gpu.yaml"))
    assert list(hosts) == [0]

    # Packed: 8 one-GPU workers on the fewest 2-GPU hosts.
    hosts = run_example(peloton, load_job("gang-8gpu.yaml"))
    assert len(hosts) == 8 and len(set(hosts.values())) == 4

    # Spread: one 2-GPU worker per host, only A100/H100 hosts in r1 and r2, over both racks.
    hosts = run_example(peloton, load_job("multi-rack-gang.yaml"))
    assert len(set(hosts.values())) == 4
    assert not {"gpu-r1-v100", "gpu-r3-a"} & set(hosts.values())
    assert {RACK[h] for h in hosts.values()} == {"r1", "r2"}
    assert len({MODEL[h] for h in hosts.values()}) == 1

    # The sweep wants 8 GPUs in a pool that reserves 4: only as a preemptible gang may it borrow.
    hosts = run_example(peloton, load_job("preemptible-borrow.yaml"))
    assert len(hosts) == 8
    spec = load_job("preemptible-borrow.yaml")
    spec.preemption.preemptible = False
    job_id = peloton.client.create_job(spec).job_id
    job = peloton.wait_done(job_id, timeout=30)
    assert (job.state, job.reason) == (job_pb2.JOB_STATE_FAILED, "gang_infeasible"), job
