"""Calls pipelined to the master on connections of their own (``peloton.hostmgr.calls``),
against a real socket server that answers HTTP/1.1 requests in order."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from peloton.hostmgr.calls import Acknowledger, Pipe, Pipes, Stream, accept_body


class Master:
    """Answers each request with 202 (or the status its JSON body's "status" asks), echoing
    the body; ``close_after`` requests on a connection, it answers with Connection: close."""

    def __init__(self, close_after: int = 0) -> None:
        self.close_after = close_after
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.connections = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        buf, served = b"", 0
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {
                    k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
                }
                length = int(headers["content-length"])
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                with self._lock:
                    self.requests.append((headers, body))
                served += 1
                status = json.loads(body).get("status", 202)
                last = self.close_after and served >= self.close_after
                conn.sendall(
                    b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n%s"
                    % (status, len(body), b"Connection: close\r\n" if last else b"", body)
                )
                if last:
                    return

    def stop(self) -> None:
        self.sock.close()


@pytest.fixture
def master() -> Iterator[Master]:
    m = Master()
    yield m
    m.stop()


def test_calls_are_answered_in_order_on_one_connection(master: Master) -> None:
    stream = Stream(master.address, "stream-1", {"Authorization": "Basic x"})
    pipe = Pipe()
    bodies = [json.dumps({"n": i, "status": 202 if i % 3 else 400}).encode() for i in range(600)]
    answers = pipe.exchange(stream, bodies)
    assert [b for _, b in answers] == bodies  # over several windows, in order
    assert [s for s, _ in answers] == [202 if i % 3 else 400 for i in range(600)]
    assert pipe.exchange(stream, bodies[1:2]) == [(202, bodies[1])]
    assert master.connections == 1
    headers = master.requests[0][0]
    assert headers["mesos-stream-id"] == "stream-1" and headers["authorization"] == "Basic x"
    pipe.close()


def test_a_connection_the_master_closes_mid_pipeline_fails_the_call_and_reconnects() -> None:
    master = Master(close_after=2)
    try:
        pipe = Pipe()
        stream = Stream(master.address, "s")
        with pytest.raises(ValueError, match="closed the connection"):
            pipe.exchange(stream, [b"{}"] * 3)
        assert pipe.exchange(stream, [b"{}"]) == [(202, b"{}")]  # a fresh connection
        assert master.connections == 2
    finally:
        master.stop()


def test_a_master_that_is_gone_raises_os_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        address = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(OSError):
        Pipe().exchange(Stream(address, "s"), [b"{}"])


def test_each_thread_gets_its_own_connection(master: Master) -> None:
    pipes = Pipes()
    stream = Stream(master.address, "s")
    threads = [
        threading.Thread(target=lambda: pipes.exchange(stream, [b"{}"] * 5)) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pipes.exchange(stream, [b"{}"])
    assert master.connections == 4 and len(master.requests) == 16
    pipes.close()


def test_acknowledger_counts_what_the_master_accepted(master: Master) -> None:
    status = {"agent_id": {"value": "a"}, "task_id": {"value": "t"}, "uuid": "dXU="}
    acks = Acknowledger()
    assert acks.send(Stream(master.address, "s"), "fw", [status, {"task_id": {}}]) == 1
    body = json.loads(master.requests[0][1])
    assert body["type"] == "ACKNOWLEDGE" and body["acknowledge"]["uuid"] == "dXU="
    acks.close()


def test_accept_body_is_what_the_driver_sends() -> None:
    body = json.loads(accept_body("fw", ["o1", "o2"], [{"type": "LAUNCH_GROUP"}], {"r": 0}))
    assert body == {
        "type": "ACCEPT",
        "framework_id": {"value": "fw"},
        "accept": {
            "offer_ids": [{"value": "o1"}, {"value": "o2"}],
            "operations": [{"type": "LAUNCH_GROUP"}],
            "filters": {"r": 0},
        },
    }
