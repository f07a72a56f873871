"""The web console's HTTP API against a real daemon (docs/console-api.md): real HTTP requests,
bearer tokens from a tokens file, a minicluster that runs the gangs.

Two daemons per module: ``idle`` has no Mesos master (every gang waits, with its reason) and
``busy`` runs a minicluster of 2 agents x 2 GPUs. Callers (tests/console_support.py): ``ops`` is
a cluster admin, ``alice`` may view /research, ``bob`` may view nothing.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from console_support import (
    CSRF,
    USERS,
    ConsoleDaemon,
    EventStream,
    call,
    console_daemon,
    get,
    job_state,
    task_states,
)
from daemon import in_process_server, migrated_sqlite_url, scrape_metrics, wait_for
from support import make_spec
from tls_support import TestCa

from peloton.api.job_service import KILL_JOB, RESTART_JOB
from peloton.config import ServerConfig
from peloton.console.api import NOT_LEADER
from peloton.console.build import check_exposure as check_console_exposure
from peloton.errors import InvalidArgument, Unavailable
from peloton.server import Server
from peloton.storage import audit as audit_repo

OPS, ALICE, BOB = "ops-token", "alice-token", "bob-token"
LONG_LEASE = {"leader_lease_ttl_seconds": 60.0, "leader_lease_renew_seconds": 5.0}
WAIT = "while [ ! -e {stop} ]; do sleep 0.1; done"


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    with console_daemon(tmp_path_factory.mktemp("idle"), cluster=False, tokens=USERS) as d:
        yield d


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    with console_daemon(tmp_path_factory.mktemp("busy"), tokens=USERS) as d:
        wait_for(
            lambda: len(get(d.url, "/api/v1/cluster", OPS)["racks"]) == 2,
            30,
            "both agents known",
            interval=0.1,
            state=lambda: get(d.url, "/api/v1/cluster", OPS),
        )
        yield d


def gpu_cells(cluster: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """Every GPU cell of a cluster answer, by (hostname, index)."""
    return {
        (h["hostname"], g["index"]): g
        for rack in cluster["racks"]
        for h in rack["hosts"]
        for g in h["gpus"]
    }


def held_by(d: ConsoleDaemon, job_id: str, token: str = OPS) -> dict[tuple[str, int], Any]:
    cells = gpu_cells(get(d.url, "/api/v1/cluster", token))
    return {k: g for k, g in cells.items() if g["job_id"] == job_id}


def wait_running(d: ConsoleDaemon, job_id: str) -> None:
    wait_for(
        lambda: set(task_states(d, job_id).values()) == {"RUNNING"},
        60,
        f"every task of {job_id} RUNNING",
        interval=0.1,
        state=lambda: (job_state(d, job_id), task_states(d, job_id)),
    )


def wait_job(d: ConsoleDaemon, job_id: str, state: str) -> None:
    wait_for(
        lambda: job_state(d, job_id) == state,
        60,
        f"job {job_id} {state}",
        interval=0.1,
        state=lambda: (job_state(d, job_id), task_states(d, job_id)),
    )


def change_naming(
    stream: EventStream, job_id: str, state: Callable[[], object] = lambda: "", timeout: float = 30
) -> list[dict[str, Any]]:
    """The changed events up to the first that names ``job_id``, within ``timeout`` seconds (the
    events seen and ``state()`` are in the failure)."""
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        change = stream.next_change(timeout=max(deadline - time.monotonic(), 0.1))
        seen.append(change)
        if job_id in change["jobs"]:
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"no event named {job_id} in {timeout:g}s: {seen}; {state()}")


# ---------------------------------------------------------------- who calls


def test_callers_are_known_by_token_or_by_the_session_cookie(idle: ConsoleDaemon) -> None:
    nobody = call(idle.url, "GET", "/api/v1/session")
    assert (nobody.status, nobody.body["code"]) == (401, "UNAUTHENTICATED")
    bad = call(idle.url, "GET", "/api/v1/jobs", token="not-a-token")
    assert bad.status == 401 and bad.body["error"] == "token not recognised"
    session = get(idle.url, "/api/v1/session", OPS)
    assert (session["caller"], session["via"], session["anonymous"]) == ("ops", "token", False)
    assert session["leads"] is True and session["admin"] is True

    login = call(idle.url, "POST", "/api/v1/session", body={"token": ALICE})
    assert (login.status, login.body["code"]) == (403, "PERMISSION_DENIED")
    assert "X-Peloton-Console" in login.body["error"]
    refused = call(idle.url, "POST", "/api/v1/session", body={"token": "wrong"}, headers=CSRF)
    assert refused.status == 401
    login = call(idle.url, "POST", "/api/v1/session", body={"token": ALICE}, headers=CSRF)
    assert login.status == 200 and login.body["caller"] == "alice"
    assert login.body["admin"] is False
    cookie = login.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    jar = {"Cookie": cookie.split(";")[0]}
    assert call(idle.url, "GET", "/api/v1/session", headers=jar).body["caller"] == "alice"
    out = call(idle.url, "DELETE", "/api/v1/session", headers=CSRF | jar)
    assert out.status == 200 and "Max-Age=0" in out.headers["Set-Cookie"]
    assert (out.body["anonymous"], out.body["admin"]) == (True, False)


def test_the_page_is_served_with_its_own_files_only(idle: ConsoleDaemon) -> None:
    page = call(idle.url, "GET", "/")
    assert page.status == 200 and page.headers["Content-Type"] == "text/html"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    script = call(idle.url, "GET", "/static/console.js")
    assert "javascript" in script.headers["Content-Type"]
    for missing in ("/static/nothing.js", "/static/../api.py", "/index.html"):
        assert call(idle.url, "GET", missing).status == 404, missing


def test_bad_requests_name_what_is_wrong(idle: ConsoleDaemon) -> None:
    for path, code, field in (
        ("/api/v1/jobs?limit=abc", 400, "limit"),
        ("/api/v1/jobs?bogus=1", 400, "bogus"),
        ("/api/v1/jobs?state=NOPE", 400, "state"),
        ("/api/v1/queue?pool=/nope", 404, "pool"),
        ("/api/v1/jobs/no-such-job", 404, "no-such-job"),
        ("/api/v1/nothing", 404, "path"),
    ):
        answer = call(idle.url, "GET", path, token=OPS)
        assert answer.status == code, (path, answer.body)
        assert field in answer.body["error"], (path, answer.body)
    unknown = call(idle.url, "POST", "/api/v1/jobs/no-such-job/kill", token=OPS, headers=CSRF)
    assert (unknown.status, unknown.body["code"]) == (404, "NOT_FOUND")
    # What the HTTP library answers itself is JSON too: a method no route takes, a request
    # line it cannot read.
    put = call(idle.url, "PUT", "/api/v1/jobs", token=OPS, headers=CSRF)
    assert (put.status, put.body["code"]) == (400, "INVALID_ARGUMENT"), put.body
    assert put.body["error"].startswith("method: PUT is not served"), put.body
    with socket.create_connection(("127.0.0.1", idle.server.console_port), timeout=30) as raw:
        raw.sendall(b"NONSENSE\r\n\r\n")
        answer = raw.makefile("rb").read()
    # (A line that is no HTTP request gets the body alone, as HTTP/0.9 would.)
    refused = json.loads(answer.split(b"\r\n\r\n")[-1])
    assert refused["code"] == "INVALID_ARGUMENT", answer
    assert refused["error"].startswith("request: "), answer


# ---------------------------------------------------------------- reads


def test_a_waiting_job_shows_its_reason_in_the_queue(idle: ConsoleDaemon) -> None:
    assert idle.server.jobs is not None
    research = idle.submit(2, "true", "/research")
    vision = idle.submit(1, "true", "/vision")
    jobs = idle.server.jobs

    def told() -> bool:
        return all(jobs.get_job(j).reason for j in (research, vision))

    wait_for(told, 30, "the resource manager to say why both jobs wait", interval=0.05)
    job = jobs.get_job(research)

    def alices() -> dict[str, Any] | None:
        # An event follows each reason written; the queue follows the event.
        queue = get(idle.url, "/api/v1/queue", ALICE)
        found = {g["job_id"]: g for pool in queue["pools"] for g in pool["gangs"]}
        return found if found.get(research, {}).get("reason") == job.reason else None

    gangs = wait_for(
        alices,
        10,
        "the reason in alice's queue",
        interval=0.05,
        state=lambda: get(idle.url, "/api/v1/queue", ALICE),
    )
    assert vision not in gangs  # alice may not view /vision
    gang = gangs[research]
    assert (gang["reason"], gang["message"]) == (job.reason, job.message)
    assert (gang["pool"], gang["instances"], gang["tasks"]) == ("/research", [0, 1], 2)
    assert gang["position"] >= 1
    everything = get(idle.url, "/api/v1/queue", OPS)
    assert vision in {g["job_id"] for pool in everything["pools"] for g in pool["gangs"]}
    only = get(idle.url, "/api/v1/queue?pool=/vision", OPS)
    assert [p["path"] for p in only["pools"]] == ["/vision"]


def test_a_caller_sees_only_the_jobs_of_pools_it_may_view(idle: ConsoleDaemon) -> None:
    research = idle.submit(1, "true", "/research")
    vision = idle.submit(1, "true", "/vision")
    alice = {j["id"] for j in get(idle.url, "/api/v1/jobs", ALICE)["jobs"]}
    assert research in alice and vision not in alice
    assert get(idle.url, "/api/v1/jobs", BOB)["jobs"] == []
    assert {research, vision} <= {j["id"] for j in get(idle.url, "/api/v1/jobs", OPS)["jobs"]}
    page = call(idle.url, "GET", f"/api/v1/jobs/{vision}", token=ALICE)
    assert (page.status, page.body["code"]) == (403, "PERMISSION_DENIED")
    refused = call(idle.url, "GET", "/api/v1/jobs?pool=/vision", token=ALICE)
    assert refused.status == 403
    mine = get(idle.url, f"/api/v1/jobs/{research}", ALICE)
    assert mine["job"]["pool"] == "/research"
    assert mine["actions"] == {"kill": False, "restart": False}  # alice only views
    assert get(idle.url, f"/api/v1/jobs/{research}", OPS)["actions"] == {
        "kill": True,
        "restart": True,
    }
    filtered = get(idle.url, "/api/v1/jobs?pool=/research&state=PENDING&owner=ops", ALICE)
    assert research in {j["id"] for j in filtered["jobs"]}
    pools = get(idle.url, "/api/v1/pools", BOB)["pools"]
    assert [p["path"] for p in pools] == ["/", "/default", "/research", "/vision"]
    assert "gpu" in pools[2]["resources"]


def test_events_name_changed_jobs_the_caller_may_view(idle: ConsoleDaemon) -> None:
    stream = EventStream(idle.url, ALICE)
    try:
        stream.connected()
        vision = idle.submit(1, "true", "/vision")
        research = idle.submit(1, "true", "/research")
        seen = change_naming(stream, research)
        assert all(vision not in c["jobs"] for c in seen), seen
        assert {"jobs", "queue"} <= set(seen[-1]["topics"])
    finally:
        stream.close()
    refused = call(idle.url, "GET", "/api/v1/events")
    assert refused.status == 401


# ---------------------------------------------------------------- actions


def test_a_kill_from_the_console_kills_the_job_and_is_audited(idle: ConsoleDaemon) -> None:
    assert idle.server.db is not None
    job_id = idle.submit(2, "true", "/research")
    kill = f"/api/v1/jobs/{job_id}/kill"
    assert call(idle.url, "POST", kill, token=OPS).status == 403  # no CSRF header
    refused = call(idle.url, "POST", kill, token=ALICE, headers=CSRF)
    assert (refused.status, refused.body["code"]) == (403, "PERMISSION_DENIED")
    killed = call(idle.url, "POST", kill, token=OPS, headers=CSRF)
    assert killed.status == 200, killed.body
    assert killed.body["job"]["id"] == job_id and killed.body["job"]["goal"] == "KILL"
    wait_job(idle, job_id, "KILLED")
    with idle.server.db.reading() as session:
        records, _ = audit_repo.list_records(
            session, audit_repo.AuditFilter(target=job_id, methods=frozenset({KILL_JOB})), 10, ""
        )
    assert [(r.user, r.code, r.peer) for r in records] == [
        ("ops", "OK", "console:127.0.0.1"),
        ("alice", "PERMISSION_DENIED", "console:127.0.0.1"),
    ]


def test_a_restart_from_the_console_answers_as_the_rpc_does(idle: ConsoleDaemon) -> None:
    assert idle.server.db is not None
    job_id = idle.submit(1, "true", "/research")
    restart = f"/api/v1/jobs/{job_id}/restart"
    early = call(idle.url, "POST", restart, token=OPS, headers=CSRF)
    assert (early.status, early.body["code"]) == (409, "FAILED_PRECONDITION")
    assert "PENDING" in early.body["error"]
    assert (
        call(idle.url, "POST", f"/api/v1/jobs/{job_id}/kill", token=OPS, headers=CSRF).status == 200
    )
    wait_job(idle, job_id, "KILLED")
    again = call(idle.url, "POST", restart, token=OPS, headers=CSRF)
    assert again.status == 200 and again.body["job"]["goal"] == "RUN"
    wait_job(idle, job_id, "PENDING")
    with idle.server.db.reading() as session:
        records, _ = audit_repo.list_records(
            session, audit_repo.AuditFilter(target=job_id, methods=frozenset({RESTART_JOB})), 10, ""
        )
    assert [r.code for r in records] == ["OK", "FAILED_PRECONDITION"]


def test_answers_are_shared_and_compressed_for_clients_that_accept_it(idle: ConsoleDaemon) -> None:
    zipped = call(idle.url, "GET", "/api/v1/pools", token=OPS, headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["Content-Encoding"] == "gzip"
    plain = call(idle.url, "GET", "/api/v1/pools", token=OPS)
    assert "Content-Encoding" not in plain.headers
    assert zipped.body == plain.body


def test_console_requests_are_counted(idle: ConsoleDaemon) -> None:
    get(idle.url, "/api/v1/jobs", OPS)
    samples = scrape_metrics(idle.server.metrics_port)
    key = ("peloton_console_requests_total", (("code", "OK"), ("route", "jobs")))
    assert samples[key] >= 1
    assert ("peloton_console_event_streams", ()) in samples


# ---------------------------------------------------------------- on a cluster


def test_a_gang_appears_on_its_hosts_gpus_while_it_runs_and_leaves_them_when_it_ends(
    busy: ConsoleDaemon, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    stream = EventStream(busy.url, ALICE)
    try:
        stream.connected()
        job_id = busy.submit(2, "echo hello-console; " + WAIT.format(stop=stop), "/research")
        change_naming(stream, job_id)
    finally:
        stream.close()
    wait_running(busy, job_id)
    page = get(busy.url, f"/api/v1/jobs/{job_id}", ALICE)
    hosts = {t["host"] for t in page["tasks"]}
    assert {h["hostname"] for h in page["hosts"]} == hosts
    cells = held_by(busy, job_id, ALICE)
    assert sorted(g["instance_id"] for g in cells.values()) == [0, 1]
    assert {host for host, _ in cells} == hosts
    assert all(g["state"] == "used" and g["pool"] == "/research" for g in cells.values())
    assert all(g["since"] is not None for g in cells.values())

    def reported() -> dict[tuple[str, int], int] | None:
        # Each task reports its GPUs as it starts; the cluster page asks for the reports.
        held_by(busy, job_id, ALICE)
        tasks = get(busy.url, f"/api/v1/jobs/{job_id}", ALICE)["tasks"]
        if not all(t["gpu_indices"] for t in tasks):
            return None
        return {(t["host"], t["gpu_indices"][0]): t["instance_id"] for t in tasks}

    where = wait_for(reported, 30, "the tasks' GPU reports", interval=0.1)
    assert {k: g["instance_id"] for k, g in held_by(busy, job_id, ALICE).items()} == where
    logs = f"/api/v1/jobs/{job_id}/tasks/0/logs"
    wait_for(
        lambda: "hello-console" in get(busy.url, logs, ALICE)["data"],
        30,
        "task 0's stdout",
        interval=0.1,
        state=lambda: call(busy.url, "GET", logs, token=ALICE).body,
    )
    stop.touch()
    wait_job(busy, job_id, "SUCCEEDED")
    # The page is told by an event once the end is committed: the cluster follows at once.
    wait_for(
        lambda: held_by(busy, job_id, ALICE) == {},
        10,
        "its GPUs freed",
        interval=0.05,
        state=lambda: held_by(busy, job_id, ALICE),
    )
    kinds = {e["kind"] for e in get(busy.url, f"/api/v1/jobs/{job_id}", ALICE)["events"]}
    assert {"job", "attempt"} <= kinds


def test_a_caller_without_view_sees_that_gpus_are_used_but_not_by_what(
    busy: ConsoleDaemon, tmp_path: Path
) -> None:
    job_id = busy.submit(2, WAIT.format(stop=tmp_path / "never"), "/vision")
    wait_running(busy, job_id)
    theirs = held_by(busy, job_id, OPS)
    assert len(theirs) == 2
    seen_by_alice = gpu_cells(get(busy.url, "/api/v1/cluster", ALICE))
    for where in theirs:
        cell = seen_by_alice[where]
        assert cell["state"] == "used" and cell["hidden"] is True
        assert cell["job_id"] is None and cell["job_name"] is None
    assert job_id not in str(get(busy.url, "/api/v1/cluster", ALICE))
    kill, logs = f"/api/v1/jobs/{job_id}/kill", f"/api/v1/jobs/{job_id}/tasks/0/logs"
    assert call(busy.url, "GET", logs, token=ALICE).status == 403
    assert call(busy.url, "POST", kill, token=ALICE, headers=CSRF).status == 403
    assert call(busy.url, "POST", kill, token=OPS, headers=CSRF).status == 200
    wait_job(busy, job_id, "KILLED")
    wait_for(
        lambda: held_by(busy, job_id, OPS) == {},
        10,
        "its GPUs freed",
        interval=0.05,
        state=lambda: held_by(busy, job_id, OPS),
    )


def test_an_admin_drains_and_undrains_a_host(busy: ConsoleDaemon) -> None:
    drain = "/api/v1/hosts/gpu-r1-1/drain"
    assert call(busy.url, "POST", drain, token=ALICE, headers=CSRF).status == 403
    drained = call(busy.url, "POST", drain, token=OPS, headers=CSRF)
    assert drained.status == 200, drained.body
    assert drained.body["host"]["state"] == "DRAINING"
    cluster = get(busy.url, "/api/v1/cluster", ALICE)
    assert cluster["summary"]["hosts_draining"] == 1
    undrained = call(busy.url, "POST", "/api/v1/hosts/gpu-r1-1/undrain", token=OPS, headers=CSRF)
    assert undrained.status == 200 and undrained.body["host"]["state"] == "UP"


# ---------------------------------------------------------------- TLS, several daemons


def test_over_https_a_client_certificate_or_a_token_says_who_calls(tmp_path: Path) -> None:
    ca = TestCa(tmp_path / "pki")
    server = ca.server()
    tls = {
        "tls_cert_file": str(server.cert_file),
        "tls_key_file": str(server.key_file),
        "tls_client_ca_file": str(ca.file),
    }
    with console_daemon(tmp_path, cluster=False, tokens=USERS, **tls) as d:
        assert d.url.startswith("https://")
        # A client that connects and never sends its handshake holds nobody else up.
        with socket.create_connection(("127.0.0.1", urlsplit(d.url).port or 0)):
            plain = ssl.create_default_context(cafile=str(ca.file))
            session = call(d.url, "GET", "/api/v1/session", token=OPS, tls=plain)
            assert (session.status, session.body["caller"]) == (200, "ops")
            assert call(d.url, "GET", "/api/v1/session", tls=plain).status == 401
            alice = ca.client("alice", ["research"])
            mutual = ssl.create_default_context(cafile=str(ca.file))
            mutual.load_cert_chain(alice.cert_file, alice.key_file)
            me = call(d.url, "GET", "/api/v1/session", tls=mutual).body
            assert (me["caller"], me["via"]) == ("alice", "certificate")
            login = call(
                d.url, "POST", "/api/v1/session", body={"token": BOB}, headers=CSRF, tls=plain
            )
            assert "Secure" in login.headers["Set-Cookie"]


def test_a_daemon_that_does_not_lead_sends_to_the_leader_for_scheduler_state(
    idle: ConsoleDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    console = idle.server._console
    assert console is not None
    monkeypatch.setattr(console.api, "_leads", lambda: False)
    for path in ("/api/v1/queue", "/api/v1/pools"):
        answer = call(idle.url, "GET", path, token=OPS)
        assert (answer.status, answer.body) == (
            409,
            {
                "error": "this daemon does not lead: open the leader's console",
                "code": "FAILED_PRECONDITION",
            },
        )
    assert get(idle.url, "/api/v1/session", OPS)["leads"] is False
    get(idle.url, "/api/v1/jobs", OPS)
    samples = scrape_metrics(idle.server.metrics_port)
    key = (("code", "FAILED_PRECONDITION"), ("route", "queue"))
    assert samples[("peloton_console_requests_total", key)] >= 1


def test_the_console_port_is_the_daemons_own(tmp_path: Path) -> None:
    url = migrated_sqlite_url(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Server(
            ServerConfig(
                db_url=url, grpc_port=0, metrics_port=0, console_port=port, data_dir=tmp_path
            )
        )
        with pytest.raises(Unavailable, match=f"cannot listen on 127.0.0.1:{port}"):
            server.start()
        server.stop(0)
    with in_process_server(url, tmp_path / "off", console_enabled=False) as off:
        assert (off.console_port, off.console_address) == (0, None)


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({}, "without authentication"),
        ({"auth_tokens_file": "t.yaml"}, "clear text"),
    ],
)
def test_an_exposed_console_needs_what_an_exposed_api_needs(
    tmp_path: Path, options: dict[str, Any], refusal: str
) -> None:
    config = ServerConfig(console_host="0.0.0.0", data_dir=tmp_path, **options)
    with pytest.raises(InvalidArgument, match=f"console_host: .*{refusal}"):
        check_console_exposure(config)
    check_console_exposure(ServerConfig(console_host="0.0.0.0", allow_anonymous=True))


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_follower_serves_jobs_live_and_sends_scheduler_pages_to_the_leader(
    db_url: str, tmp_path: Path
) -> None:
    with (
        # Leases long enough that a loaded machine does not move the lead mid-test.
        in_process_server(db_url, tmp_path / "a", (), daemon_id="a", **LONG_LEASE) as leader,
        in_process_server(db_url, tmp_path / "b", (), daemon_id="b", **LONG_LEASE) as follower,
    ):
        wait_for(leader.leads, 30, "daemon a to lead", interval=0.05)
        assert not follower.leads()
        url = follower.console_address
        assert url is not None
        queue = call(url, "GET", "/api/v1/queue")
        assert (queue.status, queue.body["error"]) == (409, NOT_LEADER)
        assert get(url, "/api/v1/session")["leads"] is False
        stream = EventStream(url)
        try:
            stream.connected()
            assert leader.jobs is not None
            job_id = leader.jobs.create_job(make_spec(1, pool="/default"), "", "")[0].id
            # Written by the leader, polled by the follower.
            change_naming(
                stream, job_id, lambda: f"a leads: {leader.leads()}, b leads: {follower.leads()}"
            )
        finally:
            stream.close()
        assert job_id in {j["id"] for j in get(url, "/api/v1/jobs")["jobs"]}
        assert get(url, f"/api/v1/jobs/{job_id}")["job"]["pool"] == "/default"
