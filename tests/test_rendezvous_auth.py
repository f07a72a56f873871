"""The gang secret: ranks prove to one another that they belong to the same launch of a gang.

The handshake (csrc/tcp_link.h's connect_mesh) is checked against an independent implementation
of it here (:class:`Dialler`, :func:`mac`, with Python's hmac), both directions: a C++ rank
admits a Python dialler that holds the secret and answers a Python acceptor that does; one that
does not is refused. Strangers on a rank's port (garbage, a hello without a secret, a wrong MAC,
a handshake recorded from an earlier gang of the same secret and replayed, silence) are closed,
logged once and counted while the rank goes on waiting: the ring still forms and its allreduce
is right. End to end, a gang on the minicluster gets a secret for its launch, a stranger that
connects to a rank's port while the gang forms is refused and logged in the task's stderr, and
the job succeeds with the right result; the secret shows in no job, task or event.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from collective_support import free_ports
from daemon import Peloton, start_minicluster, wait_for
from elastic_support import stderr_of
from hypothesis import given
from hypothesis import strategies as st

from peloton.collective import _core
from peloton.core import gangenv
from peloton.core.gangenv import GangEnv
from peloton.elastic.endpoints import Endpoints
from peloton.minicluster import AgentSpec, Minicluster
from peloton.v1 import job_pb2

SECRET = "a" * 64
OTHER_SECRET = "b" * 64
# The wire format of csrc/tcp_link.cc.
MAGIC, MAGIC_AUTH = 0x504C5432, 0x504C5433
ACCEPTOR = b"peloton gang handshake v1: acceptor"
DIALLER = b"peloton gang handshake v1: dialler"
DATA, CONTROL = 0, 1
TIMEOUT = 20.0


def hello(
    rank: int, size: int, channel: int, generation: int = 0, magic: int = MAGIC_AUTH
) -> bytes:
    """A dialler's hello: its rank, the gang's size, the channel, its generation, a nonce."""
    head = struct.pack("<IIIBI", magic, rank, size, channel, generation)
    return head + os.urandom(16) if magic == MAGIC_AUTH else head


def mac(secret: str, label: bytes, sent: bytes, generation: int, nonce: bytes) -> bytes:
    """HMAC-SHA256 of a handshake's transcript: label, the dialler's hello, the acceptor's
    generation and nonce (the label and generation as the runtime's wire writes them)."""
    message = struct.pack("<I", len(label)) + label + sent + struct.pack("<I", generation) + nonce
    return hmac.new(secret.encode(), message, hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += piece
    return data


def connect(where: int | tuple[str, int], timeout: float = TIMEOUT) -> socket.socket:
    """A connection to ``(host, port)`` (a port of 127.0.0.1) once something listens there."""
    address = where if isinstance(where, tuple) else ("127.0.0.1", where)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection(address, timeout=timeout)
            sock.settimeout(timeout)
            return sock
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listened at {address} within {timeout} s") from None
            time.sleep(0.01)  # the rank's thread has not reached listen() yet


class Dialler:
    """One connection a rank opens, spoken by the book; ``sent``: every byte it sent."""

    def __init__(
        self, where: int | tuple[str, int], secret: str, rank: int, size: int, channel: int
    ) -> None:
        self.sock = connect(where)
        self.hello = hello(rank, size, channel)
        self.sock.sendall(self.hello)
        answer = recv_exact(self.sock, 4 + 16 + 32)
        (self.generation,) = struct.unpack("<I", answer[:4])
        self.nonce, proof = answer[4:20], answer[20:]
        self.acceptor_ok = hmac.compare_digest(
            proof, mac(secret, ACCEPTOR, self.hello, self.generation, self.nonce)
        )
        self.answer = mac(secret, DIALLER, self.hello, self.generation, self.nonce)

    def finish(self) -> bytes:
        """Sends the answer; the acceptor's one-byte acknowledgement."""
        self.sock.sendall(self.answer)
        return recv_exact(self.sock, 1)


def runtime(
    rank: int, size: int, ports: list[int], secret: str, timeout: float = TIMEOUT, **kw: Any
) -> _core.Runtime:
    """A rank of a gang on 127.0.0.1 (it blocks until the gang has connected)."""
    hosts = ["127.0.0.1"] * size
    return _core.Runtime(rank, size, hosts, ports, timeout, 1 << 20, secret=secret, **kw)


class Started:
    """A rank's runtime made on a thread (it blocks until its gang has connected)."""

    def __init__(self, make: Callable[[], _core.Runtime]) -> None:
        self.rt: _core.Runtime | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(make,), daemon=True)
        self._thread.start()

    def _run(self, make: Callable[[], _core.Runtime]) -> None:
        try:
            self.rt = make()
        except BaseException as exc:  # handed to the test by result()
            self.error = exc

    def result(self) -> _core.Runtime:
        self._thread.join(TIMEOUT + 10)
        assert not self._thread.is_alive(), "the rank is still connecting"
        if self.error is not None:
            raise self.error
        assert self.rt is not None
        return self.rt


def allreduce(rts: list[_core.Runtime]) -> list[list[float]]:
    """Every rank's sum of [rank + 1] * 4, run on all ranks at once."""
    arrays = [np.full(4, r + 1.0, dtype=np.float32) for r in range(len(rts))]
    outs = [np.empty_like(a) for a in arrays]
    handles = [
        rt.enqueue(0, "x", 0, 0, 0, [4], a.ctypes.data, o.ctypes.data, a.nbytes)
        for rt, a, o in zip(rts, arrays, outs, strict=True)
    ]
    for rt, h in zip(rts, handles, strict=True):
        rt.wait(h)
    return [o.tolist() for o in outs]


def address_of(sock: socket.socket) -> str:
    """Where a connection comes from, as the runtime's log writes it."""
    return "{}:{}".format(*sock.getsockname())


def refusals(text: str) -> list[str]:
    return [line for line in text.splitlines() if "refused a connection from" in line]


def wait_refused(count: int) -> None:
    wait_for(
        lambda: _core.refused_connections() >= count,
        TIMEOUT,
        f"{count} refused connections",
        interval=0.01,
        state=lambda: f"{_core.refused_connections()} refused",
    )


@contextlib.contextmanager
def shut(*rts: _core.Runtime) -> Iterator[None]:
    try:
        yield
    finally:
        threads = [threading.Thread(target=rt.shutdown) for rt in rts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


# ---------------------------------------------------------------- the handshake, both directions


def test_a_rank_admits_a_dialler_that_proves_the_secret_and_proves_it_back() -> None:
    ports = free_ports(2)
    rank0 = Started(lambda: runtime(0, 2, ports, SECRET))
    data = Dialler(ports[0], SECRET, 1, 2, DATA)
    assert data.acceptor_ok, "rank 0's MAC is not HMAC-SHA256 of the transcript under the secret"
    assert data.finish() == b"\x01"
    control = Dialler(ports[0], SECRET, 1, 2, CONTROL)
    assert control.acceptor_ok
    assert control.finish() == b"\x01"
    rt = rank0.result()  # both of rank 1's connections counted: the gang formed
    data.sock.close()
    control.sock.close()
    rt.shutdown()


def test_a_dialler_answers_only_an_acceptor_that_proves_the_secret() -> None:
    for acceptor_secret, admitted in ((SECRET, True), (OTHER_SECRET, False)):
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(TIMEOUT)
        ports = [listener.getsockname()[1], free_ports(1)[0]]
        rank1 = Started(functools.partial(runtime, 1, 2, ports, SECRET, timeout=3.0))
        conn, _ = listener.accept()
        sent = recv_exact(conn, 17 + 16)
        assert struct.unpack("<IIIBI", sent[:17]) == (MAGIC_AUTH, 1, 2, DATA, 0)
        nonce = os.urandom(16)
        proof = mac(acceptor_secret, ACCEPTOR, sent, 0, nonce)
        conn.sendall(struct.pack("<I", 0) + nonce + proof)
        if admitted:
            answer = recv_exact(conn, 32)
            assert hmac.compare_digest(answer, mac(SECRET, DIALLER, sent, 0, nonce))
            conn.close()  # no acknowledgement: rank 1 fails, having answered correctly
            with pytest.raises(_core.CollectiveError, match="rank 0 closed the connection"):
                rank1.result()
        else:
            with pytest.raises(_core.CollectiveError) as failed:
                rank1.result()
            assert "does not hold the gang's secret (PELOTON_GANG_SECRET)" in str(failed.value)
            assert SECRET not in str(failed.value)
            conn.close()
        listener.close()


def test_ranks_of_another_generation_are_told_apart_from_strangers() -> None:
    ports = free_ports(2)
    rank0 = Started(lambda: runtime(0, 2, ports, SECRET, generation=2))
    rank1 = Started(lambda: runtime(1, 2, ports, SECRET, generation=1))
    for started in (rank0, rank1):
        with pytest.raises(_core.CollectiveError, match="is of generation"):
            started.result()


# ---------------------------------------------------------------- strangers


class RecordingProxy:
    """Forwards one port to another and keeps every byte each connection's client sent."""

    def __init__(self, upstream: int) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.upstream = upstream
        self.sent: list[bytearray] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = connect(self.upstream)
                record = bytearray()
                self.sent.append(record)
                threading.Thread(
                    target=self._copy, args=(client, server, record), daemon=True
                ).start()
                threading.Thread(
                    target=self._copy, args=(server, client, None), daemon=True
                ).start()

    @staticmethod
    def _copy(src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if record is not None:
                    record += data
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()


def recorded_handshake() -> bytes:
    """What rank 1 of a gang of two with SECRET sent on its data connection to rank 0 while the
    gang formed (hello and answer), recorded on the wire."""
    ports = free_ports(2)
    proxy = RecordingProxy(ports[0])
    rank0 = Started(lambda: runtime(0, 2, ports, SECRET))
    rank1 = runtime(1, 2, [proxy.port, ports[1]], SECRET)
    rt0 = rank0.result()
    with shut(rt0, rank1):
        assert allreduce([rt0, rank1]) == [[3.0] * 4] * 2
    proxy.close()
    return bytes(proxy.sent[0][: 17 + 16 + 32])


def test_strangers_are_refused_and_logged_and_the_ring_still_forms(
    capfd: pytest.CaptureFixture[str],
) -> None:
    replay = recorded_handshake()
    ports = free_ports(3)
    before = _core.refused_connections()
    rank0 = Started(lambda: runtime(0, 3, ports, SECRET))
    strangers: list[tuple[socket.socket, str]] = []

    def stranger(data: bytes, why: str) -> socket.socket:
        sock = connect(ports[0])
        sock.sendall(data)
        strangers.append((sock, why))
        wait_refused(before + len(strangers))
        return sock

    stranger(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not a peloton hello")
    stranger(
        hello(1, 3, DATA, magic=MAGIC), "an unauthenticated hello (the peer has no gang secret)"
    )
    # Rank 1's hello with a made-up answer: it takes no slot.
    stranger(hello(1, 3, DATA) + os.urandom(32), "a wrong MAC")
    # A genuine rank's handshake under this secret, played back: the challenge is new.
    stranger(replay, "a wrong MAC")
    stranger(b"", "silent past the 5 s handshake timeout")
    # The genuine ranks come now and the ring forms.
    rank1 = Started(lambda: runtime(1, 3, ports, SECRET))
    rank2 = runtime(2, 3, ports, SECRET)
    rts = [rank0.result(), rank1.result(), rank2]
    with shut(*rts):
        assert allreduce(rts) == [[6.0] * 4] * 3
    assert _core.refused_connections() == before + 5
    lines = refusals(capfd.readouterr().err)
    assert len(lines) == 5, lines  # each stranger logged once
    for line, (sock, why) in zip(lines, strangers, strict=True):
        address = address_of(sock)
        assert line.startswith(f"peloton collective: rank 0 refused a connection from {address}: ")
        assert why in line
        assert SECRET not in line
        sock.close()


def test_a_rank_without_the_secret_is_a_stranger_to_one_with_it(
    capfd: pytest.CaptureFixture[str],
) -> None:
    ports = free_ports(2)
    rank0 = Started(lambda: runtime(0, 2, ports, SECRET, timeout=2.0))
    # Refused on its magic, before the rest of its hello is read: reset, or closed.
    with pytest.raises(_core.CollectiveError, match=r"rank 0 (closed the connection|lost)"):
        runtime(1, 2, ports, "", timeout=2.0)
    with pytest.raises(_core.CollectiveError, match=r"ranks \[1\] did not connect within 2"):
        rank0.result()
    assert "an unauthenticated hello (the peer has no gang secret)" in capfd.readouterr().err


def test_without_a_secret_a_gang_forms_as_before_and_refuses_only_garbage(
    capfd: pytest.CaptureFixture[str],
) -> None:
    ports = free_ports(2)
    before = _core.refused_connections()
    rank0 = Started(lambda: runtime(0, 2, ports, ""))
    garbage = connect(ports[0])
    garbage.sendall(b"\x00" * 17)
    wait_refused(before + 1)
    rank1 = runtime(1, 2, ports, "")
    rts = [rank0.result(), rank1]
    with shut(*rts):
        assert allreduce(rts) == [[3.0] * 4] * 2
    garbage.close()
    assert "not a peloton hello" in capfd.readouterr().err


# ---------------------------------------------------------------- the gang environment


@given(secret=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1))
def test_the_secret_round_trips_through_the_environment_and_no_repr_shows_it(secret: str) -> None:
    env = GangEnv(
        rank=0,
        size=1,
        peers=("h:1",),
        timeout=gangenv.DEFAULT_TIMEOUT,
        fusion_threshold=gangenv.DEFAULT_FUSION_THRESHOLD,
        secret=secret,
    )
    variables = env.to_env()
    assert variables[gangenv.GANG_SECRET] == secret
    assert GangEnv.from_env(variables) == env
    assert "secret" not in repr(env)
    assert gangenv.GANG_SECRET not in replace(env, secret="").to_env()


def test_new_secrets_are_256_random_bits() -> None:
    made = {gangenv.new_secret() for _ in range(100)}
    assert len(made) == 100
    assert all(len(s) == 64 and int(s, 16) >= 0 for s in made)


def test_an_elastic_job_keeps_one_secret_for_every_launch_and_jobs_differ() -> None:
    class Quiet:
        def generation(self) -> int:
            return 0

        def wait(self, seen: int, timeout: float) -> int:
            return seen

    spec = job_pb2.JobSpec()
    spec.gang.min_instances, spec.gang.max_instances = 2, 4
    endpoints = Endpoints(None, Quiet(), "127.0.0.1")  # type: ignore[arg-type]
    try:
        first = endpoints.task_env("job-a", spec)[gangenv.GANG_SECRET]
        assert endpoints.task_env("job-a", spec)[gangenv.GANG_SECRET] == first
        assert endpoints.task_env("job-b", spec)[gangenv.GANG_SECRET] != first
        assert len(first) == 64
    finally:
        endpoints.close()


# ---------------------------------------------------------------- end to end

AGENT = "cpus:4;mem:8192;disk:10000;gpus:2;ports:[31000-31100]"

# Rank 0 joins the gang at once; the others wait for the test's go (a file) so that strangers
# reach rank 0 while it waits for them. Each rank writes what it was told (the test needs the
# secret to make a handshake to replay, and rank 0's address), and at the end its allreduce
# result and how many connections its runtime refused.
WORKER = r"""
import json, os, sys, time
import numpy as np
import peloton.collective as pc

out = sys.argv[1]
rank = int(os.environ["PELOTON_RANK"])
told = {k: os.environ[k] for k in ("PELOTON_GANG_SECRET", "PELOTON_PEERS", "PELOTON_INSTANCE_ID")}
with open(os.path.join(out, f"env-{rank}.json"), "w") as f:
    json.dump(told, f)
while rank != 0 and not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.05)
pc.init(timeout=60)
total = pc.allreduce(np.full(4, rank + 1.0), op="sum")
with open(os.path.join(out, f"{rank}.json"), "w") as f:
    json.dump({"total": total.tolist(), "refused": pc.refused_connections()}, f)
pc.shutdown()
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    agents = [AgentSpec(f"agent-{i}", resources=AGENT) for i in range(2)]
    mc = start_minicluster(agents, tmp_path / "cluster")
    yield mc
    mc.stop()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_stranger_on_a_ranks_port_is_refused_and_the_job_succeeds(
    peloton: Peloton, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    job_id = peloton.submit(f"exec {sys.executable} {script} {out}", 3)
    wait_for(
        lambda: all((out / f"env-{r}.json").exists() for r in range(3)),
        60,
        "every rank to start",
        state=lambda: peloton.describe(job_id),
    )
    told = [json.loads((out / f"env-{r}.json").read_text()) for r in range(3)]
    secrets = {t["PELOTON_GANG_SECRET"] for t in told}
    assert len(secrets) == 1, "the ranks of one launch hold one secret"
    secret = secrets.pop()
    host, _, port = told[0]["PELOTON_PEERS"].split(",")[0].rpartition(":")
    rank0 = (host, int(port))

    garbage = connect(rank0)
    garbage.sendall(b"\x16\x03\x01\x02\x00 not a rank")
    wrong = Dialler(rank0, OTHER_SECRET, 1, 3, DATA)
    assert not wrong.acceptor_ok  # rank 0 holds another secret than this stranger
    wrong.sock.sendall(wrong.answer)
    # A handshake made with the right secret for one challenge, then played back on a new
    # connection: the challenge is new.
    genuine = Dialler(rank0, secret, 1, 3, DATA)
    assert genuine.acceptor_ok
    genuine_address = address_of(genuine.sock)
    genuine.sock.close()
    replayed = connect(rank0)
    replayed.sendall(genuine.hello + genuine.answer)
    strangers = {
        address_of(garbage): "not a peloton hello",
        address_of(wrong.sock): "a wrong MAC",
        genuine_address: "it closed the connection",
        address_of(replayed): "a wrong MAC",
    }
    (out / "go").write_text("")

    job = peloton.wait_done(job_id, timeout=120)
    assert job.state == job_pb2.JOB_STATE_SUCCEEDED, peloton.describe(job_id)
    results = [json.loads((out / f"{r}.json").read_text()) for r in range(3)]
    assert [r["total"] for r in results] == [[6.0] * 4] * 3
    assert [r["refused"] for r in results] == [4, 0, 0]
    log = stderr_of(peloton, job_id, int(told[0]["PELOTON_INSTANCE_ID"]))
    lines = refusals(log)
    assert len(lines) == 4, log
    for address, why in strangers.items():
        mine = [x for x in lines if f" from {address}: " in x]
        assert len(mine) == 1 and why in mine[0], (address, why, lines)
    for sock in (garbage, wrong.sock, replayed):
        sock.close()
    assert secret not in log
    # The secret is in the tasks' environment only: no job, task or event shows it.
    shown = [
        peloton.client.get_job(job_id),
        peloton.client.list_tasks(job_id),
        *(peloton.client.get_task(job_id, i) for i in range(3)),
        *peloton.client.watch_job(job_id),  # its events: the job ended, so the stream does
    ]
    assert not [m for m in shown if secret in str(m)]
