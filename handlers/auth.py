"""Caller verification, defence in depth beside app.yaml's ``login: admin``.

``X-CloudScheduler-*`` headers prove nothing (anyone can send them), so a
request is served only on evidence its sender cannot forge, read by the
modes DEDUP_AUTH lists (one or more, e.g. ``appengine,iap``):

- ``appengine``: markers that App Engine itself sets (cron, task queues, the
  internal source IPs of Scheduler, Cloud Tasks and cron), and the admin
  signed in behind ``login: admin``;
- ``iap``: the ``X-Goog-IAP-JWT-Assertion`` Identity-Aware Proxy signs (ES256);
- ``oidc``: a Google-signed ID token, as Cloud Scheduler HTTP targets send;
- ``none``: local development only; refused on App Engine.

Off App Engine (``GAE_ENV`` other than ``standard``: unset, or ``localdev``
under dev_appserver) nothing strips client-sent ``X-Appengine-*`` headers, so
while ``none`` or ``appengine`` is among the modes only requests addressed to
a loopback ``Host`` are served (``LoopbackRule``).

Each mode is one class that turns a request's headers into a ``Principal``
(or nothing); ``handlers.access`` decides what the principal may do.  No or
bad credentials are a 401, a principal without the role a 403, with fixed
messages that echo neither the token nor the configuration.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
from collections.abc import Mapping
from typing import Protocol

from handlers.access import (
    ROLE_NEEDS,
    AccessConfigError,
    AccessPolicy,
    Principal,
    Role,
    normal_domain,
    normal_email,
)
from handlers.signed_tokens import CertificatesUnavailable, InvalidToken, SignedTokens, TokenKind

log = logging.getLogger(__name__)

DEFAULT_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
DEFAULT_IAP_CERTS_URL = "https://www.gstatic.com/iap/verify/public_key"
GOOGLE_ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})
IAP_ISSUER = "https://cloud.google.com/iap"
IAP_HEADER = "X-Goog-IAP-JWT-Assertion"
# IAP's audiences: App Engine's, and a backend service's (IAP in front of a load balancer).
IAP_AUDIENCE_SHAPE = re.compile(r"/projects/[0-9]+/(?:apps/[a-z][a-z0-9:.-]*|global/backendServices/[0-9]+)")
# App Engine markers this app can trust in `appengine` mode (DEDUP_APPENGINE_TRUSTED chooses; all by default).
# "admin" names the signed-in admin as a person, whose roles DEDUP_VIEWERS and DEDUP_OPERATORS decide;
# the others are internal callers, which deliver.
APPENGINE_MARKERS = {
    "cron": "X-Appengine-Cron: true (cron.yaml jobs)",
    "queue": "X-AppEngine-QueueName present (Cloud Tasks / task queues)",
    "admin": "X-Appengine-User-Is-Admin: 1 with X-Appengine-User-Email (the admin signed in behind login: admin)",
    "ip:0.1.0.2": "X-Appengine-User-Ip 0.1.0.2 (Cloud Scheduler App Engine jobs, Cloud Tasks, cron)",
    "ip:0.1.0.1": "X-Appengine-User-Ip 0.1.0.1 (cron jobs created with older tools)",
}
MODES = ("appengine", "iap", "oidc", "none")
# GAE_ENV on App Engine standard, whose front end strips client-sent X-Appengine-* headers.  Anywhere
# else it is unset, or "localdev" under dev_appserver.py, which passes client-sent copies through.
PRODUCTION_GAE_ENV = "standard"
# App Engine's markers are only as good as App Engine stripping client-sent copies: outside it
# `appengine` is refused, unless tests and local tools say they know (then only loopback is served).
OFF_APP_ENGINE_SETTING = "DEDUP_APPENGINE_OFF_GAE"
OFF_APP_ENGINE_VALUE = "trust-forgeable-headers"

ID_TOKEN = TokenKind("ID token", "RS256", {"iss": str, "aud": str, "email": str, "email_verified": bool, "hd": str})
IAP_ASSERTION = TokenKind("IAP assertion", "ES256", {"iss": str, "aud": str, "email": str, "sub": str, "hd": str})

# Refusals: fixed per kind of failure.
MISSING_TOKEN = "an Authorization: Bearer <Google-signed ID token> header is required"
WRONG_ISSUER = "the ID token's issuer is not Google"
UNVERIFIED_EMAIL = "the ID token's email is not verified"
IAP_WRONG_ISSUER = "the IAP assertion's issuer is not IAP"
IAP_NO_EMAIL = "the IAP assertion names no email"
UNTRUSTED_HEADERS = "X-CloudScheduler-* headers alone are not trusted"
NOT_LOOPBACK = (
    "off App Engine, DEDUP_AUTH=none and appengine serve only requests addressed to a loopback host name "
    "(localhost, 127.0.0.1, [::1])"
)
DIFFERENT_PEOPLE = "the credentials name different people"


class AuthConfigError(ValueError):
    """A bad DEDUP_AUTH configuration: the app refuses to start."""


@dataclasses.dataclass(frozen=True)
class Rejection:
    status: int  # 401, 403, or 500 when keys cannot be fetched
    error: str
    message: str
    principal: str | None = None  # a 403's verified caller, for the log


@dataclasses.dataclass(frozen=True)
class Admission:
    principal: Principal
    roles: frozenset[Role]


@dataclasses.dataclass(frozen=True)
class AuthSettings:
    modes: tuple[str, ...]
    trusted_markers: frozenset[str] = frozenset(APPENGINE_MARKERS)
    audience: str = ""
    allowed_emails: frozenset[str] = frozenset()
    certs_url: str = DEFAULT_CERTS_URL
    iap_audience: str = ""
    iap_certs_url: str = DEFAULT_IAP_CERTS_URL
    access: AccessPolicy = AccessPolicy()
    on_app_engine: bool = False  # GAE_ENV=standard: App Engine's front end strips client-sent markers

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> AuthSettings:
        on_app_engine = environ.get("GAE_ENV") == PRODUCTION_GAE_ENV
        modes = _modes(environ.get("DEDUP_AUTH", ""), on_app_engine)
        settings = cls(modes=modes, access=_access(environ), on_app_engine=on_app_engine)
        if "appengine" in modes:
            if not on_app_engine and environ.get(OFF_APP_ENGINE_SETTING) != OFF_APP_ENGINE_VALUE:
                raise AuthConfigError(
                    "DEDUP_AUTH=appengine trusts X-Appengine-* headers, which only App Engine strips from "
                    "client requests; outside App Engine (GAE_ENV not standard: unset, or localdev under "
                    "dev_appserver) anyone can send them. Choose iap or oidc there (tests and local tools may "
                    f"set {OFF_APP_ENGINE_SETTING}={OFF_APP_ENGINE_VALUE}, and are served on loopback only)"
                )
            raw = environ.get("DEDUP_APPENGINE_TRUSTED")
            if raw is None and "iap" in modes:
                # Behind IAP people come with a signed assertion; an unsigned signed-in-user header alone is no one.
                settings = dataclasses.replace(settings, trusted_markers=frozenset(APPENGINE_MARKERS) - {"admin"})
            if raw is not None:
                markers = frozenset(m.strip().lower() for m in raw.split(",") if m.strip())
                unknown = sorted(markers - set(APPENGINE_MARKERS))
                if unknown or not markers:
                    raise AuthConfigError(
                        f"DEDUP_APPENGINE_TRUSTED: unknown or no markers {unknown}; "
                        f"choose from {', '.join(APPENGINE_MARKERS)}"
                    )
                settings = dataclasses.replace(settings, trusted_markers=markers)
        if "oidc" in modes:
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
        if "iap" in modes:
            audience = environ.get("DEDUP_IAP_AUDIENCE", "").strip()
            if not IAP_AUDIENCE_SHAPE.fullmatch(audience):
                raise AuthConfigError(
                    "DEDUP_AUTH=iap needs DEDUP_IAP_AUDIENCE, IAP's audience for this app: "
                    "/projects/PROJECT_NUMBER/apps/PROJECT_ID (gcloud projects describe PROJECT_ID "
                    "--format='value(projectNumber)')"
                )
            if "appengine" in modes and not audience.split("/")[3] == "apps":
                raise AuthConfigError(
                    "DEDUP_IAP_AUDIENCE names a backend service (a load balancer), where App Engine's markers can "
                    "be forged: DEDUP_AUTH=appengine is for an app App Engine serves (/projects/N/apps/ID)"
                )
            settings = dataclasses.replace(
                settings,
                iap_audience=audience,
                iap_certs_url=environ.get("DEDUP_IAP_CERTS_URL", "").strip() or DEFAULT_IAP_CERTS_URL,
            )
        return settings

    @property
    def mode(self) -> str:
        """DEDUP_AUTH as written back: the modes joined by commas."""
        return ",".join(self.modes)

    @property
    def trusts_forgeable_headers(self) -> bool:
        """Whether a request's evidence could be anyone's here: ``none`` (no evidence at all), or
        ``appengine`` off App Engine, where nothing strips client-sent ``X-Appengine-*`` markers
        (the signed-in user's among them).  ``iap`` and ``oidc`` verify signatures: not forgeable."""
        return "none" in self.modes or ("appengine" in self.modes and not self.on_app_engine)


def _modes(raw: str, on_app_engine: bool) -> tuple[str, ...]:
    modes = tuple(m.strip().lower() for m in raw.split(",") if m.strip())
    if not modes:
        if not on_app_engine:
            raise AuthConfigError(
                "DEDUP_AUTH is not set: outside App Engine choose the caller verification "
                "explicitly (appengine, iap, oidc, a combination such as appengine,iap, or none for local development)"
            )
        modes = ("appengine",)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise AuthConfigError(f"DEDUP_AUTH={raw.strip()!r}: each mode must be one of {', '.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise AuthConfigError(f"DEDUP_AUTH={raw.strip()!r} names a mode twice")
    if "none" in modes and len(modes) > 1:
        raise AuthConfigError("DEDUP_AUTH=none admits everyone; it combines with no other mode")
    if modes == ("none",) and on_app_engine:
        raise AuthConfigError("DEDUP_AUTH=none is for local development; it is refused on App Engine")
    return modes


def _access(environ: Mapping[str, str]) -> AccessPolicy:
    try:
        return AccessPolicy.from_environ(environ)
    except AccessConfigError as exc:
        raise AuthConfigError(str(exc)) from None


class Verifier(Protocol):
    """One DEDUP_AUTH mode: the principal a request's evidence names."""

    wanted: str  # the evidence this mode reads, for the 401 of a request that carries none

    def identify(self, headers: Mapping[str, str]) -> Principal | None:
        """The verified principal; None when the request carries none of this mode's evidence.

        Raises ``InvalidToken`` for evidence that is present but does not verify,
        and ``CertificatesUnavailable`` when it cannot be checked now.
        """


class AnyCaller:
    """``none``: every request addressed to this machine's loopback is served (local development;
    refused on App Engine).  ``LoopbackRule`` refuses the others before any mode is asked."""

    wanted = "nothing"

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings

    def identify(self, headers: Mapping[str, str]) -> Principal | None:
        return Principal(name="local", granted=frozenset(Role))


class LoopbackRule:
    """Where the modes trust headers anyone could send (``AuthSettings.trusts_forgeable_headers``),
    only a request addressed to a loopback host name in ``Host`` is served.

    Such a server is meant for this machine alone, yet a web page can reach it
    through DNS rebinding (its own name resolving to 127.0.0.1), and the
    cross-site rule would pass it, its ``Origin`` and ``Host`` being the same
    attacker's name; anyone on the network sends some other ``Host`` too.
    """

    def __init__(self, settings: AuthSettings) -> None:
        self.applies = settings.trusts_forgeable_headers

    def refuses(self, headers: Mapping[str, str]) -> bool:
        return self.applies and not is_loopback_host(headers.get("Host", ""))


# A Host header naming loopback: a *.localhost name (RFC 6761; a trailing dot allowed), an IPv4
# address or a bracketed IPv6 one, and an optional port.  ASCII only, nothing else around it.
_LOOPBACK_HOST = re.compile(
    r"(?:(?P<name>(?:[a-z0-9-]+\.)*localhost\.?)|(?P<ipv4>[0-9.]+)|\[(?P<ipv6>[0-9a-f:.]+)\])(?::(?P<port>[0-9]{1,5}))?",
    re.ASCII,
)


IPV6_LOOPBACK = ipaddress.IPv6Address("::1")


def is_loopback_host(host: str) -> bool:
    """Whether a ``Host`` header (a name or address, perhaps with a port) names this machine's loopback.

    No Host at all (HTTP/1.0) counts as loopback: a browser always sends one,
    so its absence is no rebinding.
    """
    host = host.strip(" \t").lower()
    if not host:
        return True
    match = _LOOPBACK_HOST.fullmatch(host)
    if match is None or (match["port"] is not None and int(match["port"]) > 65535):
        return False
    if match["name"] is not None:
        return True
    try:
        if match["ipv4"] is not None:
            return ipaddress.IPv4Address(match["ipv4"]).is_loopback
        # Exactly ::1: an IPv4-mapped address (::ffff:127.0.0.1) is refused, the strict reading, which
        # ipaddress's is_loopback stopped giving in Python 3.13 (it now follows the mapped IPv4 address).
        return ipaddress.IPv6Address(match["ipv6"]) == IPV6_LOOPBACK
    except ValueError:
        return False


class AppEngineMarkers:
    """``appengine``: the markers App Engine sets, and the admin signed in behind ``login: admin``."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self.wanted = "App Engine's cron, task queue or Cloud Scheduler markers" + (
            ", or an admin signed in behind login: admin" if "admin" in settings.trusted_markers else ""
        )

    def identify(self, headers: Mapping[str, str]) -> Principal | None:
        trusted = self.settings.trusted_markers
        internal = {
            "cron": headers.get("X-Appengine-Cron", "").lower() == "true",
            "queue": bool(headers.get("X-AppEngine-QueueName")),
            "ip:0.1.0.2": headers.get("X-Appengine-User-Ip") == "0.1.0.2",
            "ip:0.1.0.1": headers.get("X-Appengine-User-Ip") == "0.1.0.1",
        }
        for marker, seen in internal.items():
            if seen and marker in trusted:
                return Principal(name=f"appengine:{marker}", granted=frozenset({Role.DELIVER}))
        if "admin" in trusted and headers.get("X-Appengine-User-Is-Admin") == "1":
            if "iap" in self.settings.modes and IAP_HEADER in headers:
                # Behind IAP the signed assertion is a person's only evidence: these headers are not signed.
                return None
            email = normal_email(headers.get("X-Appengine-User-Email", ""))
            if email is not None:
                return Principal.person(email, admitted=True)
        return None


class IapAssertions:
    """``iap``: the assertion Identity-Aware Proxy signs for every request it lets through."""

    wanted = f"an {IAP_HEADER} header (Identity-Aware Proxy)"

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self._tokens = SignedTokens(IAP_ASSERTION, settings.iap_certs_url)

    def identify(self, headers: Mapping[str, str]) -> Principal | None:
        assertion = headers.get(IAP_HEADER)
        if assertion is None:
            return None
        claims = self._tokens.verified_claims(assertion.strip())
        if claims.get("aud") != self.settings.iap_audience:
            raise InvalidToken(IAP_ASSERTION.wrong_audience)
        if claims.get("iss") != IAP_ISSUER:
            raise InvalidToken(IAP_WRONG_ISSUER)
        email = normal_email(claims.get("email", ""))
        if email is None:
            raise InvalidToken(IAP_NO_EMAIL)
        # IAP let the principal through because IAM grants it access: admitted, as login: admin admits.
        return Principal.person(email, admitted=True, hosted_domain=normal_domain(claims.get("hd", "")))


class GoogleIdTokens:
    """``oidc``: a Google-signed ID token, as Cloud Scheduler HTTP targets send.

    Any Google account can mint a token for any audience, so a verified token
    proves who is calling, never that it may: DEDUP_OIDC_ALLOWED_EMAILS deliver,
    and DEDUP_OPERATORS / DEDUP_VIEWERS grant the rest.
    """

    wanted = MISSING_TOKEN

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self._tokens = SignedTokens(ID_TOKEN, settings.certs_url)

    def identify(self, headers: Mapping[str, str]) -> Principal | None:
        authorization = headers.get("Authorization")
        if authorization is None:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise InvalidToken(MISSING_TOKEN)
        claims = self._tokens.verified_claims(token)
        if claims.get("aud") != self.settings.audience:
            raise InvalidToken(ID_TOKEN.wrong_audience)
        if claims.get("iss") not in GOOGLE_ISSUERS:
            raise InvalidToken(WRONG_ISSUER)
        if claims.get("email_verified") is not True:
            raise InvalidToken(UNVERIFIED_EMAIL)
        email = normal_email(claims.get("email", ""))
        if email is None:
            raise InvalidToken(ID_TOKEN.malformed)
        delivers = frozenset({Role.DELIVER}) if email in self.settings.allowed_emails else frozenset()
        hosted_domain = normal_domain(claims.get("hd", ""))
        return Principal.person(email, granted=delivers, admitted=False, hosted_domain=hosted_domain)


# DEDUP_AUTH's modes, in the order error messages name them.
VERIFIERS: Mapping[str, type[Verifier]] = {
    "appengine": AppEngineMarkers,
    "iap": IapAssertions,
    "oidc": GoogleIdTokens,
    "none": AnyCaller,
}


class CallerGate:
    """Every request passes here before its view: who is calling, and may it do what the view does."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self.verifiers = [VERIFIERS[mode](settings) for mode in settings.modes]
        self.loopback_rule = LoopbackRule(settings)

    def roles_of(self, principal: Principal) -> frozenset[Role]:
        return self.settings.access.roles_of(principal)

    def admit(self, headers: Mapping[str, str], needed: Role | None) -> Admission | Rejection:
        """Who is calling and what it may do, or the refusal; ``needed`` None: any verified caller
        (the route does not exist, and routing answers 404 or 405).

        Where the modes trust headers anyone could send, a ``Host`` that is
        not loopback is refused first (401).  Evidence that does not verify
        refuses the request (401), with one exception: behind IAP a script's
        own ``Authorization`` token (meant for IAP) reaches the app too, so
        with a verified assertion an ID token that does not verify is
        ignored.  Two kinds of evidence naming two different people are
        refused too.
        """
        if self.loopback_rule.refuses(headers):
            return self._unauthenticated(NOT_LOOPBACK)  # a fixed message: the Host is not echoed
        principals: list[Principal] = []
        refusals: dict[str, str] = {}
        iap_verified = False
        for mode, verifier in zip(self.settings.modes, self.verifiers, strict=True):
            try:
                principal = verifier.identify(headers)
            except InvalidToken as refused:
                refusals[mode] = refused.reason
                continue
            except CertificatesUnavailable as exc:
                # Not the caller's fault: a 500 makes Scheduler retry (never a 503).  The
                # details (the configured URL) go to the log, not to whoever is calling.
                log.warning("cannot verify credentials: %s", exc)
                return Rejection(
                    500, "InternalError", "cannot verify credentials now: the signing keys could not be fetched"
                )
            if principal is not None:
                principals.append(principal)
                iap_verified = iap_verified or mode == "iap"
        if iap_verified:
            refusals.pop("oidc", None)
        if refusals:
            return self._unauthenticated(refusals.get("iap") or next(iter(refusals.values())))
        if not principals:
            return self._unauthenticated(" or ".join(v.wanted for v in self.verifiers) + f" ({UNTRUSTED_HEADERS})")
        if len({p.email for p in principals if p.email}) > 1:
            return self._unauthenticated(DIFFERENT_PEOPLE)
        for principal in principals:
            roles = self.roles_of(principal)
            if needed is None or needed in roles:
                return Admission(principal, roles)
        first = principals[0]
        return Rejection(403, "Forbidden", f"{first.name} may not do this: {ROLE_NEEDS[needed]}", principal=first.name)

    @staticmethod
    def _unauthenticated(message: str) -> Rejection:
        return Rejection(401, "Unauthenticated", message)
