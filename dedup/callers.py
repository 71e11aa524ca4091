"""Who called: a Google-signed ID token (``Authorization: Bearer``), as Cloud Scheduler's HTTP
targets send one from their service account, verified.

Any Google account can mint a token for any audience, so a verified token proves who is
calling, never that it may: the caller's email is compared with an allow-list by whoever asks
(the app's ``oidc`` mode, handlers/auth/oidc.py; a handler using the library, ``Callers``).
The signature is checked before the audience, issuer and email, so an unsigned token cannot
probe which of those are accepted (dedup.signed_tokens).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Protocol

from dedup.app_engine_markers import Headers
from dedup.signed_tokens import InvalidToken, SignedTokens, TokenKind

# Why a caller is refused: the status (401, 403), the problem type and the reason.
Refusal = tuple[int, str, str]

DEFAULT_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"  # Google's ID-token signing keys
GOOGLE_ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})
ID_TOKEN = TokenKind("ID token", "RS256", {"iss": str, "aud": str, "email": str, "email_verified": bool, "hd": str})

MISSING_TOKEN = "an Authorization: Bearer <Google-signed ID token> header is required"
WRONG_ISSUER = "the ID token's issuer is not Google"
UNVERIFIED_EMAIL = "the ID token's email is not verified"

# An email as the evidence names it: printable ASCII without spaces, one @, a dotted domain.
EMAIL = re.compile(r"[!-?A-~]+@(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9-]{2,63}")
DOMAIN = re.compile(r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9-]{2,63}")
MAX_EMAIL_CHARS = 254  # RFC 5321's path limit


def normal_email(value: str) -> str | None:
    """``value`` lower-cased if it is an email that can be compared, else None.

    ASCII is checked before lower-casing: some non-ASCII letters lower-case to
    ASCII ones (the Kelvin sign to ``k``), and must not name someone else.
    """
    if not value.isascii():
        return None
    email = value.strip().lower()
    if len(email) > MAX_EMAIL_CHARS or not EMAIL.fullmatch(email):
        return None
    return email


def normal_domain(value: str) -> str:
    """A hosted-domain claim lower-cased, or "" when it is absent or not a domain name."""
    if not isinstance(value, str) or not value.isascii():
        return ""
    domain = value.strip().lower()
    return domain if DOMAIN.fullmatch(domain) else ""


@dataclasses.dataclass(frozen=True)
class IdentifiedCaller:
    """Who a verified ID token names: its email, and its Workspace domain ("" when none)."""

    email: str
    hosted_domain: str


class IdTokens:
    """Google-signed ID tokens for one ``audience`` (the URL Scheduler puts in the token), their
    keys fetched from ``certs_url`` and cached."""

    def __init__(self, audience: str, certs_url: str = DEFAULT_CERTS_URL) -> None:
        if not audience:
            raise ValueError("an ID token's audience is required: the URL the Scheduler job puts in its token")
        self.audience = audience
        self._tokens = SignedTokens(ID_TOKEN, certs_url)

    def identify(self, authorization: str | None) -> IdentifiedCaller | None:
        """The caller an ``Authorization`` header names; None when there is none.  Raises
        ``InvalidToken`` for a token that does not verify, ``CertificatesUnavailable`` when the
        keys cannot be fetched now."""
        if authorization is None:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise InvalidToken(MISSING_TOKEN)
        claims = self._tokens.verified_claims(token)
        if claims.get("aud") != self.audience:
            raise InvalidToken(ID_TOKEN.wrong_audience)
        if claims.get("iss") not in GOOGLE_ISSUERS:
            raise InvalidToken(WRONG_ISSUER)
        if claims.get("email_verified") is not True:
            raise InvalidToken(UNVERIFIED_EMAIL)
        email = normal_email(claims.get("email", ""))
        if email is None:
            raise InvalidToken(ID_TOKEN.malformed)
        return IdentifiedCaller(email, normal_domain(claims.get("hd", "")))


class FoldedHeaders:
    """Headers looked up without regard to case, from whatever mapping a server gives."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._folded = {name.lower(): value for name, value in headers.items()}

    def get(self, key: str, /) -> str | None:
        return self._folded.get(key.lower())


class CallerCheck(Protocol):
    """Who a handler admits (``Callers``; ``dedup.app_engine_markers.AppEngineCallers``)."""

    def refusal(self, headers: Headers) -> Refusal | None:
        """None for an admitted caller; else why it is refused (nothing is recorded)."""


class Callers:
    """The callers a handler using the library admits: ID tokens for ``audience`` whose email is
    one of ``allowed_emails`` (the Scheduler jobs' service accounts)."""

    def __init__(self, audience: str, allowed_emails: Iterable[str], certs_url: str = DEFAULT_CERTS_URL) -> None:
        emails = {normal_email(email) if isinstance(email, str) else None for email in allowed_emails}
        if not emails or None in emails:
            raise ValueError("allowed_emails must name the callers' service accounts, each an email")
        self.allowed_emails = frozenset(email for email in emails if email is not None)
        self.tokens = IdTokens(audience, certs_url)

    def refusal(self, headers: Headers) -> Refusal | None:
        """None for an admitted caller; else the status, problem type and reason to refuse it with
        (nothing is recorded).  Raises ``CertificatesUnavailable`` when no token can be checked now."""
        authorization = headers.get("Authorization")
        try:
            caller = self.tokens.identify(authorization)
        except InvalidToken as refused:
            return 401, "Unauthenticated", refused.reason
        if caller is None:
            return 401, "Unauthenticated", MISSING_TOKEN
        if caller.email not in self.allowed_emails:
            return 403, "Forbidden", "the ID token's email is not one of the callers this handler admits"
        return None
