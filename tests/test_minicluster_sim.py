"""Simulated minicluster: no processes, tasks on a clock, 10,000 agents."""

from __future__ import annotations

import time
from typing import Any

import pytest
from minicluster_support import (  # noqa: F401 (fixture)
    RawScheduler,
    fixture_make_minicluster,
    framework_info,
    task_info,
)

from peloton.minicluster import SIM_DURATION_ENV, SIM_EXIT_CODE_ENV


def test_simulated_tasks_follow_their_durations(make_minicluster: Any) -> None:
    mc = make_minicluster(
        agents=1,
        simulated=True,
        task_duration=lambda info: 0.2 if info["name"] == "timed" else None,
    )
    sched = RawScheduler(mc.address).subscribe()
    tasks = [
        task_info("timed", "train"),
        task_info("env", "train", env={SIM_DURATION_ENV: "0.1", SIM_EXIT_CODE_ENV: "2"}),
        task_info("forever", "train"),
    ]
    sched.launch_group(sched.offer(), tasks)
    for t in ("timed", "env", "forever"):
        for state in ("TASK_STARTING", "TASK_RUNNING"):
            sched.ack(sched.update(t, state))
    failed = sched.update("env")
    assert failed["state"] == "TASK_FAILED" and "status 2" in failed["message"]
    # The group semantics hold in simulation too: the failure kills the others.
    assert sched.update("timed")["state"] == "TASK_KILLED"
    assert sched.update("forever")["state"] == "TASK_KILLED"
    assert all(t.pid is None for t in mc.tasks())


def test_ten_thousand_simulated_agents_start_and_offer_quickly(make_minicluster: Any) -> None:
    start = time.monotonic()
    mc = make_minicluster(agents=10_000, simulated=True)
    started = time.monotonic() - start
    sched = RawScheduler(mc.address).subscribe()
    hosts: set[str] = set()
    offers: list[dict[str, Any]] = []
    while len(hosts) < 10_000:
        offers = sched.take("OFFERS", 30)["offers"]["offers"]
        hosts.update(o["hostname"] for o in offers)
    offered = time.monotonic() - start - started
    # Measured ~1 s to start and ~1-2 s for all offers on a 2-core machine; generous bounds.
    assert started < 15 and offered < 15, (started, offered)
    assert len(hosts) == 10_000

    # Launching on one of them is as cheap as ever.
    sched.launch_group(offers[0], [task_info("one", "x", env={SIM_DURATION_ENV: "0"})])
    for state in ("TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"):
        sched.ack(sched.update("one", state))


def test_a_lost_agent_is_task_lost_without_partition_awareness(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1, simulated=True)
    sched = RawScheduler(mc.address, framework_info(capabilities=[{"type": "GPU_RESOURCES"}]))
    sched.subscribe()
    sched.launch_group(sched.offer(), [task_info("gone", "x")])
    sched.ack(sched.update("gone", "TASK_STARTING"))
    sched.ack(sched.update("gone", "TASK_RUNNING"))
    mc.kill_agent("agent-0")
    lost = sched.update("gone")
    assert lost["state"] == "TASK_LOST" and lost["reason"] == "REASON_AGENT_REMOVED"
    sched.ok("RECONCILE", {"tasks": [{"task_id": {"value": "gone"}}]})
    assert sched.update("gone")["state"] == "TASK_LOST"
    with pytest.raises(TimeoutError, match=r"gone=TASK_LOST@"):
        mc.wait_until(lambda: False, 0.2)
