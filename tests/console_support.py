"""Helpers for the web console's tests (the API's and the browser's): a daemon with its console,
optionally on a minicluster and with bearer tokens, and plain HTTP calls to it.

``console_daemon(tmp_path, cluster=True)`` is what the browser tests reuse: a started in-process
daemon (SQLite, ports from the kernel) whose console is ``ConsoleDaemon.url``, with the pools
``/research`` and ``/vision`` and, with ``cluster``, a minicluster of 2 agents x 2 GPUs on racks r1
and r2 that runs real tasks. With ``tokens`` (token -> user), callers must show a token
(:data:`USERS` is such a set: ``ops`` a cluster admin, ``alice`` may view /research, ``bob``
nothing).
"""

from __future__ import annotations

import gzip
import http.client
import json
import ssl
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from daemon import in_process_server, migrated_sqlite_url, start_minicluster
from support import make_spec

from peloton.core.access import Grant, Permission, Principal
from peloton.core.pools import PoolConfig
from peloton.minicluster import AgentSpec, Minicluster
from peloton.security.tokens import token_digest
from peloton.server import Server

AGENTS = [
    AgentSpec(
        f"gpu-r{r}-1",
        resources="cpus:4;mem:8192;disk:10000;gpus:2;ports:[31000-31100]",
        attributes=f"rack:r{r};gpu_model:A100",
    )
    for r in (1, 2)
]
# Tokens of the test callers: ops is a cluster admin, alice may view /research, bob nothing.
USERS = {"ops-token": "ops", "alice-token": "alice", "bob-token": "bob"}
POOLS = (
    PoolConfig("/research", grants=(Grant(Principal("user", "alice"), Permission.VIEW),)),
    PoolConfig("/vision"),
)
# The header every POST and DELETE of the page carries.
CSRF = {"X-Peloton-Console": "1"}


@dataclass
class ConsoleDaemon:
    server: Server
    cluster: Minicluster | None
    url: str  # the console's, http://127.0.0.1:PORT

    def submit(self, instances: int, command: str, pool: str, owner: str = "ops", **kw: Any) -> str:
        """Create a gang (through the job manager, as CreateJob does); returns its id."""
        assert self.server.jobs is not None
        spec = make_spec(instances, command=command, pool=pool, **kw)
        return self.server.jobs.create_job(spec, "", owner)[0].id


def write_tokens(path: Path, users: Mapping[str, str]) -> Path:
    """A tokens file (auth_tokens_file) of ``users`` (token -> user)."""
    lines = ["tokens:"]
    for token, user in users.items():
        lines += [f"  - user: {user}", f"    sha256: {token_digest(token)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def console_daemon(
    tmp_path: Path,
    *,
    cluster: bool = True,
    tokens: Mapping[str, str] | None = None,
    **options: Any,
) -> Iterator[ConsoleDaemon]:
    """A started daemon with its console on a kernel-picked port (see the module's doc);
    ``options``: more ServerConfig options. Everything is stopped when the block ends."""
    mc = start_minicluster(AGENTS, tmp_path / "cluster") if cluster else None
    if mc is not None:
        options |= {"mesos_master": mc.address, "offer_refuse_seconds": 1}
    if tokens is not None:
        options |= {
            "auth_tokens_file": str(write_tokens(tmp_path / "tokens.yaml", tokens)),
            "admins": "user:ops",
        }
    try:
        url = migrated_sqlite_url(tmp_path)
        with in_process_server(url, tmp_path / "data", pools=(), **options) as server:
            assert server.resmgr is not None and server.console_address is not None
            for pool in POOLS:
                server.resmgr.create_pool(pool)
            yield ConsoleDaemon(server, mc, server.console_address)
    finally:
        if mc is not None:
            mc.stop()


# ---------------------------------------------------------------- HTTP


@dataclass
class Answer:
    status: int
    body: Any
    headers: http.client.HTTPMessage


def connect(
    url: str, tls: ssl.SSLContext | None = None, timeout: float = 30.0
) -> http.client.HTTPConnection:
    """A connection to the console at ``url`` (https:// with ``tls``)."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout, context=tls
        )
    return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)


def call(
    url: str,
    method: str,
    path: str,
    *,
    token: str | None = None,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
) -> Answer:
    """One request to the console at ``url``; JSON answers are decoded."""
    conn = connect(url, tls)
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        conn.request(method, path, body=data, headers=sent)
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    if response.headers.get("Content-Encoding") == "gzip":
        raw = gzip.decompress(raw)
    kind = response.headers.get("Content-Type", "")
    decoded = json.loads(raw) if kind.startswith("application/json") else raw
    return Answer(response.status, decoded, response.headers)


def get(url: str, path: str, token: str | None = None) -> Any:
    """The JSON of a GET that must succeed."""
    answer = call(url, "GET", path, token=token)
    assert answer.status == 200, (path, answer.status, answer.body)
    return answer.body


class EventStream:
    """``GET /api/v1/events``, read as the page reads it: :meth:`next_change` returns the next
    ``changed`` event's data, waiting at most ``timeout`` seconds for each line."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        self._conn = connect(url, timeout=timeout)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._conn.request("GET", "/api/v1/events", headers=headers)
        self.response = self._conn.getresponse()
        self.seen: list[str] = []  # every line read, for failure messages

    def connected(self) -> None:
        """Wait until the server says the stream is subscribed."""
        assert self.response.status == 200, self.response.read()
        while self._line() != ": connected":
            pass

    def _line(self) -> str:
        line = self.response.readline()
        if not line:
            raise AssertionError(f"the event stream ended; it sent: {self.seen}")
        text = line.decode().rstrip("\n")
        self.seen.append(text)
        return text

    def next_change(self, timeout: float = 30.0) -> dict[str, Any]:
        """The next ``changed`` event's data; fails after ``timeout`` seconds of keepalives."""
        deadline = time.monotonic() + timeout
        event = ""
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"no change in {timeout:g}s; the stream sent: {self.seen}")
            line = self._line()
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "changed":
                return dict(json.loads(line.removeprefix("data: ")))

    def close(self) -> None:
        self._conn.close()


def task_states(d: ConsoleDaemon, job_id: str) -> dict[int, str]:
    assert d.server.jobs is not None
    tasks, _ = d.server.jobs.list_tasks(job_id)
    return {t.instance_id: t.state.value for t in tasks}


def job_state(d: ConsoleDaemon, job_id: str) -> str:
    assert d.server.jobs is not None
    return d.server.jobs.get_job(job_id).state.value
