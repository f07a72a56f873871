"""Minicluster agents: real processes in sandboxes, Mesos's environment, GPUs, the default
executor's group semantics, kills, lost agents, master restarts and /files/read."""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from minicluster_support import (  # noqa: F401 (fixtures)
    RawScheduler,
    fixture_make_minicluster,
    fixture_minicluster,
    get,
    task_info,
)

from peloton.errors import NotFound
from peloton.hostmgr.sandbox import read_file, sandbox_path
from peloton.minicluster import Minicluster


def _running(sched: RawScheduler, *task_ids: str) -> None:
    """Acknowledge each task's STARTING and RUNNING."""
    for task_id in task_ids:
        for state in ("TASK_STARTING", "TASK_RUNNING"):
            sched.ack(sched.update(task_id, state))


def _offer(sched: RawScheduler, hostname: str | None = None) -> dict[str, Any]:
    return sched.offer(hostname)


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_tasks_run_in_sandboxes_with_the_mesos_environment(minicluster: Minicluster) -> None:
    sched = RawScheduler(minicluster.address).subscribe()
    offer = _offer(sched, "agent-0")
    show = "env | grep -E '^(MESOS_|CUDA_VISIBLE|GREETING)' | sort; echo oops >&2"
    tasks = [task_info(f"g{i}", show, gpus=1, env={"GREETING": f"hi{i}"}) for i in range(2)]
    tasks.append(task_info("nogpu", show))
    sched.launch_group(offer, tasks, executor_id="ex1")
    for t in ("g0", "g1", "nogpu"):
        statuses = []
        for _ in range(3):
            statuses.append(sched.update(t))
            sched.ack(statuses[-1])
        assert [s["state"] for s in statuses] == ["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"]
        assert statuses[-1]["message"] == "Command exited with status 0"

    work = minicluster.work_dir
    assert work is not None
    runs = work / "agents/agent-0/frameworks" / str(sched.framework_id) / "executors/ex1/runs"
    assert (runs / "latest").is_symlink()
    envs = {}
    for t in ("g0", "g1", "nogpu"):
        sandbox = runs / "latest" / "tasks" / t
        assert minicluster.task(t).sandbox == (runs / os.readlink(runs / "latest") / "tasks" / t)
        assert (sandbox / "stderr").read_text() == "oops\n"
        lines = (sandbox / "stdout").read_text().splitlines()
        envs[t] = dict(line.split("=", 1) for line in lines)
    g0 = envs["g0"]
    assert g0["MESOS_TASK_ID"] == "g0" and g0["MESOS_EXECUTOR_ID"] == "ex1"
    assert g0["MESOS_FRAMEWORK_ID"] == sched.framework_id
    assert g0["MESOS_SANDBOX"] == str(minicluster.task("g0").sandbox)
    assert g0["MESOS_AGENT_ENDPOINT"] == minicluster.agent_address("agent-0")
    assert g0["GREETING"] == "hi0" and envs["g1"]["GREETING"] == "hi1"
    # Each GPU task sees its own device; a task without GPUs sees none.
    assert {envs["g0"]["CUDA_VISIBLE_DEVICES"], envs["g1"]["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
    assert envs["nogpu"]["CUDA_VISIBLE_DEVICES"] == ""


def test_a_failed_task_takes_its_group_down(minicluster: Minicluster) -> None:
    sched = RawScheduler(minicluster.address).subscribe()
    offer = _offer(sched)
    tasks = [task_info("bad", "sleep 0.3; exit 3")] + [
        task_info(f"ok{i}", "sleep 30", grace=1) for i in range(2)
    ]
    sched.launch_group(offer, tasks, executor_id="exg")
    _running(sched, "bad", "ok0", "ok1")
    failed = sched.update("bad")
    assert failed["state"] == "TASK_FAILED" and failed["message"] == "Command exited with status 3"
    for t in ("ok0", "ok1"):
        killed = sched.update(t)
        assert killed["state"] == "TASK_KILLED"
        assert "task 'bad' of its group failed" in killed["message"]
        assert not _alive(minicluster.task(t).pid)
    failure = sched.take("FAILURE")["failure"]
    assert failure["executor_id"] == {"value": "exg"} and failure["status"] != 0


def test_a_finished_task_leaves_its_group_running(minicluster: Minicluster) -> None:
    sched = RawScheduler(minicluster.address).subscribe()
    sched.launch_group(_offer(sched), [task_info("done", "true"), task_info("long", "sleep 30")])
    _running(sched, "done", "long")
    assert sched.update("done")["state"] == "TASK_FINISHED"
    time.sleep(0.3)  # the group must not react: nothing to await but the absence of a kill
    assert minicluster.task("long").state == "TASK_RUNNING"
    assert _alive(minicluster.task("long").pid)


def test_kill_sends_sigterm_then_sigkill_after_the_grace_period(minicluster: Minicluster) -> None:
    sched = RawScheduler(minicluster.address).subscribe()
    stubborn = task_info("stubborn", "trap '' TERM; sleep 30", grace=0.8)
    polite = task_info("polite", "sleep 30", grace=20)
    sched.launch_group(_offer(sched, "agent-0"), [stubborn], executor_id="e1")
    sched.launch_group(_offer(sched, "agent-1"), [polite], executor_id="e2")
    _running(sched, "stubborn", "polite")

    start = time.monotonic()
    sched.ok("KILL", {"task_id": {"value": "polite"}})
    assert sched.update("polite")["state"] == "TASK_KILLED"
    assert time.monotonic() - start < 5  # SIGTERM was enough: no 20 s grace

    start = time.monotonic()
    sched.ok("KILL", {"task_id": {"value": "stubborn"}})
    killed = sched.update("stubborn")
    assert killed["state"] == "TASK_KILLED"
    assert killed["message"] == "Command terminated with signal SIGKILL"
    assert time.monotonic() - start >= 0.8
    assert not _alive(minicluster.task("stubborn").pid)


def test_killing_one_task_kills_its_group(minicluster: Minicluster) -> None:
    sched = RawScheduler(minicluster.address).subscribe()
    tasks = [task_info("a", "sleep 30"), task_info("b", "sleep 30")]
    sched.launch_group(_offer(sched), tasks)
    _running(sched, "a", "b")
    sched.ok("KILL", {"task_id": {"value": "a"}})
    assert sched.update("a")["state"] == "TASK_KILLED"
    sibling = sched.update("b")
    assert (
        sibling["state"] == "TASK_KILLED"
        and "task 'a' of its group was killed" in sibling["message"]
    )


def test_a_killed_agent_loses_its_tasks_and_offers(minicluster: Minicluster) -> None:
    sched = RawScheduler(minicluster.address).subscribe()
    offer = _offer(sched, "agent-0")
    sched.launch_group(offer, [task_info("doomed", "sleep 30")], filters={"refuse_seconds": 0})
    _running(sched, "doomed")
    spare = _offer(sched, "agent-0")  # what the task left free, offered again
    pid = minicluster.task("doomed").pid
    assert _alive(pid)

    minicluster.kill_agent("agent-0")
    rescinded = sched.take("RESCIND")["rescind"]["offer_id"]
    assert rescinded == spare["id"]
    lost = sched.update("doomed")
    assert lost["state"] == "TASK_UNREACHABLE" and lost["reason"] == "REASON_AGENT_REMOVED"
    assert lost["source"] == "SOURCE_MASTER" and "unreachable_time" in lost
    assert sched.take("FAILURE")["failure"] == {"agent_id": offer["agent_id"]}
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    sched.ok("RECONCILE", {"tasks": [{"task_id": {"value": "doomed"}}]})
    assert sched.update("doomed")["state"] == "TASK_UNREACHABLE"
    assert [t.hostname for t in minicluster.tasks() if t.state == "TASK_RUNNING"] == []


def test_master_restart_keeps_agents_and_tasks(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1, update_retry_interval=0.3)
    sched = RawScheduler(mc.address).subscribe()
    fid = sched.framework_id
    sched.launch_group(_offer(sched), [task_info("survivor", "sleep 30", cpus=1)])
    sched.ack(sched.update("survivor", "TASK_STARTING"))
    sched.update("survivor", "TASK_RUNNING")  # not acknowledged: the agent keeps it
    pid = mc.task("survivor").pid

    mc.restart_master()
    assert sched.ended.wait(5)
    assert _alive(pid)
    status, _, body = get(mc.address, "/master/state")
    state = json.loads(body)
    assert status == 200 and state["frameworks"][0]["id"] == fid
    assert state["frameworks"][0]["tasks"][0]["state"] == "TASK_RUNNING"

    again = RawScheduler(mc.address).subscribe(framework_id=fid)
    assert again.framework_id == fid
    again.ack(again.update("survivor", "TASK_RUNNING"))
    again.ok("RECONCILE", {"tasks": []})
    assert again.update("survivor")["state"] == "TASK_RUNNING"
    offer = _offer(again)
    cpus = next(r for r in offer["resources"] if r["name"] == "cpus")["scalar"]["value"]
    assert cpus == pytest.approx(4 - 1 - 0.1)  # the task and its executor still hold theirs


def test_files_read_serves_sandbox_files_like_a_mesos_agent(minicluster: Minicluster) -> None:
    sched = RawScheduler(minicluster.address).subscribe()
    offer = _offer(sched)
    sched.launch_group(offer, [task_info("talker", "printf 'hello world\\n'")], executor_id="ex")
    _running(sched, "talker")
    assert sched.update("talker")["state"] == "TASK_FINISHED"
    address = "{ip}:{port}".format(**offer["url"]["address"])
    path = sandbox_path(str(sched.framework_id), "ex", "talker", "stdout")

    status, _, body = get(address, f"/files/read?path={path}&offset=-1")
    assert status == 200 and json.loads(body) == {"data": "", "offset": 12}
    status, _, body = get(address, f"/files/read?path={path}&offset=6&length=5")
    assert json.loads(body) == {"data": "world", "offset": 6}
    assert read_file(address, path, 0, 100) == (b"hello world\n", 0)  # the host manager's reader

    with pytest.raises(NotFound):
        read_file(address, path.replace("stdout", "nope"), 0, 10)
    assert get(address, "/files/read")[0] == 400
    assert get(address, "/files/read?path=/../../../etc/passwd&offset=0")[0] == 404
    assert get(address, f"/files/read?path={path}&offset=x")[0] == 400


def test_max_completion_time_fails_the_task_and_its_group(minicluster: Minicluster) -> None:
    sched = RawScheduler(minicluster.address).subscribe()
    slow = dict(task_info("slow", "sleep 30"), max_completion_time={"nanoseconds": 300_000_000})
    sched.launch_group(sched.offer(), [slow, task_info("peer", "sleep 30")])
    _running(sched, "slow", "peer")
    failed = sched.update("slow")
    assert failed["state"] == "TASK_FAILED"
    assert failed["reason"] == "REASON_MAX_COMPLETION_TIME_REACHED"
    assert "maximum completion time of 0.3s" in failed["message"]
    assert sched.update("peer")["state"] == "TASK_KILLED"


def test_clusters_side_by_side_never_share_an_agent_address(make_minicluster: Any) -> None:
    """Two clusters whose agents offer the same fixed port range (a user's cluster and a test
    suite's, both from examples/): every agent has an address of its own, where it serves on the
    Mesos agent port, so their tasks can listen on the same port numbers at once."""
    first = make_minicluster(2, "cpus:1;mem:256;ports:[31000-31004]")
    second = make_minicluster(2, "cpus:1;mem:256;ports:[31000-31004]")
    addresses = [mc.agent_address(a) for mc in (first, second) for a in mc.agent_ids()]
    ips = [a.rsplit(":", 1)[0] for a in addresses]
    assert len(set(ips)) == 4, addresses
    assert all(a.endswith(":5051") for a in addresses), addresses
    listening = []
    try:
        for ip in ips:
            task = socket.socket()
            listening.append(task)
            # As servers do: a connection an earlier test left in TIME_WAIT on this address and
            # port (another suite on the machine uses the examples' ports too) does not block it.
            task.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            task.bind((ip, 31000))  # each cluster's first task on its agent's first port
            task.listen()
    finally:
        for s in listening:
            s.close()


def test_free_ports_are_picked_by_the_kernel_and_held_for_the_agent(
    make_minicluster: Any,
) -> None:
    """Each agent offers as many ports as its spec names, on its own address, that nothing else
    can bind (another minicluster on the same addresses) while a task with SO_REUSEADDR can
    listen on them; stopping the cluster lets them go."""
    mc = make_minicluster(
        2, "cpus:1;mem:256;ports:[31000-31004];ports(gpu):[32000-32001]", free_ports=True
    )
    with mc.master.lock:
        agents = [(a.ip, a.total) for a in mc.master.agents.values()]
    assert len({ip for ip, _ in agents}) == 2
    for ip, total in agents:
        mine = [p for b, e in total.ranges["ports"] for p in range(b, e + 1)]
        reserved = [p for b, e in total.reserved["gpu"].ranges["ports"] for p in range(b, e + 1)]
        assert (len(mine), len(reserved)) == (5, 2)
        for port in mine + reserved:
            assert not 31000 <= port <= 32001
            with socket.socket() as other, pytest.raises(OSError) as exc:
                other.bind((ip, port))
            assert exc.value.errno == errno.EADDRINUSE
        with socket.socket() as task:
            task.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            task.bind((ip, mine[0]))
            task.listen()
    mc.stop()
    for ip, total in agents:
        b, _ = total.ranges["ports"][0]
        with socket.socket() as later:
            later.bind((ip, b))
