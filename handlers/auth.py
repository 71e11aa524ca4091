"""Caller verification, defence in depth beside app.yaml's ``login: admin``.

``X-CloudScheduler-*`` headers prove nothing (anyone can send them), so a
request is accepted only on evidence its sender cannot forge:

- ``appengine``: markers that App Engine itself sets and strips from client
  requests (cron, task queues, signed-in admins, the internal source IPs of
  Scheduler, Cloud Tasks and cron);
- ``oidc``: a Google-signed ID token, as Cloud Scheduler HTTP targets send,
  verified with google-auth (signature, expiry, issuer, audience, a verified
  and allowed email).  Whatever an unauthenticated caller sends as a token
  (oversized, badly encoded, nested deep enough to exhaust the parser, claims
  of the wrong type) is a 401 with a fixed message, never a 500: the message
  names what is wrong, never the token or the configured audience or callers;
- ``none``: local development only; refused on App Engine.
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
from typing import Any, Callable, Mapping, Protocol

import google.auth.exceptions
import google.auth.jwt
import requests

DEFAULT_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
GOOGLE_ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})
# App Engine markers this app can trust in `appengine` mode (DEDUP_APPENGINE_TRUSTED chooses).
# "admin" is off by default: App Engine does not list X-Appengine-User-Is-Admin among the
# headers it strips from client requests, and it counts project Viewers as admins.
APPENGINE_MARKERS = {
    "cron": "X-Appengine-Cron: true (cron.yaml jobs)",
    "queue": "X-AppEngine-QueueName present (Cloud Tasks / task queues)",
    "admin": "X-Appengine-User-Is-Admin: 1 (a signed-in project admin)",
    "ip:0.1.0.2": "X-Appengine-User-Ip 0.1.0.2 (Cloud Scheduler App Engine jobs, Cloud Tasks, cron)",
    "ip:0.1.0.1": "X-Appengine-User-Ip 0.1.0.1 (cron jobs created with older tools)",
}
log = logging.getLogger(__name__)
CLOCK_SKEW_SECONDS = 10
CERTS_MAX_AGE_SECONDS = 3600
FAILED_FETCH_PAUSE_SECONDS = 5
# Google ID tokens are about 1 KB; a longer token is refused before any decoding,
# so hostile input costs nothing to parse (nor memory to hold decoded).
MAX_TOKEN_CHARS = 8 * 1024
# JWS compact serialization: three unpadded base64url segments (RFC 7515 section 7.1).
TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
SIGNING_ALGORITHM = "RS256"  # the only one Google signs ID tokens with
# Claims this app reads, with the JSON type each must have when present.
CLAIM_TYPES: Mapping[str, type] = {"iss": str, "aud": str, "email": str, "email_verified": bool}

# 401 messages: fixed per kind of failure, so a refusal echoes neither the token nor
# the configuration (audience, allowed emails, certificates URL).
MISSING_TOKEN = "an Authorization: Bearer <Google-signed ID token> header is required"
TOKEN_TOO_LARGE = "the ID token is too large"
MALFORMED_TOKEN = "the ID token is malformed"
BAD_SIGNATURE = "the ID token's signature does not verify"
EXPIRED_TOKEN = "the ID token has expired or is not valid yet"
WRONG_AUDIENCE = "the ID token has the wrong audience"
WRONG_ISSUER = "the ID token's issuer is not Google"
UNVERIFIED_EMAIL = "the ID token's email is not verified"
UNLISTED_EMAIL = "the ID token's email is not an allowed caller"


class AuthConfigError(ValueError):
    """A bad DEDUP_AUTH configuration: the app refuses to start."""


@dataclasses.dataclass(frozen=True)
class Rejection:
    status: int  # 401 or 403
    error: str
    message: str


@dataclasses.dataclass(frozen=True)
class AuthSettings:
    mode: str
    trusted_markers: frozenset[str] = frozenset(APPENGINE_MARKERS) - {"admin"}
    audience: str = ""
    allowed_emails: frozenset[str] = frozenset()
    certs_url: str = DEFAULT_CERTS_URL

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "AuthSettings":
        on_app_engine = bool(environ.get("GAE_ENV"))
        mode = environ.get("DEDUP_AUTH", "").strip().lower()
        if not mode:
            if not on_app_engine:
                raise AuthConfigError(
                    "DEDUP_AUTH is not set: outside App Engine choose the caller verification "
                    "explicitly (appengine, oidc, or none for local development)"
                )
            mode = "appengine"
        if mode not in VERIFIERS:
            raise AuthConfigError(f"DEDUP_AUTH={mode!r}: must be one of {', '.join(VERIFIERS)}")
        if mode == "none" and on_app_engine:
            raise AuthConfigError("DEDUP_AUTH=none is for local development; it is refused on App Engine")
        settings = cls(mode=mode)
        if mode == "appengine":
            raw = environ.get("DEDUP_APPENGINE_TRUSTED")
            if raw is not None:
                markers = frozenset(m.strip().lower() for m in raw.split(",") if m.strip())
                unknown = sorted(markers - set(APPENGINE_MARKERS))
                if unknown or not markers:
                    raise AuthConfigError(
                        f"DEDUP_APPENGINE_TRUSTED: unknown or no markers {unknown}; "
                        f"choose from {', '.join(APPENGINE_MARKERS)}"
                    )
                settings = dataclasses.replace(settings, trusted_markers=markers)
        if mode == "oidc":
            audience = environ.get("DEDUP_OIDC_AUDIENCE", "").strip()
            emails = frozenset(
                e.strip().lower() for e in environ.get("DEDUP_OIDC_ALLOWED_EMAILS", "").split(",") if e.strip()
            )
            if not audience:
                raise AuthConfigError("DEDUP_AUTH=oidc needs DEDUP_OIDC_AUDIENCE (the URL Scheduler puts in the token)")
            if not emails:
                raise AuthConfigError("DEDUP_AUTH=oidc needs DEDUP_OIDC_ALLOWED_EMAILS (the callers' service accounts)")
            settings = dataclasses.replace(
                settings,
                audience=audience,
                allowed_emails=emails,
                certs_url=environ.get("DEDUP_OIDC_CERTS_URL", "").strip() or DEFAULT_CERTS_URL,
            )
        return settings


class Verifier(Protocol):
    """One DEDUP_AUTH mode: decides, from a request's headers, whether its caller may be served."""

    def check(self, headers: Mapping[str, str], read_only: bool = False) -> Rejection | None:
        """None when the caller is accepted, else why not.

        ``read_only``: the view is marked read-only (the dashboard, the run
        API's GETs); nothing such a request does changes a run.
        """


def read_only(view: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a view that changes nothing (the dashboard, the run API's GETs).

    The verifier reads the mark through ``request.endpoint``, so a view is
    read-only because it says so, never because of where its URL happens to be.
    """
    view.read_only = True  # type: ignore[attr-defined]
    return view


def is_read_only(view: Callable[..., Any] | None) -> bool:
    return bool(getattr(view, "read_only", False))


def verifier_for(settings: AuthSettings) -> Verifier:
    """The verifier of ``settings.mode``, chosen once at start-up: a new mode is one new class."""
    return VERIFIERS[settings.mode](settings)


class AnyCaller:
    """``none``: every request is served (local development; refused on App Engine)."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings

    def check(self, headers: Mapping[str, str], read_only: bool = False) -> Rejection | None:
        return None


class AppEngineMarkers:
    """``appengine``: the markers App Engine sets and strips from client requests.

    On read-only views a signed-in admin is accepted too, so operators can
    open the dashboard in a browser (behind ``login: admin``).
    """

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings

    def check(self, headers: Mapping[str, str], read_only: bool = False) -> Rejection | None:
        if read_only and headers.get("X-Appengine-User-Is-Admin") == "1":
            return None
        trusted = self.settings.trusted_markers
        seen = {
            "cron": headers.get("X-Appengine-Cron", "").lower() == "true",
            "queue": bool(headers.get("X-AppEngine-QueueName")),
            "admin": headers.get("X-Appengine-User-Is-Admin") == "1",
            "ip:0.1.0.2": headers.get("X-Appengine-User-Ip") == "0.1.0.2",
            "ip:0.1.0.1": headers.get("X-Appengine-User-Ip") == "0.1.0.1",
        }
        if any(seen[marker] for marker in trusted):
            return None
        return Rejection(
            403,
            "Forbidden",
            "the caller is not Cloud Scheduler, cron, Cloud Tasks or an admin as App Engine marks them; "
            "X-CloudScheduler-* headers alone are not trusted",
        )


class GoogleIdTokens:
    """``oidc``: a Google-signed ID token, as Cloud Scheduler HTTP targets send."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self._certs = CertificateCache(settings.certs_url)

    def check(self, headers: Mapping[str, str], read_only: bool = False) -> Rejection | None:
        return self._check_oidc(headers)

    def _check_oidc(self, headers: Mapping[str, str]) -> Rejection | None:
        """Shape, claim types and lifetime first, then the signature, then what the claims say.

        The first checks need no key and reveal nothing configured.  The signature
        comes before audience, issuer and email, so an unsigned token cannot probe
        which of those this app accepts.
        """
        try:
            token = _bearer_token(headers.get("Authorization", ""))
            claims = _unverified_claims(token)
            _check_lifetime(claims)
            self._verify_signature(token)
            self._check_claims(claims)
        except InvalidToken as refused:
            return Rejection(401, "Unauthenticated", refused.reason)
        except CertificatesUnavailable as exc:
            # Not the caller's fault: a 500 makes Scheduler retry (never a 503).  The
            # details (the configured URL) go to the log, not to whoever is calling.
            log.warning("cannot verify ID tokens: %s", exc)
            return Rejection(
                500, "InternalError", "cannot verify tokens now: the token-signing certificates could not be fetched"
            )
        return None

    def _verify_signature(self, token: str) -> None:
        """google-auth checks the signature (and again the lifetime) of a well-formed token.

        The token's structure and claim types are already checked, so any failure
        here is about the signature.  The exceptions caught are broader than
        google-auth documents because its input is the caller's: a token nested
        just below what ``_unverified_claims`` could parse can still exhaust the
        stack a few frames deeper, and a library change must not make it a 500.
        """
        certs = self._certs.get()
        try:
            google.auth.jwt.decode(token, certs=certs, audience=None, clock_skew_in_seconds=CLOCK_SKEW_SECONDS)
        except (
            ValueError,
            TypeError,
            LookupError,
            AttributeError,
            RecursionError,
            google.auth.exceptions.GoogleAuthError,
        ):
            raise InvalidToken(BAD_SIGNATURE) from None

    def _check_claims(self, claims: Mapping[str, Any]) -> None:
        """What a verified token says; the claims' types are already checked."""
        if claims.get("aud") != self.settings.audience:
            raise InvalidToken(WRONG_AUDIENCE)
        if claims.get("iss") not in GOOGLE_ISSUERS:
            raise InvalidToken(WRONG_ISSUER)
        if claims.get("email_verified") is not True:
            raise InvalidToken(UNVERIFIED_EMAIL)
        if claims.get("email", "").lower() not in self.settings.allowed_emails:
            raise InvalidToken(UNLISTED_EMAIL)


# DEDUP_AUTH's modes, in the order error messages name them.
VERIFIERS: Mapping[str, type[Verifier]] = {"appengine": AppEngineMarkers, "oidc": GoogleIdTokens, "none": AnyCaller}


class InvalidToken(Exception):
    """Why a caller's token is refused (a 401); ``reason`` is one of the fixed messages."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _bearer_token(authorization: str) -> str:
    """The token of ``Authorization: Bearer <token>``, refused unparsed if too large or misshapen."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise InvalidToken(MISSING_TOKEN)
    if len(token) > MAX_TOKEN_CHARS:
        raise InvalidToken(TOKEN_TOO_LARGE)
    # Python's base64 silently skips characters outside the alphabet; refuse them instead.
    if not TOKEN_SHAPE.fullmatch(token):
        raise InvalidToken(MALFORMED_TOKEN)
    return token


def _unverified_claims(token: str) -> dict[str, Any]:
    """The payload of a token whose three segments decode and hold what google-auth assumes.

    Nothing here is trusted yet; it only makes sure that google-auth and the
    claim checks see JSON objects and values of the types they expect.
    """
    encoded_header, encoded_payload, encoded_signature = token.split(".")
    header = _json_object(_base64url(encoded_header))
    claims = _json_object(_base64url(encoded_payload))
    _base64url(encoded_signature)
    if header.get("alg") != SIGNING_ALGORITHM:
        raise InvalidToken(BAD_SIGNATURE)  # "none", HS256 keyed with the public certificate, ...
    if not isinstance(header.get("kid", ""), str):
        raise InvalidToken(MALFORMED_TOKEN)
    _check_claim_types(claims)
    return claims


def _base64url(segment: str) -> bytes:
    """An unpadded base64url segment (already known to hold only the alphabet), decoded."""
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except ValueError:  # binascii.Error: a length no encoding produces
        raise InvalidToken(MALFORMED_TOKEN) from None


def _json_object(data: bytes) -> dict[str, Any]:
    """A JSON object in UTF-8.

    RecursionError is caught with the rest: deep nesting exhausts the JSON
    parser's stack, and that is the caller's malformed token, not a crash.
    """
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError, too many digits
        raise InvalidToken(MALFORMED_TOKEN) from None
    if not isinstance(value, dict):
        raise InvalidToken(MALFORMED_TOKEN)
    return value


def _check_claim_types(claims: Mapping[str, Any]) -> None:
    """iat and exp are finite numbers; the claims this app reads have their JSON types."""
    for name in ("iat", "exp"):
        value = claims.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidToken(MALFORMED_TOKEN)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidToken(MALFORMED_TOKEN)
    for name, kind in CLAIM_TYPES.items():
        if name in claims and not isinstance(claims[name], kind):
            raise InvalidToken(MALFORMED_TOKEN)


def _check_lifetime(claims: Mapping[str, Any]) -> None:
    """Issued before now and not expired, give or take the clock skew google-auth allows.

    google-auth checks this too, after the signature; checking it here first
    tells an expired token so, and leaves google-auth only the signature to refuse.
    """
    now = time.time()
    if not claims["iat"] - CLOCK_SKEW_SECONDS <= now <= claims["exp"] + CLOCK_SKEW_SECONDS:
        raise InvalidToken(EXPIRED_TOKEN)


class CertificatesUnavailable(Exception):
    pass


class CertificateCache:
    """Google's token-signing certificates, fetched at most once an hour (or per Cache-Control)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._certs: dict | None = None
        self._expires = 0.0
        self._failed_until = 0.0
        self._lock = threading.Lock()

    def get(self) -> dict:
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

    def _fetch(self) -> tuple[dict, float]:
        try:
            response = requests.get(self.url, timeout=10)
            response.raise_for_status()
            certs = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise CertificatesUnavailable(f"fetching {self.url} failed: {exc}") from None
        if not isinstance(certs, dict) or not certs:
            raise CertificatesUnavailable(f"{self.url} returned no certificates")
        max_age = CERTS_MAX_AGE_SECONDS
        for directive in response.headers.get("Cache-Control", "").split(","):
            name, _, value = directive.strip().partition("=")
            if name == "max-age" and value.isdigit():
                max_age = min(int(value), CERTS_MAX_AGE_SECONDS)
        return certs, max_age
