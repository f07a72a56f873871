"""Helpers and fixtures of the real-Mesos suite (``make test-mesos``); ``conftest.py`` makes the
fixtures available to every test in tests/mesos.

``real_cluster``: a factory of local real Mesos clusters (arguments of
:func:`realcluster.start_real_cluster`), all stopped after the test; their homes (logs, sandboxes)
stay in the test's tmp_path.

``mesos``: the cluster a scenario runs on: the master named by ``PELOTON_TEST_MESOS_MASTER`` (an
operator's cluster, left as it is) or, when that is unset, a fresh local real cluster of two agents
``agent-0`` and ``agent-1`` (``cpus:8;mem:16384;disk:20000;gpus:4``, ports 31000-31499 and
31500-31999, racks r1 and r2, A100).

``make_peloton(cluster, *flags)`` / ``peloton``: ``peloton server`` processes, frameworks of a
cluster under a unique name; each is stopped and its framework torn down after the test.
``local_cluster``: always a local real cluster of that shape.

What stays on the minicluster (tests/test_gang_e2e.py, tests/test_hostmgr_integration.py,
tests/test_minicluster_*.py): the local real cluster runs real master and agent code, but its
executors are Python stand-ins without isolation (GPUs are accounted, never handed out: no
``CUDA_VISIBLE_DEVICES``; tasks run as the user who started it, the framework's user only being
checked when the sandbox is chowned), all its agents are one process on one address (no agent
stopped, partitioned or restarted alone: an agent is lost here by the operator API's
MARK_AGENT_GONE), and it has no master failover. GPU device assignment, agents killed or
partitioned, dropped master connections and master restarts are tested on the minicluster.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from daemon import Peloton, wait_for
from realcluster import RealCluster, start_real_cluster

MASTER_ENV = "PELOTON_TEST_MESOS_MASTER"
RealClusterFactory = Callable[..., RealCluster]


def external_master() -> str:
    return os.environ.get(MASTER_ENV, "").strip()


@pytest.fixture(name="real_cluster")
def fixture_real_cluster(tmp_path: Path) -> Iterator[RealClusterFactory]:
    """``real_cluster(agents=2, resources=..., per_agent=..., env=...)``: a started local real
    cluster, stopped after the test."""
    with ExitStack() as stack:  # each one stopped, even if stopping another fails

        def make(*args: Any, **kwargs: Any) -> RealCluster:
            kwargs.setdefault("base_dir", tmp_path)
            cluster = start_real_cluster(*args, **kwargs)
            stack.callback(cluster.stop)
            return cluster

        yield make


def two_agents(real_cluster: RealClusterFactory, **kwargs: Any) -> RealCluster:
    """A local real cluster of ``agent-0`` and ``agent-1``: ``cpus:8;mem:16384;disk:20000;gpus:4``
    with their own ports, racks r1 and r2, A100."""
    return real_cluster(
        agents=2,
        per_agent={
            i: {
                "hostname": f"agent-{i}",
                "attributes": f"rack:r{i + 1};gpu_model:A100",
                "resources": agent_resources(i, "cpus:8;mem:16384;disk:20000;gpus:4"),
            }
            for i in range(2)
        },
        **kwargs,
    )


@pytest.fixture
def local_cluster(real_cluster: RealClusterFactory) -> RealCluster:
    """Always a local real cluster (:func:`two_agents`): for scenarios that reach into the
    agents' processes or take an agent away."""
    return two_agents(real_cluster)


@pytest.fixture
def mesos(real_cluster: RealClusterFactory) -> RealCluster:
    """``PELOTON_TEST_MESOS_MASTER``'s master, else a local real cluster of two GPU agents."""
    master = external_master()
    if master:
        return RealCluster.attach(master)
    return two_agents(real_cluster)


def agent_resources(index: int, resources: str, ports: int = 500) -> str:
    """``resources`` plus agent ``index``'s own block of ``ports`` ports from 31000: a local
    cluster's agents all have its one address, so like agents sharing a machine they need
    disjoint port ranges (else two tasks may be given the same address in PELOTON_PEERS)."""
    first = 31000 + index * ports
    return f"{resources};ports:[{first}-{first + ports - 1}]"


class MesosPeloton(Peloton):
    """A ``peloton server`` process framework of a real master, under a name of its own (so an
    operator's cluster may run other pelotons) and with a short failover timeout."""

    def __init__(
        self,
        db_url: str,
        cluster: RealCluster,
        workdir: Path,
        extra_args: Sequence[str] = (),
        framework_name: str | None = None,
    ) -> None:
        """``framework_name``: given, the name several daemons share (they take over from each
        other); else a name of this daemon's own."""
        self.cluster = cluster
        self.framework_name = framework_name or f"peloton-test-{uuid.uuid4().hex[:8]}"
        args = ["--framework-name", self.framework_name, "--failover-timeout-seconds", "120"]
        super().__init__(db_url, cluster.master, workdir, [*args, *extra_args])

    def framework(self) -> dict[str, Any]:
        """The master's record of this daemon's framework (waits until it has registered)."""

        def registered() -> dict[str, Any] | None:
            ours = [f for f in self.cluster.frameworks() if f["name"] == self.framework_name]
            return ours[0] if ours else None

        return wait_for(registered, 30, f"framework {self.framework_name} at the master", 0.1)

    def describe(self, job_id: str) -> str:
        """The job's and its tasks' states, and what the master holds for the framework."""
        ours = [f for f in self.cluster.frameworks() if f["name"] == self.framework_name]
        master = (
            {
                "outstanding offers": len(ours[0]["offers"]),
                "tasks": {t["id"]: t["state"] for t in self.cluster.tasks_of(ours[0]["id"])},
            }
            if ours
            else "framework not registered"
        )
        return f"{super().describe(job_id)}; master {master}"

    def close(self) -> None:
        """Stop the daemon, then tear its framework down (its tasks end with it)."""
        super().close()
        for fw in self.cluster.frameworks():
            if fw["name"] == self.framework_name:
                self.cluster.teardown(fw["id"])


PelotonFactory = Callable[..., MesosPeloton]


@pytest.fixture
def make_peloton(
    db_url: str, tmp_path: Path, real_cluster: RealClusterFactory
) -> Iterator[PelotonFactory]:
    """``make_peloton(cluster, *extra_server_flags)``: a started daemon on the test's database,
    framework of ``cluster``; stopped and its framework torn down after the test (before any
    local cluster stops: this fixture depends on ``real_cluster``)."""
    with ExitStack() as stack:
        count = iter(range(1000))

        def make(cluster: RealCluster, *extra_args: str) -> MesosPeloton:
            p = MesosPeloton(db_url, cluster, tmp_path / f"daemon{next(count)}", extra_args)
            stack.callback(p.close)
            return p

        yield make


@pytest.fixture
def peloton(make_peloton: PelotonFactory, mesos: RealCluster) -> MesosPeloton:
    """A daemon, framework of the ``mesos`` cluster."""
    return make_peloton(mesos)
