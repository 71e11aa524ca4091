"""Local token issuers: an RSA key pair, its certificate served the way Google serves
``oauth2/v1/certs`` ({key id: PEM certificate}), and ID tokens signed with google-auth;
and an ES256 key pair, its public key served the way IAP serves
``iap/verify/public_key`` ({key id: PEM public key}), and IAP assertions.

Tokens can also be assembled from arbitrary segments (``segment``, ``signed``), so
tests can present validly signed tokens whose content is hostile."""

from __future__ import annotations

import base64
import datetime
import functools
import http.server
import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt

from tests.support import POLL_SECONDS


def _key_and_certificate() -> tuple[bytes, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-issuer")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return private, certificate.public_bytes(serialization.Encoding.PEM)


def _ec_key_pair() -> tuple[bytes, bytes]:
    """An ES256 (P-256) private key and its public key, both PEM, as IAP publishes its keys."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def segment(value: Any) -> str:
    """One unpadded base64url token segment: bytes as they are, anything else as JSON."""
    data = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenIssuer:
    algorithm = "RS256"
    signer_class: Any = crypt.RSASigner

    def __init__(self) -> None:
        self.private_pem, certificate = self._key_pair()
        self.rogue_pem, _ = self._key_pair()  # signs tokens no published key verifies
        self.kid = "test-key-1"
        self.certificate_pem = certificate.decode()
        self.certs = {self.kid: self.certificate_pem}
        self.fetches = 0
        self.cache_control = "public, max-age=3600"
        issuer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                issuer.fetches += 1
                data = json.dumps(issuer.certs).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Cache-Control", issuer.cache_control)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.certs_url = f"http://127.0.0.1:{self.server.server_address[1]}/oauth2/v1/certs"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True).start()

    def _key_pair(self) -> tuple[bytes, bytes]:
        return _key_and_certificate()

    def claims(
        self,
        *,
        audience: str,
        email: str,
        issuer: str = "https://accounts.google.com",
        email_verified: bool = True,
        lifetime: int = 3600,
        issued_ago: int = 0,
    ) -> dict[str, Any]:
        """The payload of an ID token as Google issues them for Cloud Scheduler."""
        now = int(time.time()) - issued_ago
        return {
            "iss": issuer,
            "aud": audience,
            "sub": "1234567890",
            "email": email,
            "email_verified": email_verified,
            "iat": now,
            "exp": now + lifetime,
        }

    def header(self, **fields: Any) -> dict[str, Any]:
        """A token header as Google writes it (RS256, this issuer's key id), with ``fields`` replaced."""
        return {"alg": self.algorithm, "kid": self.kid, "typ": "JWT", **fields}

    def token(
        self,
        *,
        audience: str,
        email: str,
        issuer: str = "https://accounts.google.com",
        email_verified: bool = True,
        lifetime: int = 3600,
        issued_ago: int = 0,
        rogue: bool = False,
        extra: Mapping[str, Any] | None = None,
        header: Mapping[str, Any] | None = None,
    ) -> str:
        """A signed ID token; ``extra`` adds or replaces claims and ``header`` header fields, of any JSON type."""
        payload = {
            **self.claims(
                audience=audience,
                email=email,
                issuer=issuer,
                email_verified=email_verified,
                lifetime=lifetime,
                issued_ago=issued_ago,
            ),
            **(extra or {}),
        }
        return self.signed(segment(self.header(**(header or {}))), segment(payload), rogue=rogue)

    def signed(self, header_segment: str, payload_segment: str, *, rogue: bool = False) -> str:
        """The two segments with this issuer's signature over them, whatever they hold."""
        signer = _signer(self.signer_class, self.rogue_pem if rogue else self.private_pem)
        signing_input = f"{header_segment}.{payload_segment}"
        return f"{signing_input}.{segment(signer.sign(signing_input.encode()))}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@functools.cache
def _signer(signer_class: Any, pem: bytes) -> Any:
    """Parsing a PEM key takes 20 ms (RSA's checks): once per key, not once per token."""
    return signer_class.from_string(pem)


class IapIssuer(TokenIssuer):
    """Identity-Aware Proxy: ES256 assertions whose keys are PEM public keys, not certificates."""

    algorithm = "ES256"
    signer_class = crypt.ES256Signer

    def _key_pair(self) -> tuple[bytes, bytes]:
        return _ec_key_pair()

    def assertion(
        self,
        *,
        audience: str,
        email: str,
        issuer: str = "https://cloud.google.com/iap",
        lifetime: int = 600,
        issued_ago: int = 0,
        rogue: bool = False,
        extra: Mapping[str, Any] | None = None,
        header: Mapping[str, Any] | None = None,
        drop: Any = (),
    ) -> str:
        """A signed assertion as IAP adds it to a request it lets through; ``drop`` leaves claims out."""
        now = int(time.time()) - issued_ago
        payload = {
            "iss": issuer,
            "aud": audience,
            "sub": "accounts.google.com:1234567890",
            "email": email,
            "hd": email.rpartition("@")[2],
            "iat": now,
            "exp": now + lifetime,
            **(extra or {}),
        }
        payload = {name: value for name, value in payload.items() if name not in drop}
        return self.signed(segment(self.header(**(header or {}))), segment(payload), rogue=rogue)
