"""TLS and authentication over the wire: a daemon serving with certificates made here (a CA, a
server certificate for 127.0.0.1 and localhost, client certificates), bearer tokens from a file
it reloads, JWTs signed by a test key; the Python client, the CLI and a Prometheus scrape
against it."""

from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from daemon import (
    error_line,
    in_process_server,
    migrated_sqlite_url,
    run_peloton,
    wait_for,
)
from google.protobuf import empty_pb2, wrappers_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from tls_support import Pem, TestCa

from peloton.api.caller import current_caller
from peloton.api.grpc_server import GrpcServer
from peloton.api.watches import WatchQuotas
from peloton.client import ClientError, PelotonClient, Tls
from peloton.config import ServerConfig
from peloton.metrics import Metrics
from peloton.security.edge import EdgeSecurity
from peloton.security.tokens import token_digest
from peloton.server import Server

ISSUER = "https://issuer.test"
AUDIENCE = "peloton"


@pytest.fixture
def ca(tmp_path: Path) -> TestCa:
    return TestCa(tmp_path / "pki")


@pytest.fixture
def server_pem(ca: TestCa) -> Pem:
    return ca.server()


def tls_options(server_pem: Pem, ca: TestCa | None = None) -> dict[str, Any]:
    options = {"tls_cert_file": str(server_pem.cert_file), "tls_key_file": str(server_pem.key_file)}
    if ca is not None:
        options["tls_client_ca_file"] = str(ca.file)
    return options


def daemon(tmp_path: Path, **options: Any) -> Any:
    """A started in-process daemon on SQLite with ``options`` (a context manager)."""
    return in_process_server(migrated_sqlite_url(tmp_path), tmp_path / "data", **options)


def target(server: Server) -> str:
    return f"127.0.0.1:{server.grpc_port}"


def refused(client: PelotonClient) -> ClientError:
    with pytest.raises(ClientError) as info:
        client.list_pools()
    return info.value


def write_tokens(path: Path, *entries: tuple[str, str]) -> None:
    """Replace the tokens file atomically with (token, user) entries."""
    lines = ["tokens:"]
    for token, user in entries:
        lines += [
            f"  - user: {user}",
            "    groups: [research]",
            f"    sha256: {token_digest(token)}",
        ]
    tmp = path.with_suffix(".new")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def health(address: str, credentials: grpc.ChannelCredentials | None) -> int:
    channel = (
        grpc.insecure_channel(address)
        if credentials is None
        else grpc.secure_channel(address, credentials)
    )
    with channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    return int(response.status)


# ---------------------------------------------------------------------------- TLS


def test_a_tls_daemon_takes_clients_that_trust_its_ca_and_no_plaintext(
    tmp_path: Path, ca: TestCa, server_pem: Pem
) -> None:
    with daemon(tmp_path, **tls_options(server_pem)) as server:
        with PelotonClient(target(server), timeout=5) as plain:
            assert refused(plain).code == grpc.StatusCode.UNAVAILABLE
        other = TestCa(tmp_path / "other", "another CA")
        with PelotonClient(target(server), timeout=5, tls=Tls(ca=other.pem)) as wrong:
            assert refused(wrong).code == grpc.StatusCode.UNAVAILABLE
        for host in ("127.0.0.1", "localhost"):
            tls = Tls.from_files(ca_file=ca.file)
            with PelotonClient(f"{host}:{server.grpc_port}", timeout=10, tls=tls) as client:
                assert client.list_pools()[0].spec.path == "/"
        # /metrics is served with the same certificate: a scraper needs only the CA.
        text = scrape(server.metrics_port, ssl.create_default_context(cafile=str(ca.file)))
        assert "# TYPE peloton_grpc_requests_total counter" in text


def test_mutual_tls_refuses_a_client_without_a_certificate(
    tmp_path: Path, ca: TestCa, server_pem: Pem
) -> None:
    alice = ca.client("alice", ["research"])
    with daemon(tmp_path, **tls_options(server_pem, ca)) as server:
        with PelotonClient(target(server), timeout=5, tls=Tls(ca=ca.pem)) as anonymous:
            assert refused(anonymous).code == grpc.StatusCode.UNAVAILABLE
        tls = Tls.from_files(ca.file, alice.cert_file, alice.key_file)
        with PelotonClient(target(server), timeout=10, tls=tls) as client:
            client.list_pools()
        calls = server.metrics.registry.get_sample_value(
            "peloton_authenticated_calls_total", {"via": "certificate"}
        )
        assert calls == 1


# ---------------------------------------------------------------------------- who calls


def _who(_request: empty_pb2.Empty, _context: Any) -> wrappers_pb2.StringValue:
    caller = current_caller()
    text = json.dumps({"name": caller.name, "groups": sorted(caller.groups), "via": caller.via})
    return wrappers_pb2.StringValue(value=text)


@pytest.fixture
def who_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Starts a gRPC server with the daemon's edge (``start(edge)`` -> port) and one method,
    /test.Who/Who, that answers the caller the RPC is served as."""
    servers: list[GrpcServer] = []

    def start(edge: EdgeSecurity) -> int:
        server = GrpcServer(
            Metrics(), 2, WatchQuotas(10, 10), lambda _s: {}, lambda: 0, edge.authenticator
        )
        servers.append(server)
        method = grpc.unary_unary_rpc_method_handler(
            _who,
            request_deserializer=empty_pb2.Empty.FromString,
            response_serializer=wrappers_pb2.StringValue.SerializeToString,
        )
        server.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("test.Who", {"Who": method}),)
        )
        port = server.bind("127.0.0.1:0", (), edge.grpc_credentials, edge.serve_reflection)
        server.start()
        return port

    yield start
    for server in servers:
        server.stop(0)


def who(port: int, credentials: grpc.ChannelCredentials, token: str = "") -> dict[str, Any]:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        call = channel.unary_unary(
            "/test.Who/Who",
            request_serializer=empty_pb2.Empty.SerializeToString,
            response_deserializer=wrappers_pb2.StringValue.FromString,
        )
        return dict(json.loads(call(empty_pb2.Empty(), timeout=10, metadata=metadata).value))


def test_a_client_certificate_makes_its_cn_the_caller_and_its_ous_the_groups(
    tmp_path: Path, ca: TestCa, server_pem: Pem, who_server: Any
) -> None:
    tokens = tmp_path / "tokens.yaml"
    write_tokens(tokens, ("tok", "dave"))
    config = ServerConfig(**tls_options(server_pem, ca), auth_tokens_file=str(tokens))
    port = who_server(EdgeSecurity.from_config(config, CollectorRegistry()))
    alice = ca.client("alice", ["research", "vision"])
    credentials = grpc.ssl_channel_credentials(ca.pem, alice.key, alice.cert)
    expected = {"name": "alice", "groups": ["research", "vision"], "via": "certificate"}
    assert who(port, credentials) == expected
    # The certificate comes first: a token beside it does not change who calls.
    assert who(port, credentials, token="tok") == expected


def test_a_token_over_tls_makes_its_user_the_caller(
    tmp_path: Path, ca: TestCa, server_pem: Pem, who_server: Any
) -> None:
    tokens = tmp_path / "tokens.yaml"
    write_tokens(tokens, ("tok", "dave"))
    config = ServerConfig(**tls_options(server_pem), auth_tokens_file=str(tokens))
    port = who_server(EdgeSecurity.from_config(config, CollectorRegistry()))
    credentials = grpc.ssl_channel_credentials(ca.pem)
    assert who(port, credentials, token="tok") == {
        "name": "dave",
        "groups": ["research"],
        "via": "token",
    }
    with pytest.raises(grpc.RpcError) as info:
        who(port, credentials)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert info.value.details() == "no credentials: send a bearer token"


# ---------------------------------------------------------------------------- tokens


def test_bearer_tokens_from_a_file_the_daemon_reloads(
    db_url: str, tmp_path: Path, ca: TestCa, server_pem: Pem
) -> None:
    tokens = tmp_path / "tokens.yaml"
    write_tokens(tokens, ("first-token", "alice"))
    options = tls_options(server_pem) | {"auth_tokens_file": str(tokens)}
    with in_process_server(db_url, tmp_path / "data", **options) as server:
        tls = Tls(ca=ca.pem)
        address = target(server)
        assert health(address, tls.credentials()) == health_pb2.HealthCheckResponse.SERVING

        def client(token: str | None) -> PelotonClient:
            return PelotonClient(address, timeout=10, tls=tls, token=token)

        with client(None) as nobody:
            error = refused(nobody)
            assert (error.code, error.details) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "no credentials: send a bearer token",
            )
        with client("wrong") as wrong:
            error = refused(wrong)
            assert (error.code, error.details) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "token not recognised",
            )
        with client("first-token") as first, client("second-token") as second:
            first.list_pools()
            write_tokens(tokens, ("second-token", "bob"))

            def second_works() -> bool:
                try:
                    second.list_pools()
                except ClientError as exc:
                    assert exc.code == grpc.StatusCode.UNAUTHENTICATED, exc
                    return False
                return True

            wait_for(second_works, 20, "the daemon to reload the tokens file", interval=0.1)
            assert refused(first).details == "token not recognised"

        registry = server.metrics.registry
        failures = registry.get_sample_value(
            "peloton_auth_failures_total", {"reason": "token_unknown"}
        )
        assert failures is not None and failures >= 2
        assert (
            registry.get_sample_value("peloton_auth_failures_total", {"reason": "no_credentials"})
            == 1
        )


def test_a_token_over_plaintext_loopback_works(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    write_tokens(tokens, ("local-token", "alice"))
    with daemon(tmp_path, auth_tokens_file=str(tokens)) as server:
        assert health(target(server), None) == health_pb2.HealthCheckResponse.SERVING
        with PelotonClient(target(server), timeout=10, token="local-token") as client:
            client.list_pools()
        with PelotonClient(target(server), timeout=10) as anonymous:
            assert refused(anonymous).code == grpc.StatusCode.UNAUTHENTICATED


# ---------------------------------------------------------------------------- JWTs


def test_jwts_signed_by_the_issuers_key(tmp_path: Path, ca: TestCa, server_pem: Pem) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    keys = tmp_path / "jwks.json"
    keys.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "RS256"}]}))
    options = {
        **tls_options(server_pem),
        "jwt_issuer": ISSUER,
        "jwt_audience": AUDIENCE,
        "jwt_keys_file": str(keys),
    }

    def token(**claims: Any) -> str:
        body = {"sub": "carol", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 600}
        return jwt.encode({**body, **claims}, key, "RS256", headers={"kid": "k1"})

    with daemon(tmp_path, **options) as server:
        tls = Tls(ca=ca.pem)
        with PelotonClient(target(server), timeout=10, tls=tls, token=token()) as client:
            client.list_pools()
        for bad, details in (
            (token(exp=int(time.time()) - 120), "token expired"),
            (token(aud="other"), "token is for another audience (aud)"),
            (token(iss="https://evil.test"), "token is from an issuer not trusted here (iss)"),
            (
                jwt.encode({"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE}, "", "none"),
                "token algorithm 'none' is not accepted",
            ),
        ):
            with PelotonClient(target(server), timeout=10, tls=tls, token=bad) as client:
                error = refused(client)
                assert (error.code, error.details) == (grpc.StatusCode.UNAUTHENTICATED, details)


# ---------------------------------------------------------------------------- CLI


def test_the_cli_with_a_ca_and_a_token(tmp_path: Path, ca: TestCa, server_pem: Pem) -> None:
    tokens = tmp_path / "tokens.yaml"
    write_tokens(tokens, ("cli-token", "alice"))
    token_file = tmp_path / "token"
    token_file.write_text("cli-token\n")
    bad_file = tmp_path / "bad-token"
    bad_file.write_text("not-it\n")
    options = tls_options(server_pem) | {"auth_tokens_file": str(tokens)}
    # No client config file but the one a step writes (not the user's own).
    alone = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    with daemon(tmp_path, **options) as server:
        address = target(server)
        flags = ["--ca-file", str(ca.file), "--token-file", str(token_file)]
        ok = run_peloton(*flags, "pool", "list", "-o", "json", server=address, env=alone)
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["pools"][0]["spec"]["path"] == "/"

        bad = run_peloton(
            "--ca-file",
            str(ca.file),
            "--token-file",
            str(bad_file),
            "pool",
            "list",
            server=address,
            env=alone,
        )
        assert bad.returncode == 1
        assert error_line(bad) == "error: unauthenticated: token not recognised"

        # The same from the environment, and from a client config file.
        env = {
            "PELOTON_SERVER": address,
            "PELOTON_CA_FILE": str(ca.file),
            "PELOTON_TOKEN": "cli-token",
            **alone,
        }
        assert run_peloton("pool", "list", env=env).returncode == 0
        config = tmp_path / "client.yaml"
        config.write_text(f"server: {address}\nca_file: pki/{ca.file.name}\ntoken_file: token\n")
        from_file = run_peloton("pool", "list", env={"PELOTON_CLIENT_CONFIG": str(config)})
        assert from_file.returncode == 0, from_file.stderr

        plaintext = run_peloton(
            "--token-file", str(token_file), "pool", "list", server="10.255.0.1:1", env=alone
        )
        assert plaintext.returncode == 2
        assert "a bearer token is sent only over TLS or to a loopback address" in error_line(
            plaintext
        )


def test_a_daemon_on_a_public_address_without_authentication_does_not_start(
    tmp_path: Path,
) -> None:
    result = run_peloton("server", "--grpc-host", "0.0.0.0", "--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert error_line(result).startswith(
        "error: invalid: grpc_host: refusing to serve 0.0.0.0 without authentication"
    )


# ---------------------------------------------------------------------------- metrics


def scrape(port: int, context: ssl.SSLContext) -> str:
    url = f"https://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        assert response.status == 200
        return str(response.read().decode())


def test_metrics_are_served_over_the_same_tls(tmp_path: Path, ca: TestCa, server_pem: Pem) -> None:
    prometheus = ca.client("prometheus")
    with daemon(tmp_path, **tls_options(server_pem, ca)) as server:
        port = server.metrics_port
        # Plain HTTP, and TLS without a client certificate, are cut at the handshake.
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
        with pytest.raises(OSError):
            scrape(port, ssl.create_default_context(cafile=str(ca.file)))
        context = ssl.create_default_context(cafile=str(ca.file))
        context.load_cert_chain(str(prometheus.cert_file), str(prometheus.key_file))
        # A client that connects and never says a word holds up no scrape.
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            text = scrape(port, context)
        assert "# TYPE peloton_auth_failures_total counter" in text
        assert "# TYPE peloton_authenticated_calls_total counter" in text
