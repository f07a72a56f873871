"""The console's HTTP(S) server: the static page, the JSON API and the event stream, on the
daemon's own port for it (a thread per connection, standard library only).

Over HTTPS with the daemon's certificate where it has one, asking for an optional client
certificate where it has a client CA (the page's users log in with a token instead; a client
that shows one is known by it). Each TLS handshake runs on its connection's own thread: the
accepting thread would otherwise wait on a client that connects and sends nothing (see
:meth:`peloton.metrics.Metrics.serve`).
"""

from __future__ import annotations

import json
import logging
import mimetypes
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import grpc

from peloton.console.api import CSRF_HEADER, Api, Request, Response, error_body
from peloton.console.auth import Credentials, cookie_token, peer_certificate
from peloton.console.cache import Encoded
from peloton.console.feed import Changes, Feed
from peloton.core.access import Caller
from peloton.errors import PelotonError

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
EVENTS = "/api/v1/events"
# How long a connection may take to finish its TLS handshake, or to send a request.
CONNECTION_SECONDS = 30.0
# Most bytes of a request body (a login's token).
MAX_BODY = 64 * 1024
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'"
)
# How often the hosts are compared with what was last seen (their changes have no event bus).
HOSTS_POLL_SECONDS = 1.0


class Worker(Protocol):
    """Something the console runs in the background while it serves."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() does not wait for event streams' clients
    console: ConsoleServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (a TLS handshake refused, a client gone): logged, without
        the traceback the library prints."""
        error = sys.exc_info()[1]
        log.info(
            "console connection failed",
            extra={"client": client_address[0], "error": str(error)},
        )


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = CONNECTION_SECONDS
    server_version = "peloton-console"
    # Keep-alive: the page's fetches reuse a connection (and its TLS session); every answer
    # but the event stream, which ends with its connection, says its length.
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        """The TLS handshake, here on the connection's own thread (see the module's doc)."""
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(CONNECTION_SECONDS)
            self.request.do_handshake()
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are counted in metrics, and failures logged by the API: no access log."""

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        console = self.server.console
        url = urlsplit(self.path)
        if method == "GET" and not url.path.startswith("/api/"):
            self._static(url.path)
            return
        request = self._request(method, url.path, url.query)
        if request is None:
            return
        if method == "GET" and url.path == EVENTS:
            console.stream(self, request)
            return
        self.answer(console.api.handle(request))

    def _request(self, method: str, path: str, query: str) -> Request | None:
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit() or int(length) > MAX_BODY:
            self.close_connection = True  # what body follows is unknown: not read
            code = grpc.StatusCode.INVALID_ARGUMENT
            why = f"Content-Length: {length!r} is not a length of at most {MAX_BODY} bytes"
            self.answer(Response(400, error_body(code, why), code=code))
            return None
        return Request(
            method=method,
            path=path,
            query=parse_qs(query, keep_blank_values=True),
            body=self.rfile.read(int(length)),
            credentials=Credentials(
                certificate=peer_certificate(self.request),
                authorization=self.headers.get("Authorization"),
                cookie_token=cookie_token(self.headers.get("Cookie")),
            ),
            client=str(self.client_address[0]),
            csrf=self.headers.get(CSRF_HEADER) is not None,
            secure=isinstance(self.request, ssl.SSLSocket),
        )

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What the library answers itself (a method no route takes, a request line or header
        it cannot read) is JSON like every other answer, and ends the connection."""
        self.close_connection = True
        if code == 501:  # the library's answer to a method no do_* serves
            code, why = 400, f"method: {self.command} is not served (GET, POST or DELETE)"
        else:
            why = f"request: {message or explain or 'cannot be read'}"
        status = grpc.StatusCode.INVALID_ARGUMENT if code < 500 else grpc.StatusCode.INTERNAL
        self.answer(Response(code, error_body(status, why), code=status))

    def answer(self, response: Response) -> None:
        """Send a JSON answer, gzip-compressed where the client accepts it."""
        encoded = response.encoded or Encoded(response.body)
        headers = getattr(self, "headers", None)  # None: the request's could not be read
        accepted = headers.get("Accept-Encoding", "") if headers is not None else ""
        packed = encoded.gzipped() if "gzip" in accepted else None
        body = packed if packed is not None else encoded.plain
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Vary", "Accept-Encoding")
        if packed is not None:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Cache-Control", "no-store")
        self._hardened()
        for name, value in response.headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _static(self, path: str) -> None:
        """``/`` is the page; ``/static/<file>`` its files; anything else, or a file that is
        not there, 404."""
        root = self.server.console.static_dir
        name = "index.html" if path == "/" else path.removeprefix("/static/")
        target = (root / name).resolve()
        if (
            (path != "/" and not path.startswith("/static/"))
            or not target.is_relative_to(root.resolve())
            or not target.is_file()
        ):
            code = grpc.StatusCode.NOT_FOUND
            self.answer(Response(404, error_body(code, f"path: no such file {path}"), code=code))
            return
        data = target.read_bytes()
        kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache")
        self._hardened()
        self.end_headers()
        self.wfile.write(data)

    def _hardened(self) -> None:
        """Headers of every answer: no content sniffing; the page runs only its own files (it
        has no inline script or style), and no other site may frame it (a framed page's buttons
        could be clicked through a decoy)."""
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Content-Security-Policy", CSP)

    def write_event(self, text: str) -> None:
        """Send part of the event stream now."""
        self.wfile.write(text.encode())
        self.wfile.flush()


class ConsoleServer:
    """Serves the console on one port until :meth:`stop`; the event streams end then."""

    def __init__(
        self,
        api: Api,
        feed: Feed,
        *,
        hosts_fingerprint: Callable[[], object],
        workers: Sequence[Worker] = (),
        static_dir: Path = STATIC,
        certfile: str = "",
        keyfile: str = "",
        client_cafile: str = "",
    ) -> None:
        self.api = api
        self.feed = feed
        self.static_dir = static_dir
        self._fingerprint = hosts_fingerprint
        self._workers = workers
        self._tls = (certfile, keyfile, client_cafile)
        self._httpd: _Server | None = None
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self.scheme = "https" if certfile else "http"

    def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port) and serve in the background; returns the
        port. OSError if the address cannot be had."""
        kind = _Server6 if ":" in host else _Server  # an IPv6 literal needs its own family
        httpd = kind((host, port), _Handler)
        httpd.console = self
        certfile, keyfile, client_cafile = self._tls
        if certfile:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile, keyfile)
            if client_cafile:
                context.verify_mode = ssl.CERT_OPTIONAL
                context.load_verify_locations(client_cafile)
            httpd.socket = context.wrap_socket(
                httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._httpd = httpd
        for worker in self._workers:
            worker.start()
        for name, target in (("console", httpd.serve_forever), ("console-hosts", self._watch)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return int(httpd.server_address[1])

    def stop(self) -> None:
        """End the event streams, stop listening."""
        self._stopped.set()
        self.feed.close()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        for worker in self._workers:
            worker.stop()

    def _watch(self) -> None:
        """Publish ``cluster`` whenever the hosts changed (a drain, an agent lost or joined)."""
        seen = self._fingerprint()
        while not self._stopped.wait(HOSTS_POLL_SECONDS):
            try:
                now = self._fingerprint()
            except Exception:
                log.exception("reading the hosts for the console failed")
                continue
            if now != seen:
                seen = now
                self.feed.publish(("cluster",))

    def stream(self, handler: _Handler, request: Request) -> None:
        """``GET /api/v1/events``: a ``changed`` event per batch of changes the caller may see,
        until the daemon stops or the client goes."""
        try:
            caller = self.api.caller(request)
        except PelotonError as exc:
            handler.answer(self.api.refuse("events", request, exc))
            return
        self.api.metrics.requests.labels("events", "OK").inc()
        handler.close_connection = True  # the stream's end is its connection's
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-store")
        handler.send_header("Connection", "close")
        handler.end_headers()
        gauge = self.api.metrics.event_streams
        gauge.inc()
        try:
            with self.feed.stream() as batches:
                # Subscribed: what changes from now on is sent (tests wait for the comment). The
                # event tells the page to fetch again what it drew before it subscribed: a
                # change between its first fetch and this point would otherwise wait for the next.
                handler.write_event(": connected\n\nevent: connected\ndata: {}\n\n")
                for batch in batches:
                    handler.write_event(self._event(caller, batch))
        except (OSError, ValueError):
            pass  # the client went away
        finally:
            gauge.dec()

    def _event(self, caller: Caller, batch: Changes | None) -> str:
        if batch is None:
            return ": keepalive\n\n"
        data = {
            "topics": sorted(batch.topics),
            "jobs": self.api.visible_jobs(caller, batch.jobs),
        }
        return f"event: changed\ndata: {json.dumps(data)}\n\n"


class _Server6(_Server):
    address_family = socket.AF_INET6
