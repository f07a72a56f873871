"""The LAUNCH_GROUP operation as a Mesos master expects it, and attempt ids back from task ids."""

from __future__ import annotations

from typing import Any

import pytest
from test_hostmgr_offers import raw_offer

from peloton.core.offers import LaunchTask, Lease
from peloton.core.records import attempt_id, parse_attempt_id
from peloton.core.resources import EXECUTOR_RESOURCES, Resources
from peloton.hostmgr.launch import gpu_report, launch_group
from peloton.hostmgr.offers import parse_offer


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
    assert all(r["role"] == "*" for r in first["resources"])  # named exactly as offered
    assert first["command"]["shell"] is True
    # A task with GPUs reports them first; its command comes last, as written.
    assert first["command"]["value"] == f"{gpu_report()}\npython t.py"
    assert {"name": "PELOTON_RANK", "type": "VALUE", "value": "0"} in first["command"][
        "environment"
    ]["variables"]
    assert first["kill_policy"] == {"grace_period": {"nanoseconds": 7_000_000_000}}


def _reserved(name: str, value: float, role: str = "gpu") -> dict[str, Any]:
    """A resource statically reserved for ``role``, as a MULTI_ROLE master offers it."""
    return {
        "name": name,
        "type": "SCALAR",
        "scalar": {"value": value},
        "reservations": [{"type": "STATIC", "role": role}],
        "allocation_info": {"role": role},
    }


def _task(cpu: float, gpu: float, port: int) -> LaunchTask:
    return LaunchTask(
        "job-0-0", "train-0", "true", {}, Resources(cpu=cpu, mem_mb=1024, gpu=gpu), (port,)
    )


def test_a_launch_takes_the_roles_reservations_first_then_unreserved_as_offered() -> None:
    raw = raw_offer("o1", cpus=4, gpus=0)
    raw["allocation_info"] = {"role": "gpu"}
    raw["resources"] += [_reserved("gpus", 2), _reserved("cpus", 1), _reserved("mem", 8192)]
    offer = parse_offer(raw, 0)
    assert offer.resources.gpu == 2 and offer.resources.cpu == 5
    lease = Lease("lease-1", "h1", "a1", (offer,), 60)
    op = launch_group(lease, "fw", "ex", EXECUTOR_RESOURCES, [_task(2, 2, 31001)])
    executor = op["launch_group"]["executor"]["resources"]
    task = op["launch_group"]["task_group"]["tasks"][0]["resources"]
    # Every resource names its role exactly as offered.
    assert all(r["allocation_info"] == {"role": "gpu"} for r in executor + task)
    cpus = [
        (r["scalar"]["value"], "reservations" in r) for r in executor + task if r["name"] == "cpus"
    ]
    # The executor's share from the reserved cpu, then the task: the rest of it, then unreserved.
    assert cpus == [
        (EXECUTOR_RESOURCES.cpu, True),
        (1 - EXECUTOR_RESOURCES.cpu, True),
        (1.1, False),
    ]
    gpus = [r for r in task if r["name"] == "gpus"]
    assert gpus == [_reserved("gpus", 2)]
    assert [r["name"] for r in task if "reservations" not in r] == ["cpus", "ports"]


def test_a_launch_the_offers_cannot_hold_is_refused_before_anything_is_sent() -> None:
    lease = Lease("lease-1", "h1", "a1", (parse_offer(raw_offer("o1", gpus=1), 0),), 60)
    with pytest.raises(ValueError, match="lack 1 gpus"):
        launch_group(lease, "fw", "ex", EXECUTOR_RESOURCES, [_task(1, 2, 31001)])
    with pytest.raises(ValueError, match="lack port 40000"):
        launch_group(lease, "fw", "ex", EXECUTOR_RESOURCES, [_task(1, 1, 40000)])
