"""Caller verification, defence in depth beside app.yaml's ``login: admin``.

``X-CloudScheduler-*`` headers prove nothing (anyone can send them), so a
request is accepted only on evidence its sender cannot forge:

- ``appengine``: markers that App Engine itself sets and strips from client
  requests (cron, task queues, signed-in admins, the internal source IPs of
  Scheduler, Cloud Tasks and cron);
- ``oidc``: a Google-signed ID token, as Cloud Scheduler HTTP targets send,
  verified with google-auth (signature, expiry, issuer, audience, a verified
  and allowed email);
- ``none``: local development only; refused on App Engine.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Mapping

import google.auth.exceptions
import google.auth.jwt
import requests

DEFAULT_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
GOOGLE_ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})
MODES = ("appengine", "oidc", "none")
REFUSE_ALL = "refuse-all"  # the CLI without DEDUP_AUTH: commands work, requests are refused
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
CLOCK_SKEW_SECONDS = 10
CERTS_MAX_AGE_SECONDS = 3600
FAILED_FETCH_PAUSE_SECONDS = 5


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
        if mode not in MODES:
            raise AuthConfigError(f"DEDUP_AUTH={mode!r}: must be one of {', '.join(MODES)}")
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
            emails = frozenset(e.strip().lower() for e in environ.get("DEDUP_OIDC_ALLOWED_EMAILS", "").split(",") if e.strip())
            if not audience:
                raise AuthConfigError("DEDUP_AUTH=oidc needs DEDUP_OIDC_AUDIENCE (the URL Scheduler puts in the token)")
            if not emails:
                raise AuthConfigError("DEDUP_AUTH=oidc needs DEDUP_OIDC_ALLOWED_EMAILS (the callers' service accounts)")
            settings = dataclasses.replace(
                settings, audience=audience, allowed_emails=emails,
                certs_url=environ.get("DEDUP_OIDC_CERTS_URL", "").strip() or DEFAULT_CERTS_URL,
            )
        return settings


class CallerVerifier:
    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self._certs = CertificateCache(settings.certs_url)

    def check(self, headers: Mapping[str, str], read_only: bool = False) -> Rejection | None:
        """None when the caller is accepted, else why not.

        ``read_only`` (the dashboard, the run API's GETs): in ``appengine`` mode a
        signed-in admin is accepted there too, so operators can open the
        dashboard in a browser; nothing such a request does changes a run.
        """
        if self.settings.mode == "none":
            return None
        if read_only and self.settings.mode == "appengine" and headers.get("X-Appengine-User-Is-Admin") == "1":
            return None
        if self.settings.mode == REFUSE_ALL:
            return Rejection(403, "Forbidden", "DEDUP_AUTH is not set, so no request is served")
        if self.settings.mode == "appengine":
            return self._check_appengine(headers)
        return self._check_oidc(headers)

    def _check_appengine(self, headers: Mapping[str, str]) -> Rejection | None:
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
            403, "Forbidden",
            "the caller is not Cloud Scheduler, cron, Cloud Tasks or an admin as App Engine marks them; "
            "X-CloudScheduler-* headers alone are not trusted",
        )

    def _check_oidc(self, headers: Mapping[str, str]) -> Rejection | None:
        authorization = headers.get("Authorization", "")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Rejection(401, "Unauthenticated", "an Authorization: Bearer <Google-signed ID token> header is required")
        try:
            claims = google.auth.jwt.decode(
                token.strip(), certs=self._certs.get(), audience=self.settings.audience,
                clock_skew_in_seconds=CLOCK_SKEW_SECONDS,
            )
        except CertificatesUnavailable as exc:
            # Not the caller's fault: a 500 makes Scheduler retry (never a 503).
            return Rejection(500, "InternalError", f"cannot verify tokens now: {exc}")
        except (ValueError, google.auth.exceptions.GoogleAuthError) as exc:
            return Rejection(401, "Unauthenticated", f"the ID token is not valid: {exc}")
        if claims.get("iss") not in GOOGLE_ISSUERS:
            return Rejection(401, "Unauthenticated", f"the ID token's issuer {claims.get('iss')!r} is not Google")
        if claims.get("email_verified") is not True:
            return Rejection(401, "Unauthenticated", "the ID token's email is not verified")
        email = str(claims.get("email", "")).lower()
        if email not in self.settings.allowed_emails:
            return Rejection(401, "Unauthenticated", f"{email or 'the token'} is not an allowed caller")
        return None


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
