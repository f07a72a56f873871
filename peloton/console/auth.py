"""Who calls the console: the daemon's own authentication (:class:`Authenticator`), fed an HTTP
request in the shape it reads from a gRPC call (its certificate, its authorization metadata).

A request proves who it is as a gRPC call does (README "Security"), or with the session cookie
``POST /api/v1/session`` sets, which holds a bearer token: so tokens files, JWTs and client
certificates all work, with the same refusals, metrics and reloads.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from urllib.parse import quote, unquote

from peloton.core.access import ANONYMOUS, Caller
from peloton.security.identity import Authenticator

COOKIE = "peloton_session"
# The "method" the authenticator is asked about: no RPC, so never one it leaves open.
METHOD = "/peloton.console/request"


@dataclass(frozen=True)
class Credentials:
    """What one HTTP request shows: its connection's verified client certificate (PEM), its
    authorization header, and its session cookie's token."""

    certificate: bytes | None = None
    authorization: str | None = None
    cookie_token: str | None = None


class _RequestContext:
    """An HTTP request as :class:`Authenticator` reads a gRPC call's context."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def auth_context(self) -> dict[str, list[bytes]]:
        pem = self._credentials.certificate
        return {"x509_pem_cert": [pem]} if pem else {}

    def invocation_metadata(self) -> list[tuple[str, str]]:
        c = self._credentials
        if c.authorization is not None:
            return [("authorization", c.authorization)]
        if c.cookie_token:
            return [("authorization", f"Bearer {c.cookie_token}")]
        return []


def identify(authenticator: Authenticator | None, credentials: Credentials) -> Caller:
    """The caller of a request (anonymous on a daemon without authentication); raises
    :class:`~peloton.errors.Unauthenticated` (an AuthFailure) as the gRPC API does."""
    if authenticator is None:
        return ANONYMOUS
    return authenticator(METHOD, _RequestContext(credentials))


def peer_certificate(connection: object) -> bytes | None:
    """The PEM of the verified client certificate of a TLS connection, if it showed one."""
    if not isinstance(connection, ssl.SSLSocket):
        return None
    der = connection.getpeercert(binary_form=True)
    return ssl.DER_cert_to_PEM_cert(der).encode() if der else None


def cookie_token(header: str | None) -> str | None:
    """The token of the session cookie in a Cookie header (None: none, or unreadable)."""
    if not header:
        return None
    cookies: SimpleCookie = SimpleCookie()
    try:
        cookies.load(header)
    except CookieError:
        return None
    morsel = cookies.get(COOKIE)
    return unquote(morsel.value) if morsel is not None and morsel.value else None


def session_cookie(token: str, secure: bool) -> str:
    """The Set-Cookie value that keeps ``token`` for the page (no script may read it)."""
    flags = "; Secure" if secure else ""
    return f"{COOKIE}={quote(token, safe='')}; Path=/; HttpOnly; SameSite=Strict{flags}"


def cleared_cookie(secure: bool) -> str:
    """The Set-Cookie value that removes the session cookie."""
    flags = "; Secure" if secure else ""
    return f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{flags}"
