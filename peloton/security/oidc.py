"""JWTs from an OIDC issuer: verified with PyJWT against the issuer's public keys.

A token is accepted when its signature verifies with one of the keys (picked by the header's
``kid``), with an algorithm that key is for (RSA: RS256-512 and PS256-512, EC: the ES algorithm
of its curve, Ed25519/Ed448: EdDSA; a JWK's ``alg`` narrows it to that one; never ``none`` and
never an HMAC secret), and it has ``exp``, ``iss`` and ``aud``, is not expired, not before its
``nbf``, from the configured issuer and for the configured audience. The user is the
``user_claim`` (``sub``), the groups the ``groups_claim`` (a list, or one string).

The keys come from a local file (a JWKS or a PEM public key or certificate) or from the
issuer's JWKS URL, fetched at start and then every ``refresh_seconds`` by a thread of its own
(and soon after a token names a key the set lacks: keys rotate), never on the RPC's path.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from peloton.core.access import Caller
from peloton.errors import InvalidArgument
from peloton.security.failure import AuthFailure
from peloton.security.tls import read_file

log = logging.getLogger(__name__)

# Clock skew tolerated between the issuer and this daemon, seconds.
LEEWAY_SECONDS = 30
# A JWKS fetch gives up after this long; the next try comes at the next refresh.
FETCH_TIMEOUT_SECONDS = 10.0
# A token naming an unknown key fetches the JWKS again, at most this often.
REFETCH_MIN_SECONDS = 30.0
# While no key set was ever fetched, the fetch is retried this often.
RETRY_SECONDS = 5.0
# A JWKS document larger than this is refused.
MAX_JWKS_BYTES = 1 << 20

_RSA = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
_EC = {"secp256r1": ("ES256",), "secp384r1": ("ES384",), "secp521r1": ("ES512",)}


@dataclass(frozen=True)
class VerifyKey:
    """A public key and the algorithms tokens signed with it may use."""

    key: Any
    algorithms: tuple[str, ...]
    kid: str | None = None


def _algorithms(key: Any) -> tuple[str, ...]:
    if isinstance(key, rsa.RSAPublicKey):
        return _RSA
    if isinstance(key, ec.EllipticCurvePublicKey):
        return _EC.get(key.curve.name, ())
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return ("EdDSA",)
    return ()


def _jwk(entry: Mapping[str, Any], where: str) -> VerifyKey:
    if entry.get("kty") == "oct":
        raise InvalidArgument(where, "a symmetric (oct) key: only public keys verify JWTs here")
    try:
        jwk = jwt.PyJWK(dict(entry))
    except jwt.PyJWTError as exc:
        raise InvalidArgument(where, f"not a usable JWK: {exc}") from None
    algorithms = _algorithms(jwk.key)
    if "alg" in entry:
        algorithms = tuple(a for a in algorithms if a == entry["alg"])
    if not algorithms:
        raise InvalidArgument(where, "a key of no algorithm accepted here")
    kid = entry.get("kid")
    return VerifyKey(jwk.key, algorithms, str(kid) if kid is not None else None)


def parse_keys(data: bytes, source: str, option: str) -> tuple[VerifyKey, ...]:
    """The verify keys of a JWKS document (JSON) or of PEM public keys or certificates;
    errors name ``option`` and the key."""
    text = data.strip()
    if text.startswith(b"{"):
        try:
            document = json.loads(text)
        except ValueError:
            raise InvalidArgument(option, f"{source} is not valid JSON") from None
        entries = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(entries, list) or not entries:
            raise InvalidArgument(option, f"{source} is not a JWKS (no keys)")
        keys = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise InvalidArgument(f"{option}.keys[{i}]", "must be a JWK object")
            if entry.get("use", "sig") != "sig":
                continue  # an encryption key of the same set
            keys.append(_jwk(entry, f"{option}.keys[{i}]"))
        if not keys:
            raise InvalidArgument(option, f"{source} has no signing key (use: sig)")
        return tuple(keys)
    if b"-----BEGIN CERTIFICATE-----" in text:
        try:
            certs = x509.load_pem_x509_certificates(text)
        except ValueError:
            raise InvalidArgument(option, f"{source} holds no PEM certificate") from None
        publics: list[Any] = [c.public_key() for c in certs]
    else:
        try:
            publics = [serialization.load_pem_public_key(text)]
        except ValueError:
            raise InvalidArgument(
                option, f"{source} is neither a JWKS nor a PEM public key or certificate"
            ) from None
    keys = [VerifyKey(k, _algorithms(k)) for k in publics]
    if not all(k.algorithms for k in keys):
        raise InvalidArgument(option, f"{source}: a key of no algorithm accepted here")
    return tuple(keys)


@dataclass(frozen=True)
class JwtSettings:
    """What a :class:`JwtVerifier` accepts, and where its keys come from (one of the two)."""

    issuer: str
    audience: str
    jwks_url: str = ""
    keys_file: str = ""
    user_claim: str = "sub"
    groups_claim: str = "groups"
    refresh_seconds: float = 300.0


# PyJWT's refusals, as the one sentence a client gets.
_REFUSALS: tuple[tuple[type[Exception], str, str], ...] = (
    (jwt.ExpiredSignatureError, "jwt_expired", "token expired"),
    (jwt.ImmatureSignatureError, "jwt_invalid", "token not valid yet (nbf)"),
    (jwt.InvalidAudienceError, "jwt_invalid", "token is for another audience (aud)"),
    (jwt.InvalidIssuerError, "jwt_invalid", "token is from an issuer not trusted here (iss)"),
    (jwt.InvalidSignatureError, "jwt_invalid", "token signature does not verify"),
)


class JwtVerifier:
    """Verifies JWTs (:meth:`verify`, safe from any thread, never blocks); with a JWKS URL,
    :meth:`start` fetches the keys and keeps them fresh until :meth:`stop`."""

    def __init__(self, settings: JwtSettings) -> None:
        self.settings = settings
        self._keys: tuple[VerifyKey, ...] = ()
        self._fetched_at = -REFETCH_MIN_SECONDS
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        if settings.keys_file:
            data = read_file("jwt_keys_file", settings.keys_file)
            self._keys = parse_keys(data, settings.keys_file, "jwt_keys_file")

    @property
    def keys(self) -> Sequence[VerifyKey]:
        return self._keys

    # ---------------------------------------------------------------- JWKS URL

    def start(self) -> None:
        """Fetch the JWKS once (a failure is logged: tokens wait for a later fetch), then keep
        it fresh on a thread. Nothing to do for keys from a file."""
        if not self.settings.jwks_url:
            return
        self.refresh()
        self._thread = threading.Thread(target=self._refresh_loop, name="jwks", daemon=True)
        self._thread.start()

    def refresh(self) -> bool:
        """Fetch the JWKS now; returns whether the key set was replaced."""
        url = self.settings.jwks_url
        self._fetched_at = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_SECONDS) as response:
                data = response.read(MAX_JWKS_BYTES + 1)
            if len(data) > MAX_JWKS_BYTES:
                raise InvalidArgument(
                    "jwt_jwks_url", f"{url} is larger than {MAX_JWKS_BYTES} bytes"
                )
            keys = parse_keys(data, url, "jwt_jwks_url")
        except (OSError, InvalidArgument) as exc:
            log.error(
                "JWKS not fetched; the keys fetched before still verify",
                extra={"url": url, "error": str(exc), "keys": len(self._keys)},
            )
            return False
        if keys != self._keys:
            log.info("JWKS fetched", extra={"url": url, "keys": len(keys)})
        self._keys = keys
        return True

    def _refresh_loop(self) -> None:
        while not self._stop.is_set():
            wait = self.settings.refresh_seconds if self._keys else RETRY_SECONDS
            self._wake.wait(wait)
            self._wake.clear()
            if not self._stop.is_set():
                self.refresh()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _refetch_soon(self) -> None:
        """A token named a key the set lacks: fetch again, unless that was done just now."""
        if self._thread is not None and time.monotonic() - self._fetched_at > REFETCH_MIN_SECONDS:
            self._wake.set()

    # ---------------------------------------------------------------- verifying

    def _candidates(self, kid: Any) -> list[VerifyKey]:
        keys = self._keys
        if kid is None:
            return list(keys)
        named = [k for k in keys if k.kid == kid]
        return named or [k for k in keys if k.kid is None]

    def verify(self, token: str) -> Caller:
        """The caller a valid token names; :class:`AuthFailure` with one sentence otherwise."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthFailure("token_unknown", "token not recognised") from None
        if not self._keys:
            raise AuthFailure("jwt_invalid", "no JWT keys yet: the issuer's keys were not fetched")
        alg = header.get("alg")
        candidates = self._candidates(header.get("kid"))
        if not candidates:
            self._refetch_soon()
            raise AuthFailure("jwt_invalid", "token signed by a key not known here (kid)")
        usable = [k for k in candidates if alg in k.algorithms]
        if not usable:
            raise AuthFailure("jwt_invalid", f"token algorithm {alg!r} is not accepted")
        claims = self._decode(token, str(alg), usable)
        user = claims.get(self.settings.user_claim)
        if not isinstance(user, str) or not user:
            raise AuthFailure(
                "jwt_invalid", f"token has no user claim {self.settings.user_claim!r}"
            )
        groups = claims.get(self.settings.groups_claim) or []
        if isinstance(groups, str):
            groups = [groups]
        if not isinstance(groups, list):
            groups = []
        return Caller(user, frozenset(g for g in groups if isinstance(g, str) and g), "jwt")

    def _decode(self, token: str, alg: str, keys: list[VerifyKey]) -> dict[str, Any]:
        """The claims of ``token`` verified with the first of ``keys`` its signature matches."""
        s = self.settings
        for i, key in enumerate(keys):
            try:
                return jwt.decode(
                    token,
                    key.key,
                    algorithms=[alg],
                    audience=s.audience,
                    issuer=s.issuer,
                    leeway=LEEWAY_SECONDS,
                    options={"require": ["exp", "iss", "aud"]},
                )
            except jwt.InvalidSignatureError:
                if i < len(keys) - 1:
                    continue  # several keys without a kid: try the next
                raise AuthFailure("jwt_invalid", "token signature does not verify") from None
            except jwt.MissingRequiredClaimError as exc:
                raise AuthFailure("jwt_invalid", f"token has no {exc.claim} claim") from None
            except jwt.PyJWTError as exc:
                for kind, reason, message in _REFUSALS:
                    if isinstance(exc, kind):
                        raise AuthFailure(reason, message) from None
                raise AuthFailure("jwt_invalid", f"token not valid: {exc}") from None
        raise AssertionError("unreachable: verify passes at least one key")
