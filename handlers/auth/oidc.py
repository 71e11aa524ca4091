"""``oidc``: a Google-signed ID token (``Authorization: Bearer``), as Cloud Scheduler HTTP targets send."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Self

from dedup.callers import DEFAULT_CERTS_URL, ID_TOKEN, MISSING_TOKEN, IdTokens
from dedup.signed_tokens import InvalidToken
from handlers.access import Principal, Role
from handlers.auth.verifier import AuthConfigError, RequestHeaders, Selection, Verifier
from settings import Settings

# The verification is the library's (dedup.callers); this mode maps its caller to a principal.


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
    _tokens: IdTokens | None = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tokens", IdTokens(self.audience, self.certs_url) if self.audience else None)

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
        if self._tokens is None:  # no audience (from_settings refuses one; the keyword form may not)
            if authorization is None:
                return None
            raise InvalidToken(ID_TOKEN.wrong_audience)  # no token is for an empty audience
        caller = self._tokens.identify(authorization)
        if caller is None:
            return None
        delivers = frozenset({Role.DELIVER}) if caller.email in self.allowed_emails else frozenset()
        return Principal.person(caller.email, granted=delivers, admitted=False, hosted_domain=caller.hosted_domain)
