"""Mesos framework authentication in tests: credentials and secret files, a daemon's refusals, and
what a master answers requests without valid credentials (tests/test_mesos_auth.py on the
minicluster, tests/mesos/test_framework_auth.py on real Mesos 1.11, which compares the two)."""

from __future__ import annotations

import base64
import http.client
import json
import re
import time
from pathlib import Path
from typing import Any

from daemon import ROOT, Peloton, scrape_metrics, wait_for
from minicluster_support import RawScheduler, framework_info

from peloton.minicluster.recordio import Decoder

PRINCIPAL = "peloton"
SECRET = "s3cret-Pa55-9f2c"
OTHER = "other"
# Principals and secrets of the masters the tests start (Mesos's --credentials).
CREDENTIALS = {PRINCIPAL: SECRET, OTHER: "other-secret"}
REFUSALS = "peloton_mesos_subscribe_refusals_total"


def readme_blocks() -> list[tuple[str, str]]:
    """(language, text) of each fenced block of README's "Mesos framework authentication"."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("<!-- mesos framework authentication -->", 1)[1].split("\n<!-- ", 1)[0]
    return re.findall(r"^```(\w*)\n(.*?)^```$", section, flags=re.S | re.M)


def basic(principal: str, secret: str) -> dict[str, str]:
    """An ``Authorization`` header of HTTP Basic authentication."""
    token = base64.b64encode(f"{principal}:{secret}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def write_credentials(path: Path, credentials: dict[str, str] = CREDENTIALS) -> Path:
    """A Mesos ``--credentials`` file (JSON, mode 0600)."""
    items = [{"principal": p, "secret": s} for p, s in credentials.items()]
    path.write_text(json.dumps({"credentials": items}))
    path.chmod(0o600)
    return path


def write_secret(path: Path, secret: str = SECRET, mode: int = 0o600) -> Path:
    """A ``mesos_secret_file`` as an operator writes one (``echo SECRET > FILE``)."""
    path.write_text(secret + "\n")
    path.chmod(mode)
    return path


def auth_args(secret_file: Path | None, principal: str = PRINCIPAL) -> list[str]:
    args = ["--mesos-principal", principal] if principal else []
    return args + (["--mesos-secret-file", str(secret_file)] if secret_file is not None else [])


def refusals(p: Peloton, reason: str = "unauthenticated") -> float:
    """The daemon's SUBSCRIBE refusals of ``reason`` so far."""
    return scrape_metrics(p.proc.metrics_port).get((REFUSALS, (("reason", reason),)), 0)


def wait_subscribed(p: Peloton) -> None:
    """Until the daemon says it subscribed: by then it has saved its framework id (the master
    shows the framework connected a moment before, so a test that stopped the daemon on the
    master's word could restart it without the id)."""
    wait_for(
        lambda: "subscribed to Mesos" in p.proc.stderr,
        30,
        "the daemon's subscription",
        0.05,
        lambda: p.proc.stderr[-3000:],
    )


def check_refused_with_backoff(
    p: Peloton, expected_log: str, reason: str = "unauthenticated"
) -> None:
    """The daemon is refused, says ``expected_log``, keeps serving, and backs off: its third
    SUBSCRIBE comes 1 + 2 s after its first, and no fourth follows at once (4 s later)."""
    stderr = lambda: p.proc.stderr[-3000:]  # noqa: E731
    wait_for(lambda: refusals(p, reason) >= 1, 30, "a first refusal", 0.05, stderr)
    first = time.monotonic()
    wait_for(lambda: refusals(p, reason) >= 3, 30, "three refusals", 0.05, stderr)
    elapsed = time.monotonic() - first
    # 1 + 2 s apart, less however late the first was seen (a scrape takes a while on a busy
    # machine); a daemon that did not back off is refused three times in milliseconds.
    assert elapsed >= 2.0, f"three SUBSCRIBEs refused within {elapsed:.2f}s: no backoff"
    assert refusals(p, reason) == 3  # the next one waits 4 s
    assert p.proc.proc.poll() is None, p.proc.stderr
    assert expected_log in p.proc.stderr, p.proc.stderr


# ---------------------------------------------------------------------------- a master's answers

Answer = tuple[int, str, str | None, str | None, bytes]


def _request(
    address: str, method: str, body: Any, headers: dict[str, str]
) -> http.client.HTTPResponse:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, "/api/v1/scheduler", body=data, headers=headers)
    return conn.getresponse()


def _answer(resp: http.client.HTTPResponse) -> Answer:
    """(status, reason, WWW-Authenticate, Content-Type, body); a subscription's stream (200) is
    closed unread."""
    body = resp.read() if resp.status != 200 else b""
    resp.close()
    return (
        resp.status,
        resp.reason,
        resp.getheader("WWW-Authenticate"),
        resp.getheader("Content-Type"),
        body,
    )


def _first_event(resp: http.client.HTTPResponse) -> dict[str, Any]:
    """The first event of a SUBSCRIBE's RecordIO stream."""
    decoder = Decoder()
    while True:
        data = resp.read1(65536)
        if not data:
            raise AssertionError("the stream ended before its first event")
        records = decoder.feed(data)
        if records:
            event: dict[str, Any] = json.loads(records[0])
            resp.close()
            return event


def unauthenticated_answers(address: str) -> dict[str, Answer]:
    """What the scheduler endpoint answers requests without a valid credential, by case:
    (status, reason, WWW-Authenticate, Content-Type, body)."""
    subscribe = {"type": "SUBSCRIBE", "subscribe": {"framework_info": framework_info()}}
    json_type = {"Content-Type": "application/json"}
    bad_b64 = {"Authorization": "Basic !!!!"}
    cases: dict[str, tuple[str, Any, dict[str, str]]] = {
        "no credentials": ("POST", subscribe, json_type),
        "wrong secret": ("POST", subscribe, {**json_type, **basic(PRINCIPAL, "wrong")}),
        "unknown principal": ("POST", subscribe, {**json_type, **basic("nobody", SECRET)}),
        "secret with a colon": ("POST", subscribe, {**json_type, **basic(PRINCIPAL, SECRET + ":")}),
        "not Basic": ("POST", subscribe, {**json_type, "Authorization": "Bearer abc"}),
        "not base64": ("POST", subscribe, {**json_type, **bad_b64}),
        "no Content-Type": ("POST", subscribe, {}),
        "GET": ("GET", None, {}),
    }
    return {
        name: _answer(_request(address, method, body, headers))
        for name, (method, body, headers) in cases.items()
    }


def principal_answers(address: str) -> dict[str, Any]:
    """What the master answers an authenticated framework whose principal is not the one it
    authenticated as: SUBSCRIBE naming another, a call of another's framework, and a framework
    that subscribes again under its id naming another principal."""
    out: dict[str, Any] = {}
    info = framework_info(principal=PRINCIPAL)
    subscribe = {"type": "SUBSCRIBE", "subscribe": {"framework_info": info}}
    headers = {"Content-Type": "application/json", **basic(OTHER, CREDENTIALS[OTHER])}
    resp = _request(address, "POST", subscribe, headers)
    out["subscribe as another"] = (resp.status, resp.read())
    sched = RawScheduler(address, info, basic(PRINCIPAL, SECRET)).subscribe()
    try:
        other = RawScheduler(address, info, basic(OTHER, CREDENTIALS[OTHER]))
        other.framework_id, other.stream_id = sched.framework_id, sched.stream_id
        out["call as another"] = other.call("REVIVE")
        fid = {"value": sched.framework_id}
        again = {
            "type": "SUBSCRIBE",
            "framework_id": fid,
            "subscribe": {"framework_info": framework_info(principal=OTHER, id=fid)},
        }
        resp = _request(address, "POST", again, headers)
        out["subscribe again as another"] = (resp.status, _first_event(resp))
        other.close()
        out["call"] = sched.call("REVIVE")
        sched.ok("TEARDOWN")
    finally:
        sched.close()
    return out
