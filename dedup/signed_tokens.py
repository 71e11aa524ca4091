"""Google-signed JWTs from an untrusted caller: Google ID tokens (RS256) and IAP assertions (ES256).

One path for both: the shape, the claim types and the lifetime are checked
before any key is used (they reveal nothing configured), then google-auth
checks the signature against keys fetched from the issuer's URL and cached
per ``Cache-Control``, as ``google.oauth2.id_token.verify_token`` does (it
fetches the keys on every call).  What the verified claims say (audience,
issuer, email) is left to each verifier.  Whatever a caller sends is an
``InvalidToken`` with a fixed message naming what is wrong, never a 500 and
never an echo of the token or the configuration.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

import google.auth.exceptions
import google.auth.jwt
import requests

from dedup.json_depth import nesting_depth_exceeds

log = logging.getLogger(__name__)
CLOCK_SKEW_SECONDS = 10
CERTS_MAX_AGE_SECONDS = 3600
# A max-age below this (0 included) would mean a blocking fetch under the lock on every request.
CERTS_MIN_AGE_SECONDS = 60
FAILED_FETCH_PAUSE_SECONDS = 5
# Google's ID tokens and IAP's assertions are about 1 KB; a longer token is refused
# before any decoding, so hostile input costs nothing to parse (nor memory to hold decoded).
MAX_TOKEN_CHARS = 8 * 1024
# A token's header and claims are flat; a few levels allow any real claim (groups, nested addresses).
MAX_TOKEN_JSON_DEPTH = 16
# JWS compact serialization: three unpadded base64url segments (RFC 7515 section 7.1).
TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")


class InvalidToken(Exception):
    """Why a caller's token is refused (a 401); ``reason`` is one of the fixed messages."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CertificatesUnavailable(Exception):
    """The signing keys could not be fetched: not the caller's fault (a 500, never a 503)."""


@dataclasses.dataclass(frozen=True)
class TokenKind:
    """What one kind of token is called in refusals, how it is signed, and the claims' JSON types."""

    noun: str  # "ID token", "IAP assertion"
    algorithm: str  # the only one its issuer signs with: anything else is refused unread
    claim_types: Mapping[str, type]

    @property
    def too_large(self) -> str:
        return f"the {self.noun} is too large"

    @property
    def malformed(self) -> str:
        return f"the {self.noun} is malformed"

    @property
    def bad_signature(self) -> str:
        return f"the {self.noun}'s signature does not verify"

    @property
    def expired(self) -> str:
        return f"the {self.noun} has expired or is not valid yet"

    @property
    def wrong_audience(self) -> str:
        return f"the {self.noun} has the wrong audience"


class SignedTokens:
    """Verifies tokens of one kind against the keys published at one URL."""

    def __init__(self, kind: TokenKind, certs_url: str) -> None:
        self.kind = kind
        self._certs = CertificateCache(certs_url)

    def verified_claims(self, token: str) -> dict[str, Any]:
        """The claims of a well-formed, unexpired token whose signature verifies.

        The signature comes before audience, issuer and email (the caller's
        checks), so an unsigned token cannot probe which of those this app accepts.
        """
        if len(token) > MAX_TOKEN_CHARS:
            raise InvalidToken(self.kind.too_large)
        # Python's base64 silently skips characters outside the alphabet; refuse them instead.
        if not TOKEN_SHAPE.fullmatch(token):
            raise InvalidToken(self.kind.malformed)
        claims = self._unverified_claims(token)
        self._check_lifetime(claims)
        self._verify_signature(token)
        return claims

    def _unverified_claims(self, token: str) -> dict[str, Any]:
        """The payload of a token whose three segments decode and hold what google-auth assumes."""
        encoded_header, encoded_payload, encoded_signature = token.split(".")
        header = self._json_object(self._base64url(encoded_header))
        claims = self._json_object(self._base64url(encoded_payload))
        self._base64url(encoded_signature)
        if header.get("alg") != self.kind.algorithm:
            raise InvalidToken(self.kind.bad_signature)  # "none", HS256 keyed with the public key, ...
        if not isinstance(header.get("kid", ""), str):
            raise InvalidToken(self.kind.malformed)
        for name in ("iat", "exp"):
            value = claims.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidToken(self.kind.malformed)
            if isinstance(value, float) and not math.isfinite(value):
                raise InvalidToken(self.kind.malformed)
        for name, expected in self.kind.claim_types.items():
            if name in claims and not isinstance(claims[name], expected):
                raise InvalidToken(self.kind.malformed)
        return claims

    def _base64url(self, segment: str) -> bytes:
        """An unpadded base64url segment (already known to hold only the alphabet), decoded."""
        try:
            return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        except ValueError:  # binascii.Error: a length no encoding produces
            raise InvalidToken(self.kind.malformed) from None

    def _json_object(self, data: bytes) -> dict[str, Any]:
        """A JSON object in UTF-8, nested at most MAX_TOKEN_JSON_DEPTH deep: else a malformed token.

        The depth is this app's limit, the same on every Python (3.13's parser goes
        thousands of levels deeper than 3.11's before a RecursionError).
        """
        try:
            value = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError, too many digits
            raise InvalidToken(self.kind.malformed) from None
        if not isinstance(value, dict) or nesting_depth_exceeds(value, MAX_TOKEN_JSON_DEPTH):
            raise InvalidToken(self.kind.malformed)
        return value

    def _check_lifetime(self, claims: Mapping[str, Any]) -> None:
        """Issued before now and not expired, give or take the skew google-auth allows.

        google-auth checks this too, after the signature; checking it first
        tells an expired token so, and leaves google-auth only the signature to refuse.
        """
        now = time.time()
        if not claims["iat"] - CLOCK_SKEW_SECONDS <= now <= claims["exp"] + CLOCK_SKEW_SECONDS:
            raise InvalidToken(self.kind.expired)

    def _verify_signature(self, token: str) -> None:
        """google-auth checks the signature (and again the lifetime) of a well-formed token.

        The exceptions caught are broader than google-auth documents because its
        input is the caller's: a token nested just below what ``_json_object``
        could parse can still exhaust the stack a few frames deeper, and a
        library change must not make it a 500.
        """
        certs = self._certs.get()
        try:
            google.auth.jwt.decode(  # type: ignore[no-untyped-call]  # google-auth declares no types here
                token, certs=certs, audience=None, clock_skew_in_seconds=CLOCK_SKEW_SECONDS
            )
        except (
            ValueError,
            TypeError,
            LookupError,
            AttributeError,
            RecursionError,
            google.auth.exceptions.GoogleAuthError,
        ):
            raise InvalidToken(self.kind.bad_signature) from None


class CertificateCache:
    """An issuer's signing keys ({key id: PEM}), fetched at most once an hour (or per Cache-Control)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._certs: dict[str, str] | None = None
        self._expires = 0.0
        self._failed_until = 0.0
        self._lock = threading.Lock()

    def get(self) -> dict[str, str]:
        with self._lock:
            if time.monotonic() < self._failed_until:
                raise CertificatesUnavailable(f"fetching {self.url} failed moments ago; not retrying yet")
            if self._certs is None or time.monotonic() >= self._expires:
                try:
                    self._certs, max_age = self._fetch()
                except CertificatesUnavailable:
                    # Answer the next requests at once (500) instead of each waiting on a dead endpoint.
                    self._failed_until = time.monotonic() + FAILED_FETCH_PAUSE_SECONDS
                    raise
                self._expires = time.monotonic() + max_age
            return self._certs

    def _fetch(self) -> tuple[dict[str, str], float]:
        try:
            response = requests.get(self.url, timeout=10)
            response.raise_for_status()
            certs = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise CertificatesUnavailable(f"fetching {self.url} failed: {exc}") from None
        if not isinstance(certs, dict) or not certs or not all(isinstance(v, str) for v in certs.values()):
            raise CertificatesUnavailable(f"{self.url} returned no certificates")
        max_age = CERTS_MAX_AGE_SECONDS
        for directive in response.headers.get("Cache-Control", "").split(","):
            name, _, value = directive.strip().partition("=")
            if name.lower() == "max-age" and value.isascii() and value.isdigit():
                max_age = max(CERTS_MIN_AGE_SECONDS, min(int(value), CERTS_MAX_AGE_SECONDS))
        return certs, max_age
