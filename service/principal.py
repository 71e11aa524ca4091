"""Who a request acts for (a ``Principal``) and the roles there are (``Role``).

The service records a principal's name on what it does (``requested_by``, who paused);
how a principal is verified and which roles it holds is the adapters' (``handlers/auth/``,
``handlers/access.py``).
"""

from __future__ import annotations

import dataclasses
import enum

SERVICE_ACCOUNT_SUFFIX = ".gserviceaccount.com"


class Role(enum.Enum):
    DELIVER = "deliver"
    VIEW = "view"
    OPERATE = "operate"


def is_service_account(email: str) -> bool:
    return email.endswith(SERVICE_ACCOUNT_SUFFIX)


@dataclasses.dataclass(frozen=True)
class Principal:
    """A verified caller.

    ``name`` is what records and logs say (``user:alice@example.com``,
    ``serviceAccount:…``, ``appengine:cron``, ``local``); ``granted`` is what the
    evidence alone grants; ``admitted`` marks a person a Google front end let in;
    ``hosted_domain`` is the Workspace domain a signed token vouches for (``hd``).
    """

    name: str
    email: str = ""
    granted: frozenset[Role] = frozenset()
    admitted: bool = False
    hosted_domain: str = ""

    @classmethod
    def person(
        cls, email: str, *, granted: frozenset[Role] = frozenset(), admitted: bool, hosted_domain: str = ""
    ) -> Principal:
        kind = "serviceAccount" if is_service_account(email) else "user"
        return cls(name=f"{kind}:{email}", email=email, granted=granted, admitted=admitted, hosted_domain=hosted_domain)

    @classmethod
    def named(cls, name: str) -> Principal:
        """A principal the app acts for by name alone, granted nothing: who a queued task names, a policy."""
        return cls(name=name, granted=frozenset())
