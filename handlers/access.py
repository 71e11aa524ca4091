"""Who a caller is (a ``Principal``) and what it may do (its ``Role``s): one rule, one place.

Evidence (App Engine's markers, IAP's assertion, an ID token) names a
principal; the roles follow from who vouched for it and from two lists:

- ``deliver``: scheduled deliveries, Cloud Tasks and cron targets.  Only the
  internal callers have it: App Engine's cron, queue and Scheduler markers,
  and the ID-token callers of DEDUP_OIDC_ALLOWED_EMAILS.  No person has it.
- ``view``: the dashboard and the run API's reads.  Operators, the principals
  of DEDUP_VIEWERS, and, while DEDUP_VIEWERS is unset, every person a Google
  front end admitted (a signed-in admin behind ``login: admin``, an IAP
  identity): App Engine and IAM already decided they may see the project.
- ``operate``: manual runs, retries, schedule slots; view too.  Only the
  principals of DEDUP_OPERATORS: App Engine counts project Viewers as admins,
  so being admitted is never enough to start a job.

The lists take IAM's member syntax: ``alice@example.com`` or
``user:alice@example.com``, ``serviceAccount:ci@P.iam.gserviceaccount.com``,
``domain:example.com``.  Emails compare without regard to case.  As in IAM,
``domain:`` is a Google Workspace domain: it matches the hosted-domain claim
(``hd``) of a signed token, never the text after an email's ``@`` (anyone can
make a consumer Google account with an address at any domain).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

# Emails and domains as evidence names them: the library's rule (dedup.callers), one for both.
from dedup.callers import DOMAIN, normal_email

# The principal and the roles are the service layer's (a service call acts for one); re-exported for the gate.
from service.principal import SERVICE_ACCOUNT_SUFFIX, Principal, Role, is_service_account

# What a role lets a caller do, for the 403 that says which role was missing.
ROLE_NEEDS = {
    Role.DELIVER: "delivering scheduled runs and tasks is for Cloud Scheduler, cron and Cloud Tasks",
    Role.VIEW: "reading runs needs a viewer or an operator (DEDUP_VIEWERS, DEDUP_OPERATORS)",
    Role.OPERATE: "starting and retrying runs needs an operator (DEDUP_OPERATORS)",
}


class AccessConfigError(ValueError):
    """A bad DEDUP_OPERATORS or DEDUP_VIEWERS: the app refuses to start."""


@dataclasses.dataclass(frozen=True)
class Member:
    """One entry of DEDUP_OPERATORS or DEDUP_VIEWERS."""

    kind: str  # "email" (either kind), "user", "serviceAccount", "domain"
    value: str

    @classmethod
    def parse(cls, entry: str, setting: str) -> Member:
        kind, colon, value = entry.strip().partition(":")
        if not colon:
            kind, value = "email", kind
        if kind == "domain":
            domain = value.strip().lower()
            if not DOMAIN.fullmatch(domain):
                raise AccessConfigError(f"{setting}: {entry.strip()!r} is not domain:DOMAIN with a domain name")
            return cls("domain", domain)
        if kind not in ("email", "user", "serviceAccount"):
            raise AccessConfigError(
                f"{setting}: {entry.strip()!r}: write EMAIL, user:EMAIL, serviceAccount:EMAIL or domain:DOMAIN"
            )
        email = normal_email(value)
        if email is None:
            raise AccessConfigError(f"{setting}: {entry.strip()!r} does not hold an email address")
        if kind == "serviceAccount" and not is_service_account(email):
            raise AccessConfigError(
                f"{setting}: {entry.strip()!r}: a service account's email ends with {SERVICE_ACCOUNT_SUFFIX}"
            )
        if kind == "user" and is_service_account(email):
            raise AccessConfigError(f"{setting}: {entry.strip()!r} is a service account: write serviceAccount:{email}")
        return cls(kind, email)

    def matches(self, principal: Principal) -> bool:
        email = principal.email
        if not email:
            return False
        if self.kind == "domain":
            return bool(principal.hosted_domain) and principal.hosted_domain == self.value
        if self.kind == "user" and is_service_account(email):
            return False
        if self.kind == "serviceAccount" and not is_service_account(email):
            return False
        return email == self.value


def parse_members(raw: str | None, setting: str) -> tuple[Member, ...] | None:
    """The members of a comma-separated setting; None when it is unset."""
    if raw is None:
        return None
    entries = [entry for entry in raw.split(",") if entry.strip()]
    return tuple(Member.parse(entry, setting) for entry in entries)


@dataclasses.dataclass(frozen=True)
class AccessPolicy:
    """DEDUP_OPERATORS and DEDUP_VIEWERS, parsed once at start-up."""

    operators: tuple[Member, ...] = ()
    viewers: tuple[Member, ...] | None = None  # None: every admitted person views

    @classmethod
    def parse(cls, operators: str | None, viewers: str | None) -> AccessPolicy:
        """From DEDUP_OPERATORS and DEDUP_VIEWERS as written (``Settings.operators``, ``.viewers``)."""
        return cls(
            operators=parse_members(operators, "DEDUP_OPERATORS") or (), viewers=parse_members(viewers, "DEDUP_VIEWERS")
        )

    def roles_of(self, principal: Principal) -> frozenset[Role]:
        roles = set(principal.granted)
        if any(member.matches(principal) for member in self.operators):
            roles |= {Role.OPERATE, Role.VIEW}
        if self.viewers is None:
            if principal.admitted:
                roles.add(Role.VIEW)
        elif any(member.matches(principal) for member in self.viewers):
            roles.add(Role.VIEW)
        return frozenset(roles)


def requires(role: Role) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the role a view needs; the app's gate reads it through ``request.endpoint``.

    A view without the mark needs ``deliver``: nothing is open to people
    because someone forgot to say who it is for.
    """

    def mark(view: Callable[..., Any]) -> Callable[..., Any]:
        view.required_role = role  # type: ignore[attr-defined]
        return view

    return mark


def open_to_anyone(view: Callable[..., Any]) -> Callable[..., Any]:
    """Serve ``view`` to every caller, verified or not: only for a view that does nothing a caller
    chooses and says nothing (App Engine's ``/_ah/warmup``), so no caller gains by reaching it."""
    view.needs_no_caller = True  # type: ignore[attr-defined]
    return view


def needs_no_caller(view: Callable[..., Any] | None) -> bool:
    return bool(getattr(view, "needs_no_caller", False))


def role_of(view: Callable[..., Any] | None) -> Role:
    return getattr(view, "required_role", Role.DELIVER)
