"""Who calls an RPC: the interceptor's ``authenticate`` hook, combining every way a client may
prove who it is.

In order: a verified client certificate (mutual TLS: its CN and OUs), then the bearer token of
the ``authorization: Bearer <token>`` metadata, looked up among the static tokens, then
verified as a JWT. Health (``/grpc.health.v1.Health/``) is open to anyone, and so is
reflection where the daemon opens it. Anything else without credentials the daemon accepts is
refused UNAUTHENTICATED with one sentence saying what was wrong. Runs on the event loop: every
step reads memory only (tokens and keys are loaded by threads of their own).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from peloton.core.access import ANONYMOUS, Caller
from peloton.security.failure import AuthFailure
from peloton.security.metrics import AuthMetrics
from peloton.security.oidc import JwtVerifier
from peloton.security.tls import certificate_caller
from peloton.security.tokens import TokenFile

HEALTH = "/grpc.health.v1.Health/"
REFLECTION = ("/grpc.reflection.v1alpha.ServerReflection/", "/grpc.reflection.v1.ServerReflection/")


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The token of the call's ``authorization: Bearer <token>`` metadata (None: there is
    none); another scheme is refused."""
    for key, value in metadata or ():
        if key != "authorization":
            continue
        text = value.decode() if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthFailure(
                "no_credentials", "the authorization metadata must be 'Bearer <token>'"
            )
        return token.strip()
    return None


class Authenticator:
    """The ``authenticate`` hook of :class:`~peloton.api.interceptor.ServiceInterceptor`:
    ``(full method name, context) -> Caller``, raising :class:`AuthFailure`."""

    def __init__(
        self,
        metrics: AuthMetrics,
        *,
        certificates: bool,
        tokens: TokenFile | None = None,
        jwt: JwtVerifier | None = None,
        reflection_open: bool = False,
    ) -> None:
        self._metrics = metrics
        self._certificates = certificates
        self._tokens = tokens
        self._jwt = jwt
        self._open = (HEALTH, *REFLECTION) if reflection_open else (HEALTH,)
        what = ["a client certificate"] if certificates else []
        if tokens is not None or jwt is not None:
            what.append("a bearer token")
        self._no_credentials = f"no credentials: send {' or '.join(what)}"

    def __call__(self, method: str, context: Any) -> Caller:
        if method.startswith(self._open):
            return ANONYMOUS
        try:
            caller = self._identify(context)
        except AuthFailure as exc:
            self._metrics.failures.labels(exc.reason).inc()
            raise
        self._metrics.authenticated.labels(caller.via).inc()
        return caller

    def _identify(self, context: Any) -> Caller:
        if self._certificates:
            pem = context.auth_context().get("x509_pem_cert")
            if pem:
                try:
                    return certificate_caller(pem[0])
                except ValueError as exc:
                    raise AuthFailure("no_credentials", str(exc)) from None
        token = bearer_token(context.invocation_metadata())
        if token is None:
            raise AuthFailure("no_credentials", self._no_credentials)
        if self._tokens is not None:
            caller = self._tokens.lookup(token)
            if caller is not None:
                return caller
        if self._jwt is not None and token.count(".") == 2:
            return self._jwt.verify(token)
        raise AuthFailure("token_unknown", "token not recognised")
