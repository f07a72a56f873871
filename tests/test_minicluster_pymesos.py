"""pymesos's MesosSchedulerDriver, unmodified, against the minicluster: subscribe, offers, a task
group, explicit acknowledgements, reconnect after a dropped connection, failover and teardown."""

from __future__ import annotations

import threading
from typing import Any

from minicluster_support import (  # noqa: F401 (fixture)
    CURRENT_USER,
    EXECUTOR,
    fixture_make_minicluster,
    fixture_minicluster,
    task_info,
)
from pymesos import MesosSchedulerDriver, Scheduler

from peloton.minicluster import Minicluster


class Recorder(Scheduler):  # type: ignore[misc]
    """Launches one task group on the first offer, declines the rest, acks every update."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, Any]] = []
        self.launched = False

    def _log(self, name: str, value: Any = None) -> None:
        with self.lock:
            self.calls.append((name, value))

    def names(self) -> list[str]:
        with self.lock:
            return [c[0] for c in self.calls]

    def states(self, task_id: str) -> list[str]:
        with self.lock:
            return [
                v["state"]
                for n, v in self.calls
                if n == "status" and v["task_id"]["value"] == task_id
            ]

    def registered(self, driver: Any, framework_id: dict[str, str], master: Any) -> None:
        self._log("registered", framework_id["value"])

    def reregistered(self, driver: Any, master: Any) -> None:
        self._log("reregistered")

    def disconnected(self, driver: Any) -> None:
        self._log("disconnected")

    def resourceOffers(self, driver: Any, offers: list[dict[str, Any]]) -> None:
        self._log("offers", offers)
        if self.launched:
            driver.declineOffer([o["id"] for o in offers], {"refuse_seconds": 60})
            return
        self.launched = True
        offer = offers[0]
        task = dict(task_info("pm-1", "sleep 30", gpus=1), agent_id=offer["agent_id"])
        executor = {
            "type": "DEFAULT",
            "executor_id": {"value": "pm-ex"},
            "framework_id": offer["framework_id"],
            "resources": EXECUTOR,
        }
        op = {
            "type": "LAUNCH_GROUP",
            "launch_group": {"executor": executor, "task_group": {"tasks": [task]}},
        }
        driver.acceptOffers([offer["id"]], [op])
        others = [o["id"] for o in offers[1:]]
        if others:
            driver.declineOffer(others, {"refuse_seconds": 60})

    def statusUpdate(self, driver: Any, status: dict[str, Any]) -> None:
        # Acknowledged before it is recorded: once a test sees an update, its ACK has been
        # answered, so the test may drop the connection (an ACK sent after the drop would be
        # refused, 403 "Framework is not subscribed", as by a real master, and raise in pymesos).
        driver.acknowledgeStatusUpdate(status)
        self._log("status", status)


def test_pymesos_driver_runs_a_task_group_and_survives_a_dropped_connection(
    minicluster: Minicluster,
) -> None:
    sched = Recorder()
    info = {
        "user": CURRENT_USER,  # an empty user fails every executor, as on real agents
        "name": "pymesos-test",
        "failover_timeout": 60.0,
        "capabilities": [{"type": "PARTITION_AWARE"}],
    }
    driver = MesosSchedulerDriver(
        sched, info, minicluster.address, use_addict=False, implicit_acknowledgements=False
    )
    driver.start()
    try:
        minicluster.wait_until(lambda: "TASK_RUNNING" in sched.states("pm-1"), 15)
        fid = sched.calls[0][1]
        assert sched.names()[0] == "registered"
        framework = minicluster.frameworks()[0]
        # pymesos adds GPU_RESOURCES itself after reading /version (>= 1.0).
        assert framework.id == fid and "GPU_RESOURCES" in framework.capabilities
        assert minicluster.task("pm-1").gpus == (0,)

        minicluster.drop_connections()
        minicluster.wait_until(lambda: "reregistered" in sched.names(), 15)
        assert minicluster.frameworks()[0].id == fid and minicluster.frameworks()[0].connected
        assert minicluster.task("pm-1").state == "TASK_RUNNING"

        driver.killTask({"value": "pm-1"})
        minicluster.wait_until(lambda: "TASK_KILLED" in sched.states("pm-1"), 15)
    finally:
        driver.stop()  # TEARDOWN
        driver.join()
    minicluster.wait_until(lambda: minicluster.frameworks() == [], 10)
