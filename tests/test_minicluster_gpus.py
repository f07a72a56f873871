"""The minicluster master's GPU assignment (what CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES
show a task): under any sequence of launches, kills, task ends and agents removed and added, the
live tasks of an agent hold disjoint GPUs of its own, and with its free ones they are all of
them. Driven on the master itself with simulated tasks: no processes."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from minicluster_support import EXECUTOR, framework_info

from peloton.minicluster.agent import SimulatedRunner
from peloton.minicluster.master import Master
from peloton.minicluster.model import Agent, Framework, Subscriber, Task
from peloton.minicluster.spec import AgentSpec
from peloton.minicluster.timers import Timers

GPUS = 4
SPEC = AgentSpec("gpu-host", f"cpus:8;mem:8192;disk:1000;gpus:{GPUS}", "")
WAIT = 10.0

_launch = st.tuples(
    st.just("launch"), st.integers(0, 3), st.lists(st.integers(0, GPUS), min_size=1, max_size=3)
)
_kill = st.tuples(st.just("kill"), st.integers(0, 99))
_end = st.tuples(st.just("end"), st.integers(0, 99), st.integers(0, 1))
_remove = st.tuples(st.just("remove"), st.integers(0, 3))
_add = st.tuples(st.just("add"))
STEPS = st.lists(st.one_of(_launch, _kill, _end, _remove, _add), max_size=25)


class Cluster:
    """A master with simulated GPU agents and one subscribed framework."""

    def __init__(self, master: Master) -> None:
        self.master = master
        self.runner = SimulatedRunner(master)
        master.runner = self.runner
        self.subscriber: Subscriber
        self.framework: Framework
        self._ids = itertools.count()
        for _ in range(2):
            self.add()
        call = {"subscribe": {"framework_info": framework_info()}}
        self.subscriber, self.framework = master.subscribe(call)

    def add(self) -> None:
        self.master.add_agent(SPEC, "127.0.0.1", 0, None)

    def remove(self, index: int) -> None:
        with self.master.lock:
            agents = list(self.master.agents.values())
            if agents:
                self.master.remove_agent(agents[index % len(agents)], "removed by the test")

    def live_tasks(self) -> list[Task]:
        with self.master.lock:
            return [t for t in self.master.tasks.values() if not t.terminal]

    def call(self, kind: str, body: dict[str, Any]) -> None:
        call = {"type": kind, "framework_id": {"value": self.framework.id}, kind.lower(): body}
        self.master.call(call, self.subscriber.stream_id)

    def kill(self, index: int) -> None:
        tasks = self.live_tasks()
        if tasks:
            self.call("KILL", {"task_id": {"value": tasks[index % len(tasks)].task_id}})

    def end(self, index: int, code: int) -> None:
        """A task's process exits (as the runner reports it)."""
        with self.master.lock:
            tasks = [t for t in self.live_tasks() if not t.killing and not t.abandoned]
            if tasks:
                self.master.task_exited(tasks[index % len(tasks)], code)

    def launch(self, index: int, gpus: list[int]) -> None:
        """A group of tasks asking for ``gpus`` on an agent's offer (refused if too many)."""
        offer = self._offer(index)
        if offer is None:
            return
        tasks = [self._task(g, offer.agent_id) for g in gpus]
        executor = {
            "type": "DEFAULT",
            "executor_id": {"value": f"e{next(self._ids)}"},
            "framework_id": {"value": self.framework.id},
            "resources": EXECUTOR,
        }
        operation = {
            "type": "LAUNCH_GROUP",
            "launch_group": {"executor": executor, "task_group": {"tasks": tasks}},
        }
        self.call("ACCEPT", {"offer_ids": [{"value": offer.id}], "operations": [operation]})

    def _task(self, gpus: int, agent_id: str) -> dict[str, Any]:
        task_id = f"t{next(self._ids)}"
        resources = [
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": 1}},
        ]
        if gpus:
            resources.append({"name": "gpus", "type": "SCALAR", "scalar": {"value": gpus}})
        return {
            "name": task_id,
            "task_id": {"value": task_id},
            "agent_id": {"value": agent_id},
            "resources": resources,
            "command": {"shell": True, "value": "train"},
        }

    def _offer(self, index: int) -> Any:
        """An outstanding offer of the ``index``-th agent (revived and awaited), None if it has
        nothing free."""
        with self.master.lock:
            agents = list(self.master.agents.values())
            if not agents:
                return None
            agent = agents[index % len(agents)]
        self.call("REVIVE", {})

        def ready() -> bool:
            return agent.id not in self.master.agents or self._offered(agent) or agent_full(agent)

        with self.master.changed:
            if not self.master.changed.wait_for(ready, WAIT):
                raise AssertionError(f"no offer from {agent.id} in {WAIT}s: free {agent.free}")
            offers = [o for o in self.master.offers.values() if o.agent_id == agent.id]
            return offers[0] if offers else None

    def _offered(self, agent: Agent) -> bool:
        return any(o.agent_id == agent.id for o in self.master.offers.values())


def agent_full(agent: Agent) -> bool:
    return agent.free.is_empty() and agent.offered.is_empty()


def check(master: Master) -> None:
    """The invariant: per agent, live tasks' GPUs are disjoint, its own, and with the free ones
    all of them."""
    with master.lock:
        for agent in master.agents.values():
            held = [g for t in agent.tasks.values() if not t.terminal for g in t.gpus]
            assert len(held) == len(set(held)), f"{agent.id} shares GPUs: {held}"
            assert set(held) <= set(range(GPUS)), f"{agent.id}: GPUs {held} not its own"
            assert sorted(held + agent.gpus_free) == list(range(GPUS)), (held, agent.gpus_free)


@settings(max_examples=200, deadline=None)
@given(steps=STEPS)
def test_live_tasks_never_share_a_gpu(steps: list[tuple[Any, ...]]) -> None:
    timers = Timers(name="gpu-property")
    master = Master(timers, allocation_interval=3600.0)
    try:
        cluster = Cluster(master)
        for step in steps:
            getattr(cluster, step[0])(*step[1:])
            check(master)
    finally:
        master.stop()
        timers.stop()
