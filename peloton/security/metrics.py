"""Authentication's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class AuthMetrics:
    """Calls refused UNAUTHENTICATED by reason, and authenticated calls by how the caller
    proved who it is."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter(
            "peloton_auth_failures",
            "RPCs refused UNAUTHENTICATED, by reason (no_credentials, token_unknown, "
            "jwt_expired, jwt_invalid).",
            ["reason"],
            registry=registry,
        )
        self.authenticated = Counter(
            "peloton_authenticated_calls",
            "RPCs whose caller was authenticated, by how: certificate, token or jwt.",
            ["via"],
            registry=registry,
        )
