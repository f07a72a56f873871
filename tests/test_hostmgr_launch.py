"""The LAUNCH_GROUP operation as a Mesos master expects it, and attempt ids back from task ids."""

from __future__ import annotations

from test_hostmgr_offers import raw_offer

from peloton.hostmgr.framework import parse_attempt_id
from peloton.hostmgr.launch import LaunchTask, launch_group
from peloton.hostmgr.offers import Lease, parse_offer
from peloton.jobmgr.records import attempt_id
from peloton.placement.firstfit import EXECUTOR_RESOURCES
from peloton.resources import Resources


def test_attempt_ids_map_back() -> None:
    job = "3b80aa12-9bc9-4d11-8c1e-0123456789ab"
    assert parse_attempt_id(attempt_id(job, 12, 3)) == (job, 12, 3)
    assert parse_attempt_id("someone-else") is None
    assert parse_attempt_id("x-y-z") is None


def test_launch_group_has_a_default_executor_with_disk_and_one_group() -> None:
    offer = parse_offer(raw_offer("o1"), 0)
    lease = Lease("lease-1", "h1", "a1", (offer,), 60)
    tasks = [
        LaunchTask(
            f"job-{i}-0",
            f"train-{i}",
            "python t.py",
            {"PELOTON_RANK": str(i)},
            Resources(cpu=1, mem_mb=256, disk_mb=10, gpu=1),
            (31000 + i,),
            7,
        )
        for i in range(2)
    ]
    op = launch_group(lease, "fw-1", "job-0-0-executor", EXECUTOR_RESOURCES, tasks)
    assert op["type"] == "LAUNCH_GROUP"
    executor = op["launch_group"]["executor"]
    assert executor["type"] == "DEFAULT"
    assert executor["framework_id"] == {"value": "fw-1"}
    assert {r["name"] for r in executor["resources"]} == {"cpus", "mem", "disk"}
    assert "command" not in executor
    infos = op["launch_group"]["task_group"]["tasks"]
    assert [t["task_id"]["value"] for t in infos] == ["job-0-0", "job-1-0"]
    first = infos[0]
    assert first["agent_id"] == {"value": "a1"}
    names = {r["name"]: r for r in first["resources"]}
    assert names["gpus"]["scalar"]["value"] == 1
    assert names["ports"]["ranges"]["range"] == [{"begin": 31000, "end": 31000}]
    assert all(r["allocation_info"] == {"role": "*"} for r in first["resources"])
    assert first["command"]["shell"] is True
    assert {"name": "PELOTON_RANK", "type": "VALUE", "value": "0"} in first["command"][
        "environment"
    ]["variables"]
    assert first["kill_policy"] == {"grace_period": {"nanoseconds": 7_000_000_000}}
