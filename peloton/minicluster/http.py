"""HTTP for the minicluster: the master's v1 scheduler endpoint and the agents' ``/files/read``.

Status codes and messages follow Mesos 1.11's ``master/http.cpp`` and ``files/files.cpp``. With
credentials (a master's ``--authenticate_http_frameworks`` with the ``basic`` authenticator and
``--credentials``) the scheduler endpoint takes only requests with HTTP Basic authentication of a
principal and its secret, and answers anything else as libprocess does (observed on Mesos 1.11:
every missing, malformed or wrong credential gets the same 401).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import queue
import select
import socket
import stat
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from peloton.minicluster.master import KNOWN_CALLS, VERSION, CallError, Master, check_uuid
from peloton.minicluster.model import Subscriber
from peloton.minicluster.recordio import encode_event
from peloton.minicluster.validation import missing_fields

log = logging.getLogger(__name__)

SCHEDULER_PATHS = ("/api/v1/scheduler", "/master/api/v1/scheduler")
# The authentication realm of the scheduler endpoint (DEFAULT_HTTP_FRAMEWORK_AUTHENTICATION_REALM).
SCHEDULER_REALM = "mesos-master-scheduler"
# What Mesos 1.11 answers a scheduler request without valid credentials (the body is libprocess's
# default for an empty one).
UNAUTHORIZED_BODY = b"401 Unauthorized."
# How often a stream writer looks for a peer that went away while nothing was to be written.
_PEER_CHECK = 0.25
# Request header limits (http.server's): longer lines or more headers are answered 431.
_MAX_HEADER_LINE = 65536
_MAX_HEADERS = 100
# /files/read without a length: Mesos reads 16 pages.
_DEFAULT_READ = 16 * 4096

# The JSON shapes of the call fields the minicluster reads, as the protobuf messages define them:
# a type (str, float: any number, dict: any object), a list [shape], or an object {field: shape}
# (other fields are let through). Mesos answers a mismatch with 400 when converting JSON.
_IDV: dict[str, Any] = {"value": str}
_FILTERS: dict[str, Any] = {"refuse_seconds": float}
_OPERATION: dict[str, Any] = {
    "type": str,
    "launch": {"task_infos": [dict]},
    "launch_group": {"executor": dict, "task_group": {"tasks": [dict]}},
}
_SHAPES: dict[str, Any] = {
    "accept": {"offer_ids": [_IDV], "operations": [_OPERATION], "filters": _FILTERS},
    "decline": {"offer_ids": [_IDV], "filters": _FILTERS},
    "revive": {"roles": [str]},
    "suppress": {"roles": [str]},
    "kill": {"task_id": _IDV, "agent_id": _IDV, "kill_policy": dict},
    "shutdown": {"executor_id": _IDV, "agent_id": _IDV},
    "acknowledge": {"agent_id": _IDV, "task_id": _IDV, "uuid": str},
    "reconcile": {"tasks": [{"task_id": _IDV, "agent_id": _IDV}]},
    "message": {"agent_id": _IDV, "executor_id": _IDV, "data": str},
    "request": {"requests": [dict]},
    "framework_id": _IDV,
}
_JSON_NAMES = {str: "string", float: "number", dict: "object"}


def _check_shape(value: Any, shape: Any, path: str) -> None:
    if isinstance(shape, list):
        if not isinstance(value, list):
            raise _shape_error(path, "an array")
        for i, item in enumerate(value):
            _check_shape(item, shape[0], f"{path}[{i}]")
    elif isinstance(shape, dict):
        if not isinstance(value, dict):
            raise _shape_error(path, "an object")
        for name, inner in shape.items():
            if name in value:
                _check_shape(value[name], inner, f"{path}.{name}")
    elif shape is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _shape_error(path, "a number")
    elif not isinstance(value, shape):
        raise _shape_error(path, f"a JSON {_JSON_NAMES[shape]}")


def _shape_error(path: str, want: str) -> CallError:
    return CallError(
        400,
        "Failed to parse body into Call protobuf: Failed to convert JSON into Call protobuf: "
        f"'{path}' must be {want}",
    )


# Per call type, the field Mesos requires (``Expecting 'accept' to be present``).
_REQUIRED_BODY = {
    "SUBSCRIBE": "subscribe",
    "ACCEPT": "accept",
    "DECLINE": "decline",
    "KILL": "kill",
    "SHUTDOWN": "shutdown",
    "ACKNOWLEDGE": "acknowledge",
    "RECONCILE": "reconcile",
    "MESSAGE": "message",
    "REQUEST": "request",
}


def validate_call(call: Any) -> dict[str, Any]:
    """The call if it is well formed, else CallError 400 with Mesos's kind of message."""
    if not isinstance(call, dict):
        raise CallError(400, "Failed to parse body into Call protobuf: expected a JSON object")
    kind = call.get("type")
    if kind is None:
        raise CallError(400, "Failed to validate scheduler::Call: Expecting 'type' to be present")
    if kind not in KNOWN_CALLS:
        raise CallError(
            400,
            f"Failed to parse body into Call protobuf: Failed to convert JSON into Call "
            f"protobuf: Failed to find enum for '{kind}'",
        )
    for name, shape in _SHAPES.items():
        if name in call:
            _check_shape(call[name], shape, name)
    body_field = _REQUIRED_BODY.get(kind)
    if body_field is not None and not isinstance(call.get(body_field), dict):
        raise CallError(
            400, f"Failed to validate scheduler::Call: Expecting '{body_field}' to be present"
        )
    if kind == "SUBSCRIBE":
        _validate_subscribe(call)
    elif not isinstance(call.get("framework_id"), dict) or not call["framework_id"].get("value"):
        raise CallError(
            400, "Failed to validate scheduler::Call: Expecting 'framework_id' to be present"
        )
    if kind == "KILL" and not isinstance(call["kill"].get("task_id"), dict):
        raise CallError(
            400, "Failed to parse body into Call protobuf: Missing required fields: kill.task_id"
        )
    if kind == "ACKNOWLEDGE":
        missing = [f for f in ("agent_id", "task_id", "uuid") if f not in call["acknowledge"]]
        if missing:
            raise CallError(
                400,
                "Failed to parse body into Call protobuf: Missing required fields: "
                + ", ".join(f"acknowledge.{f}" for f in missing),
            )
        check_uuid(call["acknowledge"]["uuid"])
    if kind == "ACCEPT":
        missing = missing_fields(call)
        if missing:
            raise CallError(
                400,
                "Failed to parse body into Call protobuf: Missing required fields: "
                + ", ".join(missing),
            )
    return call


_SUBSCRIBE: dict[str, Any] = {
    "framework_info": {
        "user": str,
        "name": str,
        "id": _IDV,
        "failover_timeout": float,
        "role": str,
        "roles": [str],
        "principal": str,
        "capabilities": [{"type": str}],
    },
    "suppressed_roles": [str],
}


def _validate_subscribe(call: dict[str, Any]) -> None:
    _check_shape(call["subscribe"], _SUBSCRIBE, "subscribe")
    info = call["subscribe"].get("framework_info")
    if not isinstance(info, dict):
        raise CallError(
            400,
            "Failed to parse body into Call protobuf: Missing required fields: "
            "subscribe.framework_info",
        )
    missing = [f for f in ("user", "name") if not isinstance(info.get(f), str)]
    if missing:
        raise CallError(
            400,
            "Failed to parse body into Call protobuf: Missing required fields: "
            + ", ".join(f"subscribe.framework_info.{f}" for f in missing),
        )
    fid = call.get("framework_id")
    info_id = info.get("id")
    if fid is not None and (not isinstance(info_id, dict) or info_id != fid):
        raise CallError(
            400,
            "Failed to validate scheduler::Call: 'framework_id' differs from "
            "'subscribe.framework_info.id'",
        )
    timeout = info.get("failover_timeout", 0)
    if not isinstance(timeout, int | float) or timeout < 0:
        raise CallError(
            400, "Failed to validate scheduler::Call: 'failover_timeout' must be non-negative"
        )


def read_credentials(path: Path) -> dict[str, str]:
    """The secrets by principal of a Mesos ``--credentials`` file: JSON
    ``{"credentials": [{"principal": P, "secret": S}, ...]}``. ValueError naming what is wrong.
    A file others may access is used with a warning, in Mesos's words."""
    try:
        text = path.read_text()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ValueError(f"cannot read credentials file {path}: {reason}") from None
    if mode & 0o007:
        log.warning(
            f"Permissions on credentials file '{path}' are too open; it is recommended that "
            "your credentials file is NOT accessible by others",
            extra={"mode": f"{stat.S_IMODE(mode):04o}"},
        )
    shape = '{"credentials": [{"principal": "...", "secret": "..."}]}'
    try:
        data = orjson.loads(text)
    except ValueError:
        raise ValueError(f"credentials file {path} is not JSON ({shape})") from None
    items = data.get("credentials") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(f"credentials file {path} must be {shape}")
    secrets: dict[str, str] = {}
    for i, item in enumerate(items):
        principal = item.get("principal") if isinstance(item, dict) else None
        secret = item.get("secret") if isinstance(item, dict) else None
        if not isinstance(principal, str) or not principal or not isinstance(secret, str):
            raise ValueError(
                f"credentials file {path}: credentials[{i}] needs a 'principal' and a 'secret' "
                "(strings)"
            )
        secrets[principal] = secret
    return secrets


def authenticate(header: str | None, credentials: Mapping[str, str]) -> str | None:
    """The principal an ``Authorization`` header authenticates (None: refused), as libprocess's
    basic authenticator decides: ``Basic``, base64 of exactly ``principal:secret``."""
    scheme, _, token = (header or "").strip().partition(" ")
    if scheme != "Basic" or not token or " " in token.strip():
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    parts = decoded.split(":")
    if len(parts) != 2 or credentials.get(parts[0]) != parts[1]:
        return None
    return parts[0]


def _check_subscribe_principal(call: dict[str, Any], principal: str) -> None:
    """An authenticated SUBSCRIBE's FrameworkInfo.principal must be the authenticated one; the
    master fills it in where it is left out (as Mesos 1.11 does)."""
    info = call["subscribe"]["framework_info"]
    named = info.setdefault("principal", principal)
    if named != principal:
        raise CallError(
            400,
            f"Failed to validate scheduler::Call: Authenticated principal '{principal}' does "
            f"not match principal '{named}' set in `FrameworkInfo`",
        )


class _Server(ThreadingHTTPServer):
    """Tracks its connections so that stopping it drops them, as a dying process would."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.connections: set[socket.socket] = set()
        self.conn_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conn_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.conn_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def close_all(self) -> None:
        self.shutdown()
        self.server_close()
        with self.conn_lock:
            conns = list(self.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Background:
    """An HTTP server in a daemon thread; ``stop()`` also drops its open connections."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = _Server(address, handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.close_all()
        self._thread.join(timeout=5)


class MasterServer(_Background):
    """The master's HTTP server on ``host:port`` (0: any free port). ``credentials`` (secrets
    by principal): the scheduler endpoint authenticates every request against them."""

    def __init__(
        self,
        master: Master,
        host: str = "127.0.0.1",
        port: int = 0,
        credentials: Mapping[str, str] | None = None,
    ) -> None:
        self.master = master
        attributes = {"master": master, "credentials": credentials}
        super().__init__((host, port), type("MasterHandler", (_MasterHandler,), attributes))


class _Headers(dict[str, str]):
    """A request's headers by lower-case name."""

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "minicluster"
    raw_requestline: bytes  # set by http.server before parse_request

    def parse_request(self) -> bool:
        """The request line and headers of a well-formed HTTP/1.x request, read into a plain
        mapping: http.server's email parser cost most of a small call's time (a scheduler
        acknowledges every status update). Anything unusual goes to http.server's parser."""
        line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = line.split()
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            return super().parse_request()
        self.requestline = line
        self.command, self.path, self.request_version = words
        headers = _Headers()
        while True:
            raw = self.rfile.readline(_MAX_HEADER_LINE + 1)
            if len(raw) > _MAX_HEADER_LINE or len(headers) > _MAX_HEADERS:
                self.send_error(431, "Request header fields too large")
                return False
            if raw in (b"\r\n", b"\n", b""):
                break
            name, sep, value = str(raw, "iso-8859-1").partition(":")
            if not sep or not name or name[0] in " \t":
                self.send_error(400, f"Bad header line {raw[:80]!r}")
                return False
            headers[name.strip().lower()] = value.strip()
        self.headers = headers  # type: ignore[assignment]
        connection = headers.get("Connection", "").lower()
        self.close_connection = connection == "close" or (
            self.request_version == "HTTP/1.0" and connection != "keep-alive"
        )
        if headers.get("Expect", "").lower() == "100-continue":
            return self.handle_expect_100()
        return True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http " + format, *args)

    def _reply(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "text/plain; charset=utf-8",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        if body:
            self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, data: Any) -> None:
        self._reply(200, orjson.dumps(data), "application/json")


class _MasterHandler(_Handler):
    master: Master
    credentials: Mapping[str, str] | None

    def _authenticated(self) -> tuple[bool, str | None]:
        """(whether the request may go on, its principal): without credentials every request
        goes on unauthenticated; with them one without a valid credential is answered 401."""
        if self.credentials is None:
            return True, None
        principal = authenticate(self.headers.get("Authorization"), self.credentials)
        if principal is None:
            self._reply(
                401,
                UNAUTHORIZED_BODY,
                headers={"WWW-Authenticate": f'Basic realm="{SCHEDULER_REALM}"'},
            )
            return False, None
        return True, principal

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path in ("/version", "/master/version"):
            self._json(version_json())
        elif path in ("/master/state", "/state", "/master/state.json"):
            self._json(self.master.state_json())
        elif path in ("/master/redirect", "/redirect"):
            # A single master leads: point at itself, as a leading master's redirect does.
            location = f"//127.0.0.1:{self.master.port}"
            self._reply(307, headers={"Location": location})
        elif path in ("/health", "/master/health"):
            self._reply(200)
        elif path in SCHEDULER_PATHS:
            if self._authenticated()[0]:  # libprocess authenticates before the handler runs
                self._reply(405, b"Expecting 'POST', received 'GET'", headers={"Allow": "POST"})
        else:
            self._reply(404)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit():
            self.close_connection = True
            self._reply(400, b"Expecting a valid 'Content-Length'")
            return
        body = self.rfile.read(int(length))
        if path not in SCHEDULER_PATHS:
            self._reply(404)
            return
        allowed, principal = self._authenticated()
        if not allowed:
            return
        try:
            self._handle(body, principal)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the caller hung up: nobody to answer
        except Exception as exc:
            # A bug must not leave the caller waiting on a closed connection: say so.
            log.exception("minicluster call failed")
            self._reply(500, f"Internal minicluster error: {exc!r}".encode())

    def _handle(self, body: bytes, principal: str | None) -> None:
        """Answer a call; ``principal``: the authenticated one (None: not authenticated)."""
        try:
            call = self._parse(body)
            if call["type"] == "SUBSCRIBE":
                if principal is not None:
                    _check_subscribe_principal(call, principal)
                if self.headers.get("Mesos-Stream-Id"):
                    raise CallError(
                        400, "Subscribe calls should not include the 'Mesos-Stream-Id' header"
                    )
                sub, _ = self.master.subscribe(call)
                self._stream(sub)
                return
            self.master.call(call, self.headers.get("Mesos-Stream-Id"), principal)
        except CallError as exc:
            self._reply(exc.status, exc.message.encode("utf-8"))
            return
        self._reply(202)

    def _parse(self, body: bytes) -> dict[str, Any]:
        ctype = self.headers.get("Content-Type")
        if not ctype:
            raise CallError(400, "Expecting 'Content-Type' to be present")
        media = ctype.split(";")[0].strip().lower()
        if media == "application/x-protobuf":
            raise CallError(
                415, "This minicluster speaks JSON only: use 'Content-Type: application/json'"
            )
        if media != "application/json":
            raise CallError(
                415, "Expecting 'Content-Type' of application/json or application/x-protobuf"
            )
        accept = self.headers.get("Accept")
        if accept and not _accepts_json(accept):
            raise CallError(
                406, "Expecting 'Accept' to allow application/json or application/x-protobuf"
            )
        try:
            call = orjson.loads(body)
        except ValueError as exc:
            raise CallError(400, f"Failed to parse body into JSON: {exc}") from None
        return validate_call(call)

    def _stream(self, sub: Subscriber) -> None:
        """Answer SUBSCRIBE: a chunked RecordIO stream of events until either side ends it."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Mesos-Stream-Id", sub.stream_id)
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        interval = self.master.heartbeat_interval
        next_beat = time.monotonic() + interval
        try:
            while True:
                records, done = _drain(
                    sub, min(_PEER_CHECK, max(0.0, next_beat - time.monotonic()))
                )
                if time.monotonic() >= next_beat:
                    records.append(encode_event({"type": "HEARTBEAT"}))
                    next_beat = time.monotonic() + interval
                if records:
                    data = b"".join(records)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                if done:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    break
                if _peer_closed(self.connection):
                    break
        except OSError:
            pass  # the peer went away
        except Exception:
            log.exception("minicluster event stream failed")
        finally:
            self.master.disconnected(sub)


def _drain(sub: Subscriber, timeout: float) -> tuple[list[bytes], bool]:
    """The records waiting (after up to ``timeout`` for the first); True if the stream ends."""
    out: list[bytes] = []
    try:
        item = sub.queue.get(timeout=timeout)
    except queue.Empty:
        return out, False
    while True:
        if item is None:
            return out, True
        out.append(item)
        if len(out) >= 256:
            return out, False
        try:
            item = sub.queue.get_nowait()
        except queue.Empty:
            return out, False


def _peer_closed(sock: socket.socket) -> bool:
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _accepts_json(accept: str) -> bool:
    for part in accept.split(","):
        media = part.split(";")[0].strip().lower()
        # Protobuf alone is not enough: this minicluster answers in JSON only.
        if media in ("application/json", "application/*", "*/*"):
            return True
    return False


def version_json() -> dict[str, Any]:
    """What ``GET /version`` answers (the shape of Mesos's)."""
    return {
        "build_date": "2021-06-04 18:43:12",
        "build_time": 1622832192.0,
        "build_user": "minicluster",
        "git_sha": "minicluster",
        "git_tag": VERSION,
        "version": VERSION,
    }


class AgentServer(_Background):
    """An agent's HTTP server: ``/files/read`` over its work directory (``/frameworks/...``
    virtual paths, as Mesos attaches executor sandboxes), and ``/health``."""

    def __init__(self, directory: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.directory = directory
        handler = type("AgentHandler", (_AgentHandler,), {"root": directory})
        super().__init__((host, port), handler)


class _AgentHandler(_Handler):
    root: Path

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path in ("/health", "/slave(1)/health"):
            self._reply(200)
            return
        if url.path != "/files/read":
            self._reply(404)
            return
        try:
            self._json(read_sandbox_file(self.root, parse_qs(url.query)))
        except FileReadError as exc:
            self._reply(exc.status, exc.message.encode("utf-8"))


class FileReadError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def read_sandbox_file(root: Path, query: dict[str, list[str]]) -> dict[str, Any]:
    """Mesos's ``/files/read``: ``{"data", "offset"}``; ``offset=-1`` gives the file's size."""
    path = (query.get("path") or [""])[0]
    if not path:
        raise FileReadError(400, "Expecting 'path=value' in query.")
    offset = _int_param(query, "offset", -1)
    length = _int_param(query, "length", _DEFAULT_READ)
    if length < 0:
        raise FileReadError(400, f"Negative length provided: {length}.")
    target = _resolve(root, path)
    if target.is_dir():
        raise FileReadError(400, "Cannot read a directory.")
    try:
        with open(target, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset < 0:
                return {"data": "", "offset": size}
            f.seek(offset)
            data = f.read(length)
    except FileNotFoundError:
        raise FileReadError(404, "No such file or directory.") from None
    except OSError as exc:
        raise FileReadError(500, f"Failed to read file: {exc.strerror}") from None
    return {"data": data.decode("utf-8", errors="replace"), "offset": offset}


def _int_param(query: dict[str, list[str]], name: str, default: int) -> int:
    raw = (query.get(name) or [""])[0]
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise FileReadError(400, f"Failed to parse {name}: '{raw}' is not a number") from None


def _resolve(root: Path, path: str) -> Path:
    base = root.resolve()
    raw = Path(path)
    candidate = (
        raw if raw.is_absolute() and str(raw).startswith(str(base)) else base / path.lstrip("/")
    )
    target = candidate.resolve()
    if target != base and base not in target.parents:
        raise FileReadError(404, "No such file or directory.")
    if not target.exists():
        raise FileReadError(404, "No such file or directory.")
    return target
