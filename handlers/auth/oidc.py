"""``oidc``: a Google-signed ID token (``Authorization: Bearer``), as Cloud Scheduler HTTP targets send."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Self

from handlers.access import Principal, Role, normal_domain, normal_email
from handlers.auth.verifier import AuthConfigError, RequestHeaders, Selection, Verifier
from handlers.signed_tokens import InvalidToken, SignedTokens, TokenKind
from settings import DEFAULT_OIDC_CERTS_URL as DEFAULT_CERTS_URL
from settings import Settings

GOOGLE_ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})
ID_TOKEN = TokenKind("ID token", "RS256", {"iss": str, "aud": str, "email": str, "email_verified": bool, "hd": str})

MISSING_TOKEN = "an Authorization: Bearer <Google-signed ID token> header is required"
WRONG_ISSUER = "the ID token's issuer is not Google"
UNVERIFIED_EMAIL = "the ID token's email is not verified"


@dataclasses.dataclass(frozen=True)
class GoogleIdTokens(Verifier):
    """``oidc``: a Google-signed ID token, as Cloud Scheduler HTTP targets send.

    Any Google account can mint a token for any audience, so a verified token
    proves who is calling, never that it may: DEDUP_OIDC_ALLOWED_EMAILS deliver,
    and DEDUP_OPERATORS / DEDUP_VIEWERS grant the rest.
    """

    mode: ClassVar[str] = "oidc"
    audience: str = ""
    allowed_emails: frozenset[str] = frozenset()
    certs_url: str = DEFAULT_CERTS_URL
    # The keys, fetched and cached as long as these settings (and the gate built from them) live.
    _tokens: SignedTokens = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tokens", SignedTokens(ID_TOKEN, self.certs_url))

    @classmethod
    def from_settings(cls, settings: Settings, selection: Selection) -> Self:
        audience, emails = settings.oidc_audience, settings.oidc_allowed_emails
        if not audience:
            raise AuthConfigError("DEDUP_AUTH=oidc needs DEDUP_OIDC_AUDIENCE (the URL Scheduler puts in the token)")
        if not emails:
            raise AuthConfigError("DEDUP_AUTH=oidc needs DEDUP_OIDC_ALLOWED_EMAILS (the callers' service accounts)")
        return cls(audience=audience, allowed_emails=emails, certs_url=settings.oidc_certs_url)

    @property
    def wanted(self) -> str:
        return MISSING_TOKEN

    def identify(self, headers: RequestHeaders) -> Principal | None:
        authorization = headers.get("Authorization")
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
        delivers = frozenset({Role.DELIVER}) if email in self.allowed_emails else frozenset()
        hosted_domain = normal_domain(claims.get("hd", ""))
        return Principal.person(email, granted=delivers, admitted=False, hosted_domain=hosted_domain)
