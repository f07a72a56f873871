"""Fixtures of the real-Mesos suite (``make test-mesos``).

``real_cluster``: a factory of local real Mesos clusters (arguments of
:func:`realcluster.start_real_cluster`), all stopped after the test; their homes (logs, sandboxes)
stay in the test's tmp_path.

``mesos``: the cluster a scenario runs on: the master named by ``PELOTON_TEST_MESOS_MASTER`` (an
operator's cluster, left as it is) or, when that is unset, a fresh local real cluster of two agents
(``cpus:8;mem:16384;disk:20000;gpus:4``, racks r1 and r2, A100).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from realcluster import RealCluster, start_real_cluster

MASTER_ENV = "PELOTON_TEST_MESOS_MASTER"
RealClusterFactory = Callable[..., RealCluster]


def external_master() -> str:
    return os.environ.get(MASTER_ENV, "").strip()


@pytest.fixture(name="real_cluster")
def fixture_real_cluster(tmp_path: Path) -> Iterator[RealClusterFactory]:
    """``real_cluster(agents=2, resources=..., per_agent=..., env=...)``: a started local real
    cluster, stopped after the test."""
    started: list[RealCluster] = []

    def make(*args: Any, **kwargs: Any) -> RealCluster:
        kwargs.setdefault("base_dir", tmp_path)
        cluster = start_real_cluster(*args, **kwargs)
        started.append(cluster)
        return cluster

    yield make
    for cluster in reversed(started):
        cluster.stop()


@pytest.fixture
def mesos(real_cluster: RealClusterFactory) -> RealCluster:
    """``PELOTON_TEST_MESOS_MASTER``'s master, else a local real cluster of two GPU agents."""
    master = external_master()
    if master:
        return RealCluster.attach(master)
    return real_cluster(
        agents=2,
        attributes="rack:r1;gpu_model:A100",
        per_agent={1: {"attributes": "rack:r2;gpu_model:A100"}},
    )
