"""Minicluster helpers for tests: fixtures that run one, and a raw-HTTP v1 scheduler client.

    from minicluster_support import RawScheduler, fixture_make_minicluster  # noqa: F401

    def test_x(make_minicluster):
        mc = make_minicluster(agents=2)            # started, torn down after the test
        sched = RawScheduler(mc.address).subscribe()
        offers = sched.take("OFFERS")["offers"]["offers"]

Import the fixture functions (``fixture_make_minicluster``, ``fixture_minicluster``) into a test
module to use the fixtures ``make_minicluster`` and ``minicluster``.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import pwd
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from peloton.minicluster import AgentSpec, Minicluster
from peloton.minicluster.recordio import Decoder

SMALL = "cpus:4;mem:4096;disk:10000;gpus:2;ports:[31000-31009]"
EXECUTOR = [
    {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}},
    {"name": "mem", "type": "SCALAR", "scalar": {"value": 32}},
    {"name": "disk", "type": "SCALAR", "scalar": {"value": 10}},
]

MiniclusterFactory = Callable[..., Minicluster]
# Agents fail the executors of an unknown framework user: frameworks run as the tests' user.
CURRENT_USER = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture(name="make_minicluster")
def fixture_make_minicluster(tmp_path: Path) -> Iterator[MiniclusterFactory]:
    """A factory of started miniclusters in ``tmp_path`` (fast allocation); all stopped after.

    ``make_minicluster(agents=2, resources=SMALL, attributes=..., **Minicluster kwargs)``;
    ``agents`` may also be a list of AgentSpec.
    """
    started: list[Minicluster] = []

    def make(
        agents: int | list[AgentSpec] = 2,
        resources: str = SMALL,
        attributes: str = "rack:r1;gpu_model:A100",
        **kwargs: Any,
    ) -> Minicluster:
        specs = (
            AgentSpec.uniform(agents, resources, attributes) if isinstance(agents, int) else agents
        )
        kwargs.setdefault("allocation_interval", 0.1)
        if not kwargs.get("simulated"):
            kwargs.setdefault("work_dir", tmp_path / f"mc{len(started)}")
        mc = Minicluster(specs, **kwargs)
        started.append(mc)
        return mc.start()

    yield make
    for mc in started:
        mc.stop()


@pytest.fixture(name="minicluster")
def fixture_minicluster(make_minicluster: MiniclusterFactory) -> Minicluster:
    """A started minicluster with two real-process agents (agent-0, agent-1), SMALL each."""
    return make_minicluster()


def framework_info(**extra: Any) -> dict[str, Any]:
    """A FrameworkInfo of this process's user with GPU_RESOURCES and PARTITION_AWARE (override
    with ``extra``)."""
    info: dict[str, Any] = {
        "user": CURRENT_USER,
        "name": "test-framework",
        "failover_timeout": 60.0,
        "capabilities": [{"type": "GPU_RESOURCES"}, {"type": "PARTITION_AWARE"}],
    }
    info.update(extra)
    return info


def post(
    address: str,
    body: bytes | dict[str, Any],
    headers: dict[str, str] | None = None,
    path: str = "/api/v1/scheduler",
) -> tuple[int, dict[str, str], bytes]:
    """One POST on its own connection: (status, headers, body)."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json"} if headers is None else headers
    try:
        conn.request("POST", path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def get(address: str, path: str) -> tuple[int, dict[str, str], bytes]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


class RawScheduler:
    """A v1 scheduler over plain http.client: the event stream is read by a thread into a list;
    :meth:`take` waits for the next event of a type."""

    def __init__(
        self,
        address: str,
        info: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """``headers``: sent with every request too (e.g. ``Authorization``)."""
        self.address = address
        self.info = info or framework_info()
        self.headers = dict(headers or {})
        self.framework_id: str | None = None
        self.stream_id: str | None = None
        self.response_headers: dict[str, str] = {}
        self.events: list[dict[str, Any]] = []
        self._offers: list[dict[str, Any]] = []
        self.ended = threading.Event()
        self._cond = threading.Condition()
        self._taken = 0
        self._conn: http.client.HTTPConnection | None = None
        self._sock: socket.socket | None = None
        self._calls: http.client.HTTPConnection | None = None

    def subscribe(self, framework_id: str | None = None) -> RawScheduler:
        """SUBSCRIBE (with ``framework_id`` to fail over); waits for SUBSCRIBED."""
        host, port = self.address.rsplit(":", 1)
        self._conn = http.client.HTTPConnection(host, int(port), timeout=30)
        call: dict[str, Any] = {"type": "SUBSCRIBE", "subscribe": {"framework_info": self.info}}
        if framework_id:
            call["framework_id"] = {"value": framework_id}
            call["subscribe"]["framework_info"] = dict(self.info, id={"value": framework_id})
        self._conn.request(
            "POST",
            "/api/v1/scheduler",
            body=json.dumps(call),
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                **self.headers,
            },
        )
        self._sock = self._conn.sock
        resp = self._conn.getresponse()
        if resp.status != 200:
            raise AssertionError(f"SUBSCRIBE answered {resp.status}: {resp.read()!r}")
        self.response_headers = dict(resp.getheaders())
        self.stream_id = resp.getheader("Mesos-Stream-Id")
        self.ended.clear()
        threading.Thread(target=self._read, args=(resp,), daemon=True).start()
        subscribed = self.take("SUBSCRIBED")
        self.framework_id = subscribed["subscribed"]["framework_id"]["value"]
        return self

    def _read(self, resp: http.client.HTTPResponse) -> None:
        decoder = Decoder()
        try:
            while True:
                data = resp.read1(65536)
                if not data:
                    break
                for record in decoder.feed(data):
                    with self._cond:
                        self.events.append(json.loads(record))
                        self._cond.notify_all()
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            pass  # closed by the test (http.client drops its file object) or by the master
        finally:
            self.ended.set()
            with self._cond:
                self._cond.notify_all()

    def take(
        self,
        kind: str,
        timeout: float = 10.0,
        where: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """The first event of ``kind`` (matching ``where``) not taken before; AssertionError with
        the events seen if none comes within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i, event in enumerate(self.events):
                    if event.get("type") == kind and (where is None or where(event)):
                        return self.events.pop(i)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    kinds = [e.get("type") for e in self.events]
                    raise AssertionError(f"no {kind} event in {timeout}s; pending: {kinds}")
                self._cond.wait(remaining)

    def update(
        self, task_id: str, state: str | None = None, timeout: float = 10.0
    ) -> dict[str, Any]:
        """The next UPDATE status of ``task_id`` (in ``state`` if given)."""

        def match(e: dict[str, Any]) -> bool:
            status = e["update"]["status"]
            return status["task_id"]["value"] == task_id and (
                state is None or status["state"] == state
            )

        status: dict[str, Any] = self.take("UPDATE", timeout, match)["update"]["status"]
        return status

    def offer(self, hostname: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
        """The next offer received (of the agent ``hostname`` if given); offers of the same
        OFFERS event are kept for later calls."""
        deadline = time.monotonic() + timeout
        while True:
            for i, offer in enumerate(self._offers):
                if hostname is None or offer["hostname"] == hostname:
                    return self._offers.pop(i)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no offer from {hostname or 'any agent'} in {timeout}s")
            self._offers.extend(self.take("OFFERS", remaining)["offers"]["offers"])

    def drop(self, kind: str) -> None:
        """Forget pending events of ``kind``."""
        with self._cond:
            self.events = [e for e in self.events if e.get("type") != kind]

    def call(self, kind: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        """Send a call on the keep-alive connection; (status, body)."""
        call: dict[str, Any] = {"type": kind, "framework_id": {"value": self.framework_id}}
        if body is not None:
            call[kind.lower()] = body
        if self._calls is None:
            host, port = self.address.rsplit(":", 1)
            self._calls = http.client.HTTPConnection(host, int(port), timeout=10)
        headers = {
            "Content-Type": "application/json",
            "Mesos-Stream-Id": self.stream_id or "",
            **self.headers,
        }
        try:
            self._calls.request("POST", "/api/v1/scheduler", json.dumps(call), headers)
            resp = self._calls.getresponse()
        except (OSError, http.client.HTTPException):
            self._calls.close()
            self._calls = None
            raise
        return resp.status, resp.read()

    def ok(self, kind: str, body: dict[str, Any] | None = None) -> None:
        """Send a call that must be answered 202."""
        status, text = self.call(kind, body)
        assert status == 202, f"{kind} answered {status}: {text!r}"

    def ack(self, status: dict[str, Any]) -> None:
        self.ok(
            "ACKNOWLEDGE",
            {"agent_id": status["agent_id"], "task_id": status["task_id"], "uuid": status["uuid"]},
        )

    def launch_group(
        self,
        offer: dict[str, Any],
        tasks: list[dict[str, Any]],
        executor_id: str | None = None,
        executor_resources: list[dict[str, Any]] | None = None,
        filters: dict[str, Any] | None = None,
    ) -> None:
        """ACCEPT ``offer`` with one LAUNCH_GROUP of ``tasks`` (from :func:`task_info`)."""
        op = self.group_op(offer, tasks, executor_id, executor_resources)
        self.accept(offer, [op], filters)

    def group_op(
        self,
        offer: dict[str, Any],
        tasks: list[dict[str, Any]],
        executor_id: str | None = None,
        executor_resources: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A LAUNCH_GROUP operation of ``tasks`` on ``offer``'s agent, with a DEFAULT executor
        (a new id unless given)."""
        for t in tasks:
            t.setdefault("agent_id", offer["agent_id"])
        executor = {
            "type": "DEFAULT",
            "executor_id": {"value": executor_id or f"ex-{uuid.uuid4().hex[:8]}"},
            "framework_id": {"value": self.framework_id},
            "resources": EXECUTOR if executor_resources is None else executor_resources,
        }
        return {
            "type": "LAUNCH_GROUP",
            "launch_group": {"executor": executor, "task_group": {"tasks": tasks}},
        }

    def accept(
        self,
        offer: dict[str, Any],
        operations: list[dict[str, Any]],
        filters: dict[str, Any] | None = None,
    ) -> None:
        """ACCEPT ``offer`` with ``operations``."""
        body: dict[str, Any] = {"offer_ids": [offer["id"]], "operations": operations}
        if filters is not None:
            body["filters"] = filters
        self.ok("ACCEPT", body)

    def close(self) -> None:
        """Close both connections (the master sees the stream's peer go away)."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        for conn in (self._conn, self._calls):
            if conn is not None:
                conn.close()
        self._conn = self._calls = None
        self._sock = None


def task_info(
    task_id: str,
    command: str,
    cpus: float = 0.5,
    mem: float = 64,
    gpus: int = 0,
    env: dict[str, str] | None = None,
    grace: float | None = None,
    ports: list[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """A TaskInfo running ``command`` by the shell (agent_id is filled in at launch)."""
    resources: list[dict[str, Any]] = [
        {"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}},
        {"name": "mem", "type": "SCALAR", "scalar": {"value": mem}},
    ]
    if gpus:
        resources.append({"name": "gpus", "type": "SCALAR", "scalar": {"value": gpus}})
    if ports:
        ranges = [{"begin": b, "end": e} for b, e in ports]
        resources.append({"name": "ports", "type": "RANGES", "ranges": {"range": ranges}})
    info: dict[str, Any] = {
        "name": task_id,
        "task_id": {"value": task_id},
        "resources": resources,
        "command": {
            "shell": True,
            "value": command,
            "environment": {
                "variables": [
                    {"name": k, "type": "VALUE", "value": v} for k, v in (env or {}).items()
                ]
            },
        },
    }
    if grace is not None:
        info["kill_policy"] = {"grace_period": {"nanoseconds": int(grace * 1e9)}}
    return info


def uuid_bytes(status: dict[str, Any]) -> bytes:
    return base64.b64decode(status["uuid"])
