"""``iap``: the ``X-Goog-IAP-JWT-Assertion`` Identity-Aware Proxy signs (ES256) for every request it lets through."""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar, Self

from dedup.callers import normal_domain, normal_email
from dedup.signed_tokens import InvalidToken, SignedTokens, TokenKind
from handlers.access import Principal
from handlers.auth.verifier import AuthConfigError, RequestHeaders, Selection, Verifier
from settings import DEFAULT_IAP_CERTS_URL as DEFAULT_IAP_CERTS_URL
from settings import Settings

IAP_ISSUER = "https://cloud.google.com/iap"
IAP_HEADER = "X-Goog-IAP-JWT-Assertion"
# IAP's audiences: App Engine's, and a backend service's (IAP in front of a load balancer).
IAP_AUDIENCE_SHAPE = re.compile(r"/projects/[0-9]+/(?:apps/[a-z][a-z0-9:.-]*|global/backendServices/[0-9]+)")
IAP_ASSERTION = TokenKind("IAP assertion", "ES256", {"iss": str, "aud": str, "email": str, "sub": str, "hd": str})

IAP_WRONG_ISSUER = "the IAP assertion's issuer is not IAP"
IAP_NO_EMAIL = "the IAP assertion names no email"


@dataclasses.dataclass(frozen=True)
class IapAssertions(Verifier):
    """``iap``: the assertion Identity-Aware Proxy signs for every request it lets through."""

    mode: ClassVar[str] = "iap"
    # IAP passes a script's own Authorization token (meant for IAP) on to the app: beside a verified
    # assertion, an ID token that does not verify is ignored.
    supersedes_refusals_of: ClassVar[frozenset[str]] = frozenset({"oidc"})
    # Behind IAP the assertion is a person's only evidence: App Engine's signed-in-user headers are not signed.
    supersedes_people_of: ClassVar[frozenset[str]] = frozenset({"appengine"})
    iap_audience: str = ""
    iap_certs_url: str = DEFAULT_IAP_CERTS_URL
    # The keys, fetched and cached as long as these settings (and the gate built from them) live.
    _tokens: SignedTokens = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tokens", SignedTokens(IAP_ASSERTION, self.iap_certs_url))

    @classmethod
    def from_settings(cls, settings: Settings, selection: Selection) -> Self:
        audience = settings.iap_audience
        if not IAP_AUDIENCE_SHAPE.fullmatch(audience):
            raise AuthConfigError(
                "DEDUP_AUTH=iap needs DEDUP_IAP_AUDIENCE, IAP's audience for this app: "
                "/projects/PROJECT_NUMBER/apps/PROJECT_ID (gcloud projects describe PROJECT_ID "
                "--format='value(projectNumber)')"
            )
        if "appengine" in selection.modes and not audience.split("/")[3] == "apps":
            raise AuthConfigError(
                "DEDUP_IAP_AUDIENCE names a backend service (a load balancer), where App Engine's markers can "
                "be forged: DEDUP_AUTH=appengine is for an app App Engine serves (/projects/N/apps/ID)"
            )
        return cls(iap_audience=audience, iap_certs_url=settings.iap_certs_url)

    @property
    def wanted(self) -> str:
        return f"an {IAP_HEADER} header (Identity-Aware Proxy)"

    def identify(self, headers: RequestHeaders) -> Principal | None:
        assertion = headers.get(IAP_HEADER)
        if assertion is None:
            return None
        claims = self._tokens.verified_claims(assertion.strip())
        if claims.get("aud") != self.iap_audience:
            raise InvalidToken(IAP_ASSERTION.wrong_audience)
        if claims.get("iss") != IAP_ISSUER:
            raise InvalidToken(IAP_WRONG_ISSUER)
        email = normal_email(claims.get("email", ""))
        if email is None:
            raise InvalidToken(IAP_NO_EMAIL)
        # IAP let the principal through because IAM grants it access: admitted, as login: admin admits.
        return Principal.person(email, admitted=True, hosted_domain=normal_domain(claims.get("hd", "")))
