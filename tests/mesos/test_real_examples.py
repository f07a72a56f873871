"""The demo's training gang and every job example, each submitted to a daemon whose master is a
local real Mesos cluster, run to their documented end (tests/test_demo.py and
tests/test_examples.py do the same on a minicluster; their checks are reused here).

The demo runs on agents shaped as ``examples/minicluster-agents.yaml`` (2 x 2 A100 GPUs, racks r1
and r2), the examples on the agents of ``examples/minicluster-examples.yaml``, the cluster the
README starts for them. Agents of a local cluster share its address, so each is given its own port
range. Mesos's default executor gives a task the host's default PATH, not the agent's
environment: each example job adds the virtualenv's bin to its PATH (what a cluster does to put
its Python before the system's), its command unchanged.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import test_examples as minicluster_examples
from daemon import ROOT, run_peloton
from mesos_support import PelotonFactory, RealClusterFactory, agent_resources
from test_demo import one_process

from peloton import demo
from peloton.minicluster import AgentSpec
from peloton.v1 import job_pb2

# What Mesos's default executor puts on a task's PATH (os::host_default_path()).
HOST_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
pytestmark = [pytest.mark.parametrize("backend", ["sqlite"]), pytest.mark.local_shape]


def without_ports(resources: str) -> str:
    return ";".join(r for r in resources.split(";") if not r.startswith("ports"))


def test_the_demo_gang_trains_to_the_one_process_result(
    real_cluster: RealClusterFactory, make_peloton: PelotonFactory, tmp_path: Path
) -> None:
    agents = AgentSpec.load_file(ROOT / demo.AGENTS_FILE)
    cluster = real_cluster(
        agents=len(agents),
        per_agent={
            i: {
                "hostname": a.hostname,
                "attributes": a.attributes,
                "resources": agent_resources(i, without_ports(a.resources), ports=101),
            }
            for i, a in enumerate(agents)
        },
    )
    peloton = make_peloton(cluster)
    server = peloton.proc.address
    for path in demo.POOLS:
        pool = run_peloton("pool", "create", path, server=server)
        assert pool.returncode == 0, pool.stderr
    out = tmp_path / "out"
    spec_file = tmp_path / "train.yaml"
    spec_file.write_text(demo.JOB_SPEC.format(workers=demo.WORKERS, python=sys.executable, out=out))
    submitted = run_peloton("job", "submit", str(spec_file), server=server)
    assert submitted.returncode == 0, submitted.stderr
    created = re.search(r"job ([0-9a-f-]{36}) created", submitted.stdout)
    assert created is not None, submitted.stdout
    job_id = created.group(1)
    job = peloton.wait_done(job_id, timeout=demo.JOB_TIMEOUT)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, (job.reason, job.message)
    # A gang over both racks, one rank per GPU.
    hosts = {t.current.host for t in peloton.client.list_tasks(job_id).tasks}
    assert hosts == {a.hostname for a in agents}
    # The 4-worker result is the one-process result on the same data (as in test_demo).
    expected = one_process()
    for rank in range(demo.WORKERS):
        got = json.loads((out / f"rank-{rank}.json").read_text())
        assert (got["rank"], got["size"]) == (rank, demo.WORKERS)
        np.testing.assert_allclose(got["weights"], expected.weights, rtol=1e-6, atol=1e-9)
        assert got["loss"] == pytest.approx(expected.loss, rel=1e-9)


def test_every_job_example_runs_as_described(
    real_cluster: RealClusterFactory, make_peloton: PelotonFactory
) -> None:
    agents = minicluster_examples.agents()
    cluster = real_cluster(
        agents=len(agents),
        per_agent={
            i: {
                "hostname": a.hostname,
                "attributes": a.attributes,
                "resources": agent_resources(i, without_ports(a.resources), ports=101),
            }
            for i, a in enumerate(agents)
        },
    )
    # The same checks as on the minicluster, but that no GPU device is handed out (the local real
    # cluster accounts GPUs without isolating them).
    path = f"{Path(sys.executable).parent}:{HOST_DEFAULT_PATH}"
    minicluster_examples.run_every_example(
        make_peloton(cluster), env={"PATH": path}, gpus_isolated=False
    )
