"""The daemon's edge, as its options configure it: TLS, who may call, what is open.

Secure defaults (:func:`check_exposure`): authentication is on as soon as a client CA, a tokens
file or a JWT issuer is set. Without any, a daemon on a loopback address serves anyone who can
reach it there (with a warning); on any other address it refuses to start unless
``allow_anonymous`` is set (then a warning too). Bearer tokens over plaintext are refused off
loopback: they would cross the network in clear text.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import grpc
from prometheus_client import CollectorRegistry

from peloton.errors import InvalidArgument
from peloton.security.identity import Authenticator
from peloton.security.loopback import is_loopback
from peloton.security.metrics import AuthMetrics
from peloton.security.oidc import JwtSettings, JwtVerifier
from peloton.security.tls import TlsFiles, TlsMaterial
from peloton.security.tokens import TokenFile

if TYPE_CHECKING:
    from peloton.config import ServerConfig

log = logging.getLogger(__name__)


def _needs(option: str, needed: str, config: ServerConfig) -> None:
    if getattr(config, option) and not getattr(config, needed):
        raise InvalidArgument(option, f"needs {needed} too")


def check_exposure(config: ServerConfig) -> list[str]:
    """Refuse option combinations that would be unsafe or cannot work (InvalidArgument naming
    the option); returns the warnings to log at start."""
    _needs("tls_cert_file", "tls_key_file", config)
    _needs("tls_key_file", "tls_cert_file", config)
    _needs("tls_client_ca_file", "tls_cert_file", config)
    for option in ("jwt_audience", "jwt_jwks_url", "jwt_keys_file"):
        _needs(option, "jwt_issuer", config)
    if config.jwt_issuer:
        _needs("jwt_issuer", "jwt_audience", config)
        if bool(config.jwt_jwks_url) == bool(config.jwt_keys_file):
            raise InvalidArgument("jwt_issuer", "needs one of jwt_jwks_url and jwt_keys_file")
    host = config.grpc_host
    tokens = bool(config.auth_tokens_file or config.jwt_issuer)
    if tokens and not config.tls_cert_file and not is_loopback(host):
        raise InvalidArgument(
            "tls_cert_file",
            f"bearer tokens would cross the network in clear text to {host}: set tls_cert_file "
            "and tls_key_file, or bind a loopback grpc_host",
        )
    if tokens or config.tls_client_ca_file:
        return []
    if is_loopback(host):
        return [
            f"no authentication: anyone who can connect to {host} may call every RPC (set "
            "tls_client_ca_file, auth_tokens_file or jwt_issuer)"
        ]
    if not config.allow_anonymous:
        raise InvalidArgument(
            "grpc_host",
            f"refusing to serve {host} without authentication: set tls_client_ca_file, "
            "auth_tokens_file or jwt_issuer, or allow_anonymous: true",
        )
    return [f"no authentication (allow_anonymous): anyone who reaches {host} may call every RPC"]


class EdgeSecurity:
    """What :class:`~peloton.server.Server` binds and serves with. :meth:`from_config` checks
    and loads everything (a daemon does not start with a file it cannot use); :meth:`start`
    starts the tokens watcher and the JWKS refresher, :meth:`stop` ends them."""

    def __init__(
        self,
        metrics: AuthMetrics,
        *,
        tls: TlsFiles | None = None,
        tokens: TokenFile | None = None,
        jwt: JwtVerifier | None = None,
        reflection_open: bool = False,
        warnings: tuple[str, ...] = (),
    ) -> None:
        self.tls = tls
        self._material: TlsMaterial | None = tls.load() if tls is not None else None
        self._tokens = tokens
        self._jwt = jwt
        self._warnings = warnings
        certificates = bool(tls is not None and tls.client_ca_file)
        self.authenticator: Authenticator | None = None
        if certificates or tokens is not None or jwt is not None:
            self.authenticator = Authenticator(
                metrics,
                certificates=certificates,
                tokens=tokens,
                jwt=jwt,
                reflection_open=reflection_open,
            )
        # Reflection is a bidirectional stream, which the interceptor passes through as it is:
        # with authentication on it is served only where it is meant to be open.
        self.serve_reflection = self.authenticator is None or reflection_open

    @classmethod
    def from_config(cls, config: ServerConfig, registry: CollectorRegistry) -> EdgeSecurity:
        warnings = check_exposure(config)
        tls = None
        if config.tls_cert_file:
            tls = TlsFiles(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
        jwt = None
        if config.jwt_issuer:
            jwt = JwtVerifier(
                JwtSettings(
                    issuer=config.jwt_issuer,
                    audience=config.jwt_audience,
                    jwks_url=config.jwt_jwks_url,
                    keys_file=config.jwt_keys_file,
                    user_claim=config.jwt_user_claim,
                    groups_claim=config.jwt_groups_claim,
                    refresh_seconds=config.jwt_jwks_refresh_seconds,
                )
            )
        return cls(
            AuthMetrics(registry),
            tls=tls,
            tokens=TokenFile(config.auth_tokens_file) if config.auth_tokens_file else None,
            jwt=jwt,
            reflection_open=config.reflection_open,
            warnings=tuple(warnings),
        )

    @property
    def grpc_credentials(self) -> grpc.ServerCredentials | None:
        """The gRPC API's TLS credentials (None: plaintext)."""
        return self._material.server_credentials() if self._material is not None else None

    def metrics_tls(self) -> dict[str, str]:
        """The TLS arguments of :meth:`peloton.metrics.Metrics.serve`: the API's certificate,
        and its client CA (scrapers then show a certificate too); none without TLS."""
        if self.tls is None:
            return {}
        return {
            "certfile": self.tls.cert_file,
            "keyfile": self.tls.key_file,
            "client_cafile": self.tls.client_ca_file,
        }

    def start(self) -> None:
        log.info(
            "transport and identity",
            extra={
                "tls": self.tls is not None,
                "client_certificates": bool(self.tls and self.tls.client_ca_file),
                "tokens_file": self._tokens is not None,
                "jwt": self._jwt is not None,
                "reflection": self.serve_reflection,
            },
        )
        for warning in self._warnings:
            log.warning(warning)
        if self._tokens is not None:
            self._tokens.start()
            log.info(
                "bearer tokens loaded",
                extra={"path": str(self._tokens.path), "tokens": len(self._tokens)},
            )
        if self._jwt is not None:
            self._jwt.start()

    def stop(self) -> None:
        if self._tokens is not None:
            self._tokens.stop()
        if self._jwt is not None:
            self._jwt.stop()
