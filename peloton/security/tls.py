"""TLS for the daemon's endpoints: the certificate files, checked at start, as gRPC server
credentials, and the caller a verified client certificate names.

A client certificate names its user by the subject's common name (CN) and its groups by the
subject's organizational units (OU, any number): ``CN=alice,OU=research,OU=vision`` is user
``alice`` in groups ``research`` and ``vision``. gRPC has verified the chain against the
client CA before any RPC runs, so what the certificate says is taken as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from peloton.core.access import Caller
from peloton.errors import InvalidArgument

# Distinct client certificates whose callers are kept parsed (one parse per connection's
# certificate, not per RPC).
_CERTIFICATES_CACHED = 1024


def read_file(option: str, path: str) -> bytes:
    """The bytes of ``path``, given as ``option``; a file that cannot be read is an error
    naming the option."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(option, f"cannot read {path}: {exc.strerror}") from None


def _certificates(option: str, path: str, data: bytes) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise InvalidArgument(option, f"{path} holds no PEM certificate")
    return certs


@dataclass(frozen=True)
class TlsFiles:
    """The daemon's certificate (chain) and key, and the CA that signs client certificates
    (empty: clients show none). :meth:`load` checks them; nothing is read before."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""

    def load(self) -> TlsMaterial:
        """Read and check the files: PEM certificates, an unencrypted PEM key that matches the
        first certificate, a CA bundle of certificates. Errors name the option."""
        cert = read_file("tls_cert_file", self.cert_file)
        key = read_file("tls_key_file", self.key_file)
        leaf = _certificates("tls_cert_file", self.cert_file, cert)[0]
        try:
            private = serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError):
            raise InvalidArgument(
                "tls_key_file", f"{self.key_file} is not an unencrypted PEM private key"
            ) from None
        public = serialization.PublicFormat.SubjectPublicKeyInfo
        der = serialization.Encoding.DER
        if private.public_key().public_bytes(der, public) != leaf.public_key().public_bytes(
            der, public
        ):
            raise InvalidArgument(
                "tls_key_file", f"{self.key_file} is not the key of {self.cert_file}"
            )
        ca = b""
        if self.client_ca_file:
            ca = read_file("tls_client_ca_file", self.client_ca_file)
            _certificates("tls_client_ca_file", self.client_ca_file, ca)
        return TlsMaterial(cert, key, ca)


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM bytes of checked :class:`TlsFiles`."""

    cert: bytes
    key: bytes
    client_ca: bytes  # empty: no client certificates

    def server_credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials. With a client CA every connection must show a certificate
        it signed: gRPC's Python API cannot ask for an optional one."""
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca or None,
            require_client_auth=bool(self.client_ca),
        )


@lru_cache(maxsize=_CERTIFICATES_CACHED)
def certificate_caller(pem: bytes) -> Caller:
    """The caller a verified client certificate (PEM) names: CN the user, OUs the groups.
    Raises ValueError for a certificate without a common name."""
    subject = x509.load_pem_x509_certificate(pem).subject
    names = [str(a.value) for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if not names or not names[0]:
        raise ValueError("the client certificate's subject has no common name (CN)")
    units = subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return Caller(names[0], frozenset(str(a.value) for a in units if a.value), "certificate")
