"""Who calls: the tokens file, JWT verification, client certificates' callers, the
authenticate hook that combines them, and the secure defaults of the daemon's options. Pure
logic and files: no daemon (tests/test_security_tls.py runs them over the wire)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from daemon import wait_for
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from tls_support import TestCa

from peloton.client import PelotonClient, Tls
from peloton.config import ServerConfig
from peloton.core.access import ANONYMOUS, Caller
from peloton.errors import InvalidArgument
from peloton.security.edge import EdgeSecurity, check_exposure
from peloton.security.failure import AuthFailure
from peloton.security.identity import Authenticator, bearer_token
from peloton.security.loopback import is_loopback
from peloton.security.metrics import AuthMetrics
from peloton.security.oidc import JwtSettings, JwtVerifier, parse_keys
from peloton.security.tls import TlsFiles, certificate_caller
from peloton.security.tokens import TokenFile, parse_tokens, token_digest

ISSUER = "https://issuer.test"
AUDIENCE = "peloton"


def tokens_yaml(*entries: tuple[str, str, list[str]]) -> str:
    """A tokens file listing (token, user, groups) entries by their digests."""
    lines = ["tokens:"]
    for token, user, groups in entries:
        lines += [
            f"  - user: {user}",
            f"    groups: {groups}",
            f"    sha256: {token_digest(token)}",
        ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- tokens file


def test_tokens_file_maps_each_digest_to_its_caller() -> None:
    callers = parse_tokens(tokens_yaml(("s3cret", "alice", ["research", "vision"])), "t.yaml")
    assert callers == {
        token_digest("s3cret"): Caller("alice", frozenset({"research", "vision"}), "token")
    }


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("tokens: [{user: a, sha256: abc}]", "auth_tokens_file.tokens[0].sha256"),
        ("tokens: [{sha256: " + "a" * 64 + "}]", "auth_tokens_file.tokens[0].user"),
        (
            "tokens: [{user: a, token: x, sha256: " + "a" * 64 + "}]",
            "auth_tokens_file.tokens[0].token",
        ),
        (
            "tokens: [{user: a, groups: g, sha256: " + "a" * 64 + "}]",
            "auth_tokens_file.tokens[0].groups",
        ),
        (
            "tokens:\n- {user: a, sha256: " + "a" * 64 + "}\n- {user: b, sha256: " + "A" * 64 + "}",
            "auth_tokens_file.tokens[1].sha256",
        ),
        ("users: []", "auth_tokens_file"),
        ("tokens: [", "auth_tokens_file"),
    ],
)
def test_a_bad_tokens_file_names_the_entry_and_field(text: str, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_tokens(text, "t.yaml")
    assert info.value.field == field


@given(st.text(min_size=1, max_size=64), st.text(min_size=1, max_size=64))
def test_only_the_listed_token_is_recognised(listed: str, other: str) -> None:
    callers = parse_tokens(
        tokens_yaml(("x", "u", [])).replace(token_digest("x"), token_digest(listed)), "t"
    )
    assert callers[token_digest(listed)].name == "u"
    assert (token_digest(other) in callers) == (other == listed)


def test_an_edited_tokens_file_is_reloaded_and_a_broken_one_keeps_the_old_tokens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(tokens_yaml(("one", "alice", [])))
    tokens = TokenFile(str(path))
    assert tokens.lookup("one") == Caller("alice", frozenset(), "token")
    assert tokens.lookup("two") is None

    path.write_text(tokens_yaml(("two", "bob", ["ops"])))
    tokens.reload_if_changed()
    assert tokens.lookup("one") is None
    assert tokens.lookup("two") == Caller("bob", frozenset({"ops"}), "token")

    caplog.set_level(logging.ERROR, logger="peloton.security.tokens")
    path.write_text("tokens: [")
    tokens.reload_if_changed()
    assert tokens.lookup("two") is not None, "a file that does not parse keeps the old tokens"
    assert [r.message for r in caplog.records] == [
        "tokens file not reloaded; the tokens loaded before still work"
    ]
    assert "two" not in caplog.text and token_digest("two") not in caplog.text

    path.unlink()
    tokens.reload_if_changed()
    assert tokens.lookup("two") is not None, "a file removed keeps the old tokens"


def test_the_watcher_thread_reloads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(tokens_yaml(("one", "alice", [])))
    tokens = TokenFile(str(path), interval=0.01)
    tokens.start()
    try:
        replacement = tmp_path / "tokens.new"
        replacement.write_text(tokens_yaml(("two", "bob", [])))
        replacement.replace(path)  # as an editor or config management does: atomically
        wait_for(lambda: tokens.lookup("two"), 10, "the new token", state=lambda: len(tokens))
        assert tokens.lookup("one") is None
    finally:
        tokens.stop()


def test_a_missing_tokens_file_stops_the_daemon_from_starting(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"auth_tokens_file: cannot read .*absent"):
        TokenFile(str(tmp_path / "absent.yaml"))


# ---------------------------------------------------------------------------- JWTs


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _jwks(key: rsa.RSAPrivateKey, kid: str = "k1") -> dict[str, Any]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return {"keys": [{**jwk, "kid": kid, "use": "sig", "alg": "RS256"}]}


def sign(key: rsa.RSAPrivateKey, kid: str = "k1", **claims: Any) -> str:
    now = int(time.time())
    body = {"sub": "carol", "groups": ["ml"], "iss": ISSUER, "aud": AUDIENCE, "exp": now + 600}
    body.update(claims)
    return jwt.encode(
        {k: v for k, v in body.items() if v is not None}, key, "RS256", headers={"kid": kid}
    )


@pytest.fixture
def verifier(rsa_key: rsa.RSAPrivateKey, tmp_path: Path) -> JwtVerifier:
    keys = tmp_path / "jwks.json"
    keys.write_text(json.dumps(_jwks(rsa_key)))
    return JwtVerifier(JwtSettings(ISSUER, AUDIENCE, keys_file=str(keys)))


def test_a_valid_jwt_names_its_user_and_groups(
    verifier: JwtVerifier, rsa_key: rsa.RSAPrivateKey
) -> None:
    assert verifier.verify(sign(rsa_key)) == Caller("carol", frozenset({"ml"}), "jwt")
    assert verifier.verify(sign(rsa_key, groups="ml")).groups == {"ml"}


def _unsigned() -> str:
    return jwt.encode(
        {"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 600},
        "",
        "none",
        headers={"kid": "k1"},
    )


def _hmac_with_the_public_key(key: rsa.RSAPrivateKey) -> str:
    """The algorithm-confusion attack: HS256 keyed with the (public) RSA key's bytes."""
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "typ": "JWT", "kid": "k1"}
    claims = {"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 600}
    signing = jwt.api_jws.PyJWS()
    signing._algorithms["HS256"].prepare_key = lambda k: k  # type: ignore[method-assign,assignment]
    return signing.encode(json.dumps(claims).encode(), public, "HS256", headers=header)


@pytest.mark.parametrize(
    ("make", "reason", "message"),
    [
        (lambda k: sign(k, exp=int(time.time()) - 120), "jwt_expired", "token expired"),
        (lambda k: sign(k, aud="other"), "jwt_invalid", "token is for another audience (aud)"),
        (
            lambda k: sign(k, iss="https://evil.test"),
            "jwt_invalid",
            "token is from an issuer not trusted here (iss)",
        ),
        (lambda k: sign(k, nbf=int(time.time()) + 600), "jwt_invalid", "token not valid yet (nbf)"),
        (lambda k: sign(k, exp=None), "jwt_invalid", "token has no exp claim"),
        (lambda k: sign(k, sub=None), "jwt_invalid", "token has no user claim 'sub'"),
        (lambda k: sign(k, kid="k2"), "jwt_invalid", "token signed by a key not known here (kid)"),
        (
            lambda _k: sign(rsa.generate_private_key(public_exponent=65537, key_size=2048)),
            "jwt_invalid",
            "token signature does not verify",
        ),
        (lambda _k: _unsigned(), "jwt_invalid", "token algorithm 'none' is not accepted"),
        (_hmac_with_the_public_key, "jwt_invalid", "token algorithm 'HS256' is not accepted"),
        (lambda _k: "not.a.jwt", "token_unknown", "token not recognised"),
    ],
)
def test_a_jwt_that_does_not_verify_is_refused_with_one_sentence(
    verifier: JwtVerifier, rsa_key: rsa.RSAPrivateKey, make: Any, reason: str, message: str
) -> None:
    with pytest.raises(AuthFailure) as info:
        verifier.verify(make(rsa_key))
    assert (info.value.reason, str(info.value)) == (reason, message)


def test_a_pem_public_key_verifies_rsa_tokens(rsa_key: rsa.RSAPrivateKey, tmp_path: Path) -> None:
    pem = tmp_path / "key.pem"
    pem.write_bytes(
        rsa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    settings = JwtSettings(
        ISSUER, AUDIENCE, keys_file=str(pem), user_claim="email", groups_claim="roles"
    )
    verifier = JwtVerifier(settings)
    token = sign(rsa_key, email="carol@example.com", roles=["a", "b"])
    assert verifier.verify(token) == Caller("carol@example.com", frozenset({"a", "b"}), "jwt")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b'{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}', "symmetric"),
        (b'{"keys": []}', "not a JWKS"),
        (b"{", "not valid JSON"),
        (b"hello", "neither a JWKS nor a PEM"),
    ],
)
def test_unusable_keys_are_refused_at_start(text: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_keys(text, "keys", "jwt_keys_file")


class _Jwks(BaseHTTPRequestHandler):
    document: bytes = b""
    fetches = 0

    def do_GET(self) -> None:
        type(self).fetches += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.document)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def jwks_server(rsa_key: rsa.RSAPrivateKey) -> Iterator[tuple[str, type[_Jwks]]]:
    handler = type(
        "Jwks", (_Jwks,), {"document": json.dumps(_jwks(rsa_key)).encode(), "fetches": 0}
    )
    httpd = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}/jwks.json", handler
    httpd.shutdown()
    httpd.server_close()


def test_keys_from_a_jwks_url_are_fetched_in_the_background_and_refreshed(
    jwks_server: tuple[str, type[_Jwks]], rsa_key: rsa.RSAPrivateKey
) -> None:
    url, handler = jwks_server
    verifier = JwtVerifier(JwtSettings(ISSUER, AUDIENCE, jwks_url=url, refresh_seconds=0.05))
    with pytest.raises(AuthFailure, match="no JWT keys yet"):
        verifier.verify(sign(rsa_key))
    verifier.start()
    try:
        assert verifier.verify(sign(rsa_key)).name == "carol"
        rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        handler.document = json.dumps(_jwks(rotated, kid="k2")).encode()
        wait_for(
            lambda: [k.kid for k in verifier.keys] == ["k2"],
            10,
            "the rotated key set",
            state=lambda: [k.kid for k in verifier.keys],
        )
        assert verifier.verify(sign(rotated, kid="k2")).name == "carol"
    finally:
        verifier.stop()


# ---------------------------------------------------------------------------- certificates


def test_a_client_certificate_names_the_user_by_cn_and_groups_by_ou(tmp_path: Path) -> None:
    ca = TestCa(tmp_path)
    assert certificate_caller(ca.client("alice", ["research", "vision"]).cert) == Caller(
        "alice", frozenset({"research", "vision"}), "certificate"
    )
    assert certificate_caller(ca.client("bob").cert).groups == frozenset()


def test_tls_files_are_checked_at_start(tmp_path: Path) -> None:
    ca = TestCa(tmp_path)
    server, other = ca.server(), ca.server("other")
    assert TlsFiles(str(server.cert_file), str(server.key_file)).load().key == server.key
    with pytest.raises(InvalidArgument, match=r"tls_key_file: .* is not the key of"):
        TlsFiles(str(server.cert_file), str(other.key_file)).load()
    with pytest.raises(InvalidArgument, match=r"tls_cert_file: .* holds no PEM certificate"):
        TlsFiles(str(server.key_file), str(server.key_file)).load()
    with pytest.raises(InvalidArgument, match="tls_client_ca_file: cannot read"):
        TlsFiles(str(server.cert_file), str(server.key_file), str(tmp_path / "nope")).load()


# ---------------------------------------------------------------------------- the hook


class FakeContext:
    """What the hook reads of a gRPC server context."""

    def __init__(
        self, metadata: tuple[tuple[str, str], ...] = (), cert: bytes | None = None
    ) -> None:
        self._metadata = metadata
        self._cert = cert

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": [self._cert]} if self._cert else {}


def _count(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_the_hook_takes_a_certificate_then_a_static_token_then_a_jwt(
    tmp_path: Path, verifier: JwtVerifier, rsa_key: rsa.RSAPrivateKey
) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(tokens_yaml(("static", "dave", ["ops"])))
    registry = CollectorRegistry()
    hook = Authenticator(
        AuthMetrics(registry), certificates=True, tokens=TokenFile(str(path)), jwt=verifier
    )
    method = "/peloton.v1.JobService/ListJobs"
    cert = TestCa(tmp_path).client("alice").cert
    bearer = (("authorization", "Bearer static"),)
    assert hook(method, FakeContext(bearer, cert)).name == "alice"
    assert hook(method, FakeContext(bearer)).name == "dave"
    assert (
        hook(method, FakeContext((("authorization", f"bearer {sign(rsa_key)}"),))).name == "carol"
    )
    assert _count(registry, "peloton_authenticated_calls_total", via="certificate") == 1
    assert _count(registry, "peloton_authenticated_calls_total", via="token") == 1
    assert _count(registry, "peloton_authenticated_calls_total", via="jwt") == 1

    with pytest.raises(
        AuthFailure, match=r"^no credentials: send a client certificate or a bearer token$"
    ):
        hook(method, FakeContext())
    with pytest.raises(AuthFailure, match=r"^token not recognised$"):
        hook(method, FakeContext((("authorization", "Bearer nope"),)))
    with pytest.raises(AuthFailure, match=r"^the authorization metadata must be 'Bearer <token>'$"):
        hook(method, FakeContext((("authorization", "Basic YTpi"),)))
    assert _count(registry, "peloton_auth_failures_total", reason="no_credentials") == 2
    assert _count(registry, "peloton_auth_failures_total", reason="token_unknown") == 1


def test_health_is_open_and_reflection_only_where_opened() -> None:
    reflection = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    closed = Authenticator(AuthMetrics(CollectorRegistry()), certificates=True)
    assert closed("/grpc.health.v1.Health/Check", FakeContext()) is ANONYMOUS
    with pytest.raises(AuthFailure, match=r"^no credentials: send a client certificate$"):
        closed(reflection, FakeContext())
    opened = Authenticator(
        AuthMetrics(CollectorRegistry()), certificates=True, reflection_open=True
    )
    assert opened(reflection, FakeContext()) is ANONYMOUS


def test_bearer_token_reads_the_authorization_metadata() -> None:
    assert bearer_token((("x-other", "1"), ("authorization", "Bearer  abc "))) == "abc"
    assert bearer_token((("x-other", "1"),)) is None
    assert bearer_token(None) is None


def test_reflection_is_served_without_authentication_or_where_opened(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(tokens_yaml(("t", "u", [])))

    def edge(**options: Any) -> EdgeSecurity:
        return EdgeSecurity.from_config(ServerConfig(**options), CollectorRegistry())

    assert edge().serve_reflection and edge().authenticator is None
    assert not edge(auth_tokens_file=str(path)).serve_reflection
    assert edge(auth_tokens_file=str(path), reflection_open=True).serve_reflection


# ---------------------------------------------------------------------------- secure defaults


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"])
def test_a_loopback_daemon_without_authentication_starts_with_a_warning(host: str) -> None:
    assert is_loopback(host)
    (warning,) = check_exposure(ServerConfig(grpc_host=host))
    assert warning.startswith(f"no authentication: anyone who can connect to {host}")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "peloton.example.com"])
def test_a_non_loopback_daemon_without_authentication_refuses_to_start(host: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_exposure(ServerConfig(grpc_host=host))
    assert info.value.field == "grpc_host"
    assert "refusing to serve" in str(info.value) and "allow_anonymous: true" in str(info.value)
    (warning,) = check_exposure(ServerConfig(grpc_host=host, allow_anonymous=True))
    assert "allow_anonymous" in warning


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"grpc_host": "0.0.0.0", "auth_tokens_file": "t.yaml"}, "tls_cert_file"),
        ({"tls_cert_file": "c.pem"}, "tls_cert_file"),
        ({"tls_key_file": "k.pem"}, "tls_key_file"),
        ({"tls_client_ca_file": "ca.pem"}, "tls_client_ca_file"),
        ({"jwt_issuer": ISSUER, "jwt_keys_file": "k.json"}, "jwt_issuer"),
        ({"jwt_issuer": ISSUER, "jwt_audience": AUDIENCE}, "jwt_issuer"),
        ({"jwt_audience": AUDIENCE}, "jwt_audience"),
    ],
)
def test_unsafe_or_incomplete_options_are_refused_naming_the_option(
    options: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        check_exposure(ServerConfig(**options))
    assert info.value.field == field


def test_authentication_on_needs_no_warning() -> None:
    assert (
        check_exposure(
            ServerConfig(
                grpc_host="0.0.0.0", tls_cert_file="c", tls_key_file="k", tls_client_ca_file="ca"
            )
        )
        == []
    )


# ---------------------------------------------------------------------------- the client


@pytest.mark.parametrize(
    "server", ["10.0.0.5:5392", "peloton.example.com", "dns:///peloton.example.com:5392"]
)
def test_the_client_refuses_to_send_a_token_in_clear_text_across_the_network(server: str) -> None:
    with pytest.raises(
        InvalidArgument, match="a bearer token is sent only over TLS or to a loopback"
    ):
        PelotonClient(server, token="secret")
    PelotonClient(server, token="secret", tls=Tls()).close()  # over TLS it goes


@pytest.mark.parametrize(
    "server", ["127.0.0.1:5392", "localhost", "[::1]:5392", "unix:/tmp/p.sock"]
)
def test_the_client_sends_a_token_to_loopback_without_tls(server: str) -> None:
    PelotonClient(server, token="secret").close()
