"""A local token issuer: an RSA key pair, its certificate served the way Google serves
``oauth2/v1/certs`` ({key id: PEM certificate}), and ID tokens signed with google-auth."""

from __future__ import annotations

import datetime
import http.server
import json
import threading
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt


def _key_and_certificate() -> tuple[bytes, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-issuer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return private, certificate.public_bytes(serialization.Encoding.PEM)


class TokenIssuer:
    def __init__(self) -> None:
        self.private_pem, certificate = _key_and_certificate()
        self.rogue_pem, _ = _key_and_certificate()  # signs tokens no published certificate verifies
        self.kid = "test-key-1"
        self.certs = {self.kid: certificate.decode()}
        self.fetches = 0
        issuer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                issuer.fetches += 1
                data = json.dumps(issuer.certs).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Cache-Control", "public, max-age=3600")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.certs_url = f"http://127.0.0.1:{self.server.server_address[1]}/oauth2/v1/certs"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, *, audience: str, email: str, issuer: str = "https://accounts.google.com",
              email_verified: bool = True, lifetime: int = 3600, issued_ago: int = 0, rogue: bool = False) -> str:
        now = int(time.time()) - issued_ago
        payload = {"iss": issuer, "aud": audience, "sub": "1234567890", "email": email,
                   "email_verified": email_verified, "iat": now, "exp": now + lifetime}
        signer = crypt.RSASigner.from_string(self.rogue_pem if rogue else self.private_pem, key_id=self.kid)
        return jwt.encode(signer, payload).decode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
