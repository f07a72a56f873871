"""The minicluster's wire format against the Mesos v1 scheduler HTTP API docs
(docs/scheduler-http-api.md, include/mesos/v1/scheduler/scheduler.proto, v1/mesos.proto)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from minicluster_support import (  # noqa: F401 (fixtures)
    EXECUTOR,
    RawScheduler,
    fixture_make_minicluster,
    fixture_minicluster,
    framework_info,
    get,
    post,
    task_info,
    uuid_bytes,
)

from peloton.minicluster import AgentSpec, Minicluster
from peloton.minicluster.master import KNOWN_CALLS

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _subscribe_raw(address: str, info: dict[str, Any]) -> tuple[bytes, socket.socket]:
    """SUBSCRIBE over a bare socket: (everything read within a moment, the socket)."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    body = json.dumps({"type": "SUBSCRIBE", "subscribe": {"framework_info": info}}).encode()
    sock.sendall(
        b"POST /api/v1/scheduler HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Accept: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
        % (address.encode(), len(body), body)
    )
    data = b""
    deadline = time.monotonic() + 5
    while data.count(b"HEARTBEAT") < 1 and time.monotonic() < deadline:
        data += sock.recv(65536)
    return data, sock


def _dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out += rest[:size]
        assert rest[size : size + 2] == b"\r\n", "chunk not terminated by CRLF"
        body = rest[size + 2 :]
    return out


def test_subscribe_is_a_chunked_recordio_stream(minicluster: Minicluster) -> None:
    data, sock = _subscribe_raw(minicluster.address, framework_info())
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK"
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    assert headers["transfer-encoding"] == "chunked"
    assert headers["content-type"] == "application/json"
    assert UUID.match(headers["mesos-stream-id"])
    assert "content-length" not in headers

    records = _dechunk(body)
    # RecordIO: "<length>\n<json>" repeated; the length counts the bytes of the record.
    first_len, _, rest = records.partition(b"\n")
    first = json.loads(rest[: int(first_len)])
    assert first["type"] == "SUBSCRIBED"
    sub = first["subscribed"]
    assert set(sub) == {"framework_id", "heartbeat_interval_seconds", "master_info"}
    assert sub["framework_id"]["value"].endswith("-0000")
    assert sub["heartbeat_interval_seconds"] == 15.0
    info = sub["master_info"]
    assert info["version"] == "1.11.0"
    assert info["port"] == int(minicluster.address.rsplit(":", 1)[1])
    assert {"id", "ip", "hostname", "pid", "address"} <= set(info)
    second_len, _, rest2 = rest[int(first_len) :].partition(b"\n")
    assert json.loads(rest2[: int(second_len)]) == {"type": "HEARTBEAT"}


def test_version_state_and_redirect(minicluster: Minicluster) -> None:
    status, headers, body = get(minicluster.address, "/version")
    assert status == 200 and headers["Content-Type"] == "application/json"
    version = json.loads(body)
    assert version["version"] == "1.11.0"
    assert {"build_date", "build_time", "build_user", "git_tag"} <= set(version)

    status, _, body = get(minicluster.address, "/master/state")
    state = json.loads(body)
    assert status == 200 and state["activated_slaves"] == 2
    agent = state["slaves"][0]
    assert agent["resources"]["cpus"] == 4.0 and agent["resources"]["ports"] == "[31000-31009]"
    assert agent["attributes"] == {"rack": "r1", "gpu_model": "A100"}

    status, headers, _ = get(minicluster.address, "/master/redirect")
    assert status == 307 and headers["Location"] == "//" + minicluster.address


def test_calls_are_answered_202_and_checked_against_the_stream(minicluster: Minicluster) -> None:
    sched = RawScheduler(minicluster.address).subscribe()
    status, body = sched.call("REVIVE")
    assert (status, body) == (202, b"")

    call = {"type": "REVIVE", "framework_id": {"value": sched.framework_id}}
    status, _, body = post(minicluster.address, call)
    assert status == 400
    assert body == b"All non-subscribe calls should include the 'Mesos-Stream-Id' header"

    hdrs = {"Content-Type": "application/json", "Mesos-Stream-Id": "not-the-stream"}
    status, _, body = post(minicluster.address, call, hdrs)
    assert status == 400 and b"didn't match the stream ID" in body

    call["framework_id"] = {"value": "no-such-framework"}
    hdrs["Mesos-Stream-Id"] = sched.stream_id or ""
    status, _, body = post(minicluster.address, call, hdrs)
    assert (status, body) == (403, b"Framework cannot be found")


def test_malformed_requests_get_mesos_answers(minicluster: Minicluster) -> None:
    address = minicluster.address
    call = {"type": "SUBSCRIBE", "subscribe": {"framework_info": framework_info()}}
    cases: list[tuple[Any, dict[str, str], int, bytes]] = [
        (call, {}, 400, b"Expecting 'Content-Type' to be present"),
        (
            call,
            {"Content-Type": "text/plain"},
            415,
            b"Expecting 'Content-Type' of application/json",
        ),
        (call, {"Content-Type": "application/x-protobuf"}, 415, b"JSON only"),
        (
            call,
            {"Content-Type": "application/json", "Accept": "text/html"},
            406,
            b"Expecting 'Accept' to allow application/json",
        ),
        (
            call,
            {"Content-Type": "application/json", "Accept": "application/x-protobuf"},
            406,
            b"Expecting 'Accept' to allow",
        ),
        (b"{not json", {"Content-Type": "application/json"}, 400, b"Failed to parse body"),
        ({"subscribe": {}}, {"Content-Type": "application/json"}, 400, b"Expecting 'type'"),
        ({"type": "FLY"}, {"Content-Type": "application/json"}, 400, b"Failed to find enum"),
        ({"type": "REVIVE"}, {"Content-Type": "application/json"}, 400, b"'framework_id'"),
        ({"type": "SUBSCRIBE"}, {"Content-Type": "application/json"}, 400, b"'subscribe'"),
        (
            {"type": "SUBSCRIBE", "subscribe": {"framework_info": {"name": "x"}}},
            {"Content-Type": "application/json"},
            400,
            b"Missing required fields: subscribe.framework_info.user",
        ),
        (
            call,
            {"Content-Type": "application/json", "Mesos-Stream-Id": "x"},
            400,
            b"Subscribe calls should not include the 'Mesos-Stream-Id' header",
        ),
    ]
    for body, headers, want_status, want_text in cases:
        status, _, text = post(address, body, headers)
        assert status == want_status, (body, headers, status, text)
        assert want_text in text, (body, text)
    status, _, text = get(address, "/api/v1/scheduler")
    assert (status, text) == (405, b"Expecting 'POST', received 'GET'")


def test_offers_have_real_shapes(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1, attributes="rack:r2;gen:3")
    roles = framework_info(
        roles=["trainers"],
        capabilities=[{"type": "GPU_RESOURCES"}, {"type": "MULTI_ROLE"}],
    )
    sched = RawScheduler(mc.address, roles).subscribe()
    offer = sched.take("OFFERS")["offers"]["offers"][0]
    assert set(offer) == {
        "id",
        "framework_id",
        "agent_id",
        "hostname",
        "url",
        "resources",
        "attributes",
        "allocation_info",
    }
    assert offer["framework_id"] == {"value": sched.framework_id}
    assert offer["hostname"] == "agent-0"
    assert offer["allocation_info"] == {"role": "trainers"}
    assert offer["url"]["scheme"] == "http" and offer["url"]["path"].startswith("/slave(")
    # The agent's own loopback address (127.0.1.1 unless another cluster's agent has it), where it
    # serves on the Mesos agent port.
    address = offer["url"]["address"]
    assert f"{address['ip']}:{address['port']}" == mc.agent_address("agent-0")
    assert address["ip"].startswith("127.0.") and address["ip"] != "127.0.0.1"
    assert address["port"] == 5051
    by_name = {r["name"]: r for r in offer["resources"]}
    assert by_name["cpus"] == {
        "name": "cpus",
        "type": "SCALAR",
        "scalar": {"value": 4.0},
        "role": "*",
        "allocation_info": {"role": "trainers"},
    }
    assert by_name["gpus"]["scalar"] == {"value": 2.0}
    assert by_name["ports"]["type"] == "RANGES"
    assert by_name["ports"]["ranges"] == {"range": [{"begin": 31000, "end": 31009}]}
    assert offer["attributes"] == [
        {"name": "rack", "type": "TEXT", "text": {"value": "r2"}},
        {"name": "gen", "type": "SCALAR", "scalar": {"value": 3.0}},
    ]


def test_gpu_agents_are_not_offered_without_gpu_resources(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1)
    mc.add_agent(AgentSpec("cpu-only", "cpus:2;mem:1024;disk:100", ""))
    sched = RawScheduler(mc.address, framework_info(capabilities=[])).subscribe()
    offers = sched.take("OFFERS")["offers"]["offers"]
    assert [o["hostname"] for o in offers] == ["cpu-only"]
    assert all("allocation_info" not in r for r in offers[0]["resources"])


def test_update_is_resent_until_acknowledged_and_in_order(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1, update_retry_interval=0.2)
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.take("OFFERS")["offers"]["offers"][0]
    sched.launch_group(offer, [task_info("t1", "sleep 30")])
    first = sched.update("t1", "TASK_STARTING")
    assert first["source"] == "SOURCE_EXECUTOR" and len(uuid_bytes(first)) == 16
    assert first["agent_id"] == offer["agent_id"] and "executor_id" in first
    again = sched.update("t1", timeout=5)
    assert again["uuid"] == first["uuid"] and again["state"] == "TASK_STARTING"
    # RUNNING waits behind the unacknowledged STARTING.
    assert not any(
        e["update"]["status"]["state"] == "TASK_RUNNING" for e in sched.events if "update" in e
    )
    sched.ack(first)
    running = sched.update("t1", "TASK_RUNNING")
    sched.ack(running)
    # A re-send may have crossed the acknowledgement; after that, nothing more may come.
    time.sleep(0.5)
    sched.drop("UPDATE")
    time.sleep(0.5)  # several re-send intervals
    assert not [e for e in sched.events if e["type"] == "UPDATE"]


def test_decline_filters_resources_for_refuse_seconds(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1)
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.take("OFFERS")["offers"]["offers"][0]
    declined = time.monotonic()
    sched.ok("DECLINE", {"offer_ids": [offer["id"]], "filters": {"refuse_seconds": 0.6}})
    again = sched.take("OFFERS", timeout=5)["offers"]["offers"][0]
    assert time.monotonic() - declined >= 0.6
    assert again["agent_id"] == offer["agent_id"] and again["id"] != offer["id"]


def test_suppress_stops_offers_and_revive_resumes_them(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1)
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.take("OFFERS")["offers"]["offers"][0]
    sched.ok("SUPPRESS")
    sched.ok("DECLINE", {"offer_ids": [offer["id"]], "filters": {"refuse_seconds": 0}})
    mc.wait_until(lambda: mc.frameworks()[0].suppressed, 5)
    time.sleep(0.4)  # four allocation intervals: a suppressed framework gets nothing
    assert not [e for e in sched.events if e["type"] == "OFFERS"]
    sched.ok("REVIVE")
    assert sched.take("OFFERS", timeout=5)["offers"]["offers"][0]["agent_id"] == offer["agent_id"]


def test_reconcile_explicit_and_implicit(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1)
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.take("OFFERS")["offers"]["offers"][0]
    sched.launch_group(offer, [task_info("r1", "sleep 30")])
    for state in ("TASK_STARTING", "TASK_RUNNING"):
        sched.ack(sched.update("r1", state))

    sched.ok("RECONCILE", {"tasks": [{"task_id": {"value": "r1"}}, {"task_id": {"value": "gone"}}]})
    known = sched.update("r1")
    assert known["state"] == "TASK_RUNNING" and known["reason"] == "REASON_RECONCILIATION"
    assert known["source"] == "SOURCE_MASTER" and "uuid" not in known
    unknown = sched.update("gone")
    assert unknown["state"] == "TASK_UNKNOWN"  # PARTITION_AWARE; TASK_LOST otherwise

    sched.ok("RECONCILE", {"tasks": []})
    implicit = sched.update("r1")
    assert implicit["state"] == "TASK_RUNNING" and implicit["reason"] == "REASON_RECONCILIATION"


def test_unknown_task_is_lost_to_a_framework_that_is_not_partition_aware(
    minicluster: Minicluster,
) -> None:
    sched = RawScheduler(minicluster.address, framework_info(capabilities=[])).subscribe()
    sched.ok("RECONCILE", {"tasks": [{"task_id": {"value": "nope"}}]})
    assert sched.update("nope")["state"] == "TASK_LOST"
    sched.ok("KILL", {"task_id": {"value": "nope"}})
    killed = sched.update("nope")
    assert killed["state"] == "TASK_LOST" and "unknown task" in killed["message"]


def _launch_error(sched: RawScheduler, offer: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
    tasks = kw.pop("tasks", None) or [task_info("v1", "true"), task_info("v2", "true")]
    sched.launch_group(offer, tasks, **kw)
    return [sched.update(t["task_id"]["value"]) for t in tasks]


def test_invalid_task_groups_get_task_error(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1)
    sched = RawScheduler(mc.address).subscribe()

    def offer() -> dict[str, Any]:
        first: dict[str, Any] = sched.take("OFFERS", timeout=5)["offers"]["offers"][0]
        return first

    no_disk = [r for r in EXECUTOR if r["name"] != "disk"]
    refuse = {"refuse_seconds": 0}
    for status in _launch_error(sched, offer(), executor_resources=no_disk, filters=refuse):
        assert status["state"] == "TASK_ERROR"
        assert status["reason"] == "REASON_TASK_GROUP_INVALID"
        assert status["source"] == "SOURCE_MASTER"
        assert re.fullmatch(r"Executor '[^']+' uses no disk", status["message"])

    too_big = [task_info("v1", "true", cpus=3), task_info("v2", "true", cpus=3)]
    for status in _launch_error(sched, offer(), tasks=too_big, filters=refuse):
        assert status["state"] == "TASK_ERROR"
        assert status["message"].startswith(
            "Total resources cpus(allocated: *):6.1; mem(allocated: *):160; "
            "disk(allocated: *):10 required by task group and its executor are more than "
            "available ports(allocated: *):[31000-31009]; cpus(allocated: *):4; "
        )

    dup = [task_info("v1", "true"), task_info("v1", "true")]
    statuses = _launch_error(sched, offer(), tasks=dup, filters=refuse)
    assert statuses[0]["state"] == "TASK_ERROR" and "Duplicate task" in statuses[0]["message"]

    ports = [task_info("v1", "true", ports=[(40000, 40000)])]
    statuses = _launch_error(sched, offer(), tasks=ports, filters=refuse)
    assert "ports(allocated: *):[40000-40000]" in statuses[0]["message"]
    assert mc.tasks() == []  # nothing half-launched


def test_launch_with_invalid_offer_is_dropped(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1)
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.take("OFFERS")["offers"]["offers"][0]
    stale = dict(offer, id={"value": "no-such-offer"})
    sched.launch_group(stale, [task_info("d1", "true")])
    status = sched.update("d1")
    assert status["state"] == "TASK_DROPPED" and status["reason"] == "REASON_INVALID_OFFERS"
    assert "no-such-offer" in status["message"]


def test_offers_of_two_agents_cannot_be_combined(minicluster: Minicluster) -> None:
    sched = RawScheduler(minicluster.address).subscribe()
    first, second = sched.offer("agent-0"), sched.offer("agent-1")
    task = dict(task_info("split", "true"), agent_id=first["agent_id"])
    launch = {"type": "LAUNCH", "launch": {"task_infos": [task]}}
    sched.ok("ACCEPT", {"offer_ids": [first["id"], second["id"]], "operations": [launch]})
    status = sched.update("split")
    assert status["state"] == "TASK_DROPPED"
    assert status["message"].endswith("Aggregated offers must belong to one single agent")
    # Both offers went back: the agents are offered again.
    assert {sched.offer()["hostname"], sched.offer()["hostname"]} == {"agent-0", "agent-1"}


def test_plain_launch_validates_each_task(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1)
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.take("OFFERS")["offers"]["offers"][0]
    good = dict(task_info("ok", "true"), agent_id=offer["agent_id"])
    bad = dict(task_info("bad", "true", cpus=99), agent_id=offer["agent_id"])
    launch = {"type": "LAUNCH", "launch": {"task_infos": [good, bad]}}
    sched.ok("ACCEPT", {"offer_ids": [offer["id"]], "operations": [launch]})
    bad_status = sched.update("bad")
    assert bad_status["state"] == "TASK_ERROR" and bad_status["reason"] == "REASON_TASK_INVALID"
    for state in ("TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"):
        sched.ack(sched.update("ok", state))


def test_failover_keeps_tasks_and_resends_pending_updates(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1)
    sched = RawScheduler(mc.address).subscribe()
    fid = sched.framework_id
    offer = sched.take("OFFERS")["offers"]["offers"][0]
    sched.launch_group(offer, [task_info("f1", "sleep 30")])
    sched.update("f1", "TASK_STARTING")  # not acknowledged
    sched.close()
    mc.wait_until(lambda: not mc.frameworks()[0].connected, 5)

    again = RawScheduler(mc.address).subscribe(framework_id=fid)
    assert again.framework_id == fid
    pending = again.update("f1", "TASK_STARTING")
    again.ack(pending)
    again.ack(again.update("f1", "TASK_RUNNING"))
    assert mc.task("f1").state == "TASK_RUNNING"

    # A third subscription with the id takes over: the second stream hears it failed over.
    RawScheduler(mc.address).subscribe(framework_id=fid)
    error = again.take("ERROR")
    assert error["error"]["message"] == "Framework failed over"
    assert again.ended.wait(5)


def test_failover_timeout_kills_the_tasks(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1)
    sched = RawScheduler(mc.address, framework_info(failover_timeout=0.3)).subscribe()
    offer = sched.take("OFFERS")["offers"]["offers"][0]
    sched.launch_group(offer, [task_info("k1", "sleep 30", grace=0.2)])
    sched.update("k1", "TASK_STARTING")
    sched.close()
    mc.wait_until(lambda: mc.task("k1").state == "TASK_KILLED", 10)
    assert mc.frameworks() == []
    call = {"type": "REVIVE", "framework_id": {"value": sched.framework_id}}
    headers = {"Content-Type": "application/json", "Mesos-Stream-Id": sched.stream_id or ""}
    assert post(mc.address, call, headers)[:1] == (403,)


def test_teardown_kills_tasks_and_forgets_the_framework(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=1)
    sched = RawScheduler(mc.address).subscribe()
    offer = sched.take("OFFERS")["offers"]["offers"][0]
    sched.launch_group(offer, [task_info("td", "sleep 30", grace=0.2)])
    sched.ack(sched.update("td", "TASK_STARTING"))
    sched.update("td", "TASK_RUNNING")
    sched.ok("TEARDOWN")
    mc.wait_until(lambda: mc.task("td").state == "TASK_KILLED", 10)
    assert sched.ended.wait(5)
    host, port = mc.address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    info = dict(framework_info(), id={"value": sched.framework_id})
    call = {
        "type": "SUBSCRIBE",
        "framework_id": {"value": sched.framework_id},
        "subscribe": {"framework_info": info},
    }
    conn.request(
        "POST", "/api/v1/scheduler", json.dumps(call), {"Content-Type": "application/json"}
    )
    body = conn.getresponse().read()  # the stream ends after the ERROR
    assert b'"Framework has been removed"' in body
    conn.close()


def test_a_failing_call_is_answered_500_not_dropped(
    minicluster: Minicluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched = RawScheduler(minicluster.address).subscribe()

    def broken(call: dict[str, Any], stream_id: str | None, principal: str | None) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(minicluster.master, "call", broken)
    status, body = sched.call("REVIVE")
    assert status == 500 and b"boom" in body
    host, port = minicluster.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /api/v1/scheduler HTTP/1.1\r\nContent-Length: x\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400 ")


def test_heartbeats_come_at_the_interval(make_minicluster: Any) -> None:
    mc = make_minicluster(agents=0, heartbeat_interval=0.2)
    sched = RawScheduler(mc.address).subscribe()
    for _ in range(2):  # the first follows SUBSCRIBED at once
        assert sched.take("HEARTBEAT", timeout=2) == {"type": "HEARTBEAT"}
    start = time.monotonic()
    for _ in range(3):
        assert sched.take("HEARTBEAT", timeout=2) == {"type": "HEARTBEAT"}
    # Three intervals of 0.2 s; a late reading of the first shortens it a little, never more.
    assert 0.3 <= time.monotonic() - start < 3


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-1, 1) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_FIELDS = ["offer_ids", "operations", "filters", "task_id", "agent_id", "uuid", "tasks", "roles"]


def test_no_call_shape_breaks_the_master(make_minicluster: Any) -> None:
    """Whatever a framework sends, the answer is 202 or a 4xx with a reason, never a crash."""
    mc = make_minicluster(agents=1)
    sched = RawScheduler(mc.address).subscribe()

    @settings(max_examples=150, deadline=None)
    @given(
        kind=st.sampled_from(sorted(KNOWN_CALLS - {"SUBSCRIBE", "TEARDOWN"})),
        body=st.one_of(_JSON, st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=4)),
    )
    def check(kind: str, body: Any) -> None:
        status, text = sched.call(kind, body)
        assert status == 202 or 400 <= status < 500, (kind, body, status, text)

    check()
    sched.ok("REVIVE")
    assert mc.frameworks()[0].connected


def test_subscribe_with_wrong_shapes_is_400(minicluster: Minicluster) -> None:
    for bad in ({"roles": "trainers"}, {"capabilities": ["GPU_RESOURCES"]}, {"id": "x"}):
        call = {"type": "SUBSCRIBE", "subscribe": {"framework_info": framework_info(**bad)}}
        status, _, text = post(minicluster.address, call)
        assert status == 400 and b"must be" in text, (bad, text)
