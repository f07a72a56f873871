"""Certificates for the security tests, made with ``cryptography``: a CA, a server certificate
for 127.0.0.1 and localhost, client certificates with a common name and organizational units,
and JWTs signed by a test RSA key."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Small keys: the tests make several, and their strength is not what is tested.
KEY_BITS = 2048


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class Pem:
    """A certificate and its key, PEM-encoded, and the files they were written to."""

    cert: bytes
    key: bytes
    cert_file: Path
    key_file: Path


class TestCa:
    """A certificate authority that issues server and client certificates into ``directory``."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: Path, name: str = "peloton test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.now(UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)
        self.file = directory / f"{name.replace(' ', '-')}.crt"
        self.file.write_bytes(self.pem)

    def _issue(
        self,
        file_name: str,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: Sequence[x509.GeneralName] = (),
    ) -> Pem:
        key = _key()
        now = datetime.now(UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pem = Pem(
            cert.public_bytes(serialization.Encoding.PEM),
            _pem_key(key),
            self.directory / f"{file_name}.crt",
            self.directory / f"{file_name}.key",
        )
        pem.cert_file.write_bytes(pem.cert)
        pem.key_file.write_bytes(pem.key)
        pem.key_file.chmod(0o600)
        return pem

    def server(self, file_name: str = "server") -> Pem:
        """A server certificate for 127.0.0.1, ::1 and localhost."""
        return self._issue(
            file_name,
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]),
            ExtendedKeyUsageOID.SERVER_AUTH,
            [
                x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1")),
            ],
        )

    def client(self, user: str, groups: Sequence[str] = ()) -> Pem:
        """A client certificate whose subject is CN=``user`` with an OU per group."""
        names = [x509.NameAttribute(NameOID.COMMON_NAME, user)]
        names += [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, g) for g in groups]
        names.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, "peloton tests"))
        return self._issue(f"client-{user}", x509.Name(names), ExtendedKeyUsageOID.CLIENT_AUTH)
