"""The registry of DEDUP_AUTH modes, AuthSettings, the loopback rule, and CallerGate, which every request passes.

The gate names no mode: what a mode is and how it combines with the others
is declared on its class (``handlers.auth.verifier.Verifier``), in its own
module beside this one, and listed once in ``VERIFIERS``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
from collections.abc import Mapping, Sequence

from dedup.signed_tokens import CertificatesUnavailable, InvalidToken
from handlers.access import ROLE_NEEDS, AccessConfigError, AccessPolicy, Principal, Role
from handlers.auth.appengine import AppEngineMarkers
from handlers.auth.iap import IapAssertions
from handlers.auth.none import AnyCaller
from handlers.auth.oidc import GoogleIdTokens
from handlers.auth.verifier import AuthConfigError, ForbiddenEvidence, RequestHeaders, Selection, Verifier
from settings import PRODUCTION_GAE_ENV as PRODUCTION_GAE_ENV
from settings import Settings

# The logger this module's lines have always had (it was handlers/auth.py).
log = logging.getLogger("handlers.auth")

# DEDUP_AUTH's modes, one line each, in the order error messages name them.
VERIFIERS: tuple[type[Verifier], ...] = (
    AppEngineMarkers,
    IapAssertions,
    GoogleIdTokens,
    AnyCaller,
)


def mode_names(registry: Sequence[type[Verifier]]) -> tuple[str, ...]:
    """The modes of a registry, checked: each name once, and each setting (an ``AuthSettings`` keyword) one mode's."""
    names = tuple(verifier.mode for verifier in registry)
    if len(set(names)) != len(names):
        raise AuthConfigError(f"a mode is registered twice: {', '.join(names)}")
    settings = [name for verifier in registry for name in verifier.setting_names()]
    shared = sorted({name for name in settings if settings.count(name) > 1})
    if shared:
        raise AuthConfigError(f"settings of two modes have one name: {', '.join(shared)}")
    return names


MODES = mode_names(VERIFIERS)
# PRODUCTION_GAE_ENV (settings.py): GAE_ENV on App Engine standard, whose front end strips client-sent
# X-Appengine-* headers.  Anywhere else it is unset, or "localdev" under dev_appserver.py, which
# passes client-sent copies through.

# Refusals: fixed per kind of failure.
UNTRUSTED_HEADERS = "X-CloudScheduler-* headers alone are not trusted"
NOT_LOOPBACK = (
    "off App Engine, DEDUP_AUTH=none and appengine serve only requests addressed to a loopback host name "
    "(localhost, 127.0.0.1, [::1])"
)
DIFFERENT_PEOPLE = "the credentials name different people"


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


@dataclasses.dataclass(frozen=True, init=False)
class AuthSettings:
    """The modes DEDUP_AUTH selects, each with its settings, in the order DEDUP_AUTH names them.

    Built by ``from_settings`` (the app's ``Settings``); or directly, from ``verifiers`` or from ``modes``
    and their settings as keywords: ``AuthSettings(modes=("oidc",), audience=..., allowed_emails=...)``.
    """

    verifiers: tuple[Verifier, ...]
    access: AccessPolicy
    on_app_engine: bool  # GAE_ENV=standard: App Engine's front end strips client-sent markers

    def __init__(
        self,
        modes: Sequence[str] | None = None,
        *,
        access: AccessPolicy | None = None,
        on_app_engine: bool = False,
        verifiers: Sequence[Verifier] | None = None,
        registry: Sequence[type[Verifier]] = VERIFIERS,
        **settings: object,
    ) -> None:
        if verifiers is None:
            by_mode = {verifier.mode: verifier for verifier in registry}
            unknown = [mode for mode in modes or () if mode not in by_mode]
            if unknown:
                raise AuthConfigError(f"unknown modes {unknown}: each mode must be one of {', '.join(by_mode)}")
            names = {name for verifier in registry for name in verifier.setting_names()}
            stray = sorted(set(settings) - names)
            if stray:
                raise TypeError(f"AuthSettings() got unexpected keyword arguments {stray}")
            verifiers = [by_mode[mode].from_keywords(settings) for mode in modes or ()]
        elif modes is not None or settings:
            raise TypeError("AuthSettings() takes verifiers, or modes and their settings, not both")
        object.__setattr__(self, "verifiers", tuple(verifiers))
        object.__setattr__(self, "access", access if access is not None else AccessPolicy())
        object.__setattr__(self, "on_app_engine", on_app_engine)

    @classmethod
    def from_settings(cls, settings: Settings, registry: Sequence[type[Verifier]] = VERIFIERS) -> AuthSettings:
        """The modes DEDUP_AUTH selects, each checking its own settings; raises ``AuthConfigError``
        (a ``SettingError``) for a bad one.  The app and ``python -m deploy check`` both call it.

        ``registry``: the modes there are (``VERIFIERS``), in the order error messages name them.
        """
        on_app_engine = settings.on_app_engine
        selection = _selection(settings.auth, on_app_engine, registry)
        access = _access(settings)
        # Each mode checks its own settings; in the registry's order, so which of two bad ones is named is fixed.
        parsed = {
            verifier: verifier.from_settings(settings, selection)
            for verifier in registry
            if verifier in selection.verifiers
        }
        return cls(
            verifiers=[parsed[verifier] for verifier in selection.verifiers], access=access, on_app_engine=on_app_engine
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], registry: Sequence[type[Verifier]] = VERIFIERS) -> AuthSettings:
        """``from_settings`` of ``Settings.from_environ(environ)``: the same one reading, for a test's mapping."""
        return cls.from_settings(Settings.from_environ(environ), registry)

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(verifier.mode for verifier in self.verifiers)

    @property
    def mode(self) -> str:
        """DEDUP_AUTH as written back: the modes joined by commas."""
        return ",".join(self.modes)

    def verifier[V: Verifier](self, kind: type[V]) -> V:
        """The selected mode of class ``kind``, with its settings; KeyError if it is not selected."""
        for verifier in self.verifiers:
            if isinstance(verifier, kind):
                return verifier
        raise KeyError(kind.mode)

    @property
    def trusts_forgeable_headers(self) -> bool:
        """Whether a request's evidence could be anyone's here: ``none`` (no evidence at all), or
        ``appengine`` off App Engine, where nothing strips client-sent ``X-Appengine-*`` markers
        (the signed-in user's among them).  ``iap`` and ``oidc`` verify signatures: not forgeable."""
        return any(verifier.trusts_forgeable_headers(self.on_app_engine) for verifier in self.verifiers)


def _selection(raw: str, on_app_engine: bool, registry: Sequence[type[Verifier]]) -> Selection:
    by_mode = {verifier.mode: verifier for verifier in registry}
    modes = tuple(m.strip().lower() for m in raw.split(",") if m.strip())
    if not modes:
        modes = tuple(verifier.mode for verifier in registry if verifier.default_on_app_engine)
        if not on_app_engine or not modes:
            raise AuthConfigError(
                "DEDUP_AUTH is not set: outside App Engine choose the caller verification "
                "explicitly (appengine, iap, oidc, a combination such as appengine,iap, or none for local development)"
            )
    unknown = [m for m in modes if m not in by_mode]
    if unknown:
        raise AuthConfigError(f"DEDUP_AUTH={raw.strip()!r}: each mode must be one of {', '.join(by_mode)}")
    if len(set(modes)) != len(modes):
        raise AuthConfigError(f"DEDUP_AUTH={raw.strip()!r} names a mode twice")
    selected = tuple(by_mode[m] for m in modes)
    for verifier in selected:
        if verifier.alone is not None and len(selected) > 1:
            raise AuthConfigError(f"DEDUP_AUTH={verifier.mode} {verifier.alone}; it combines with no other mode")
    for verifier in selected:
        if verifier.refused_on_app_engine is not None and on_app_engine:
            raise AuthConfigError(
                f"DEDUP_AUTH={verifier.mode} {verifier.refused_on_app_engine}; it is refused on App Engine"
            )
    return Selection(verifiers=selected, on_app_engine=on_app_engine)


def _access(settings: Settings) -> AccessPolicy:
    try:
        return AccessPolicy.parse(settings.operators, settings.viewers)
    except AccessConfigError as exc:
        raise AuthConfigError(str(exc)) from None


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

    def refuses(self, headers: RequestHeaders) -> bool:
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


class CallerGate:
    """Every request passes here before its view: who is calling, and may it do what the view does."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self.verifiers = settings.verifiers
        self.loopback_rule = LoopbackRule(settings)

    def roles_of(self, principal: Principal) -> frozenset[Role]:
        return self.settings.access.roles_of(principal)

    def admit(self, headers: RequestHeaders, needed: Role | None) -> Admission | Rejection:
        """Who is calling and what it may do, or the refusal; ``needed`` None: any verified caller
        (the route does not exist, and routing answers 404 or 405).

        Where the modes trust headers anyone could send, a ``Host`` that is
        not loopback is refused first (401).  Evidence that does not verify
        refuses the request (401), but for what a verified mode supersedes
        (``Verifier.supersedes_refusals_of``: behind IAP a script's own
        ``Authorization`` token, meant for IAP, reaches the app too).  People a
        verified mode supersedes are ignored (``supersedes_people_of``).  Two
        kinds of evidence naming two different people are refused too.
        """
        if self.loopback_rule.refuses(headers):
            return self._unauthenticated(NOT_LOOPBACK)  # a fixed message: the Host is not echoed
        found: list[tuple[Verifier, Principal]] = []
        refusals: dict[str, str] = {}  # mode -> reason, in DEDUP_AUTH's order
        outranked: set[str] = set()  # modes whose refusal a refusing mode's outranks
        for verifier in self.verifiers:
            try:
                principal = verifier.identify(headers)
            except ForbiddenEvidence as refused:
                # Evidence no caller of this request may send: refused whatever else it carries.
                return Rejection(403, "ForbiddenEvidence", refused.reason)
            except InvalidToken as refused:
                refusals[verifier.mode] = refused.reason
                outranked |= verifier.supersedes_refusals_of
                continue
            except CertificatesUnavailable as exc:
                # Not the caller's fault: a 500 makes Scheduler retry (never a 503).  The
                # details (the configured URL) go to the log, not to whoever is calling.
                log.warning("cannot verify credentials: %s", exc)
                return Rejection(
                    500, "InternalError", "cannot verify credentials now: the signing keys could not be fetched"
                )
            if principal is not None:
                found.append((verifier, principal))
        # What the verified modes supersede: refusals, and people named by weaker evidence.
        ignored_refusals = {mode for verifier, _ in found for mode in verifier.supersedes_refusals_of}
        ignored_people = {mode for verifier, _ in found for mode in verifier.supersedes_people_of}
        refusals = {mode: reason for mode, reason in refusals.items() if mode not in ignored_refusals}
        if refusals:
            reported = [reason for mode, reason in refusals.items() if mode not in outranked]
            return self._unauthenticated((reported or list(refusals.values()))[0])
        principals = [p for verifier, p in found if not (p.email and verifier.mode in ignored_people)]
        if not principals:
            return self._unauthenticated(" or ".join(v.wanted for v in self.verifiers) + f" ({UNTRUSTED_HEADERS})")
        if len({p.email for p in principals if p.email}) > 1:
            return self._unauthenticated(DIFFERENT_PEOPLE)
        if needed is None:
            return Admission(principals[0], self.roles_of(principals[0]))
        for principal in principals:
            roles = self.roles_of(principal)
            if needed in roles:
                return Admission(principal, roles)
        first = principals[0]
        return Rejection(403, "Forbidden", f"{first.name} may not do this: {ROLE_NEEDS[needed]}", principal=first.name)

    @staticmethod
    def _unauthenticated(message: str) -> Rejection:
        return Rejection(401, "Unauthenticated", message)
