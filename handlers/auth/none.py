"""``none``: every request served, as ``local`` with every role; local development only."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Self

from handlers.access import Principal, Role
from handlers.auth.verifier import RequestHeaders, Selection, Verifier
from settings import Settings


@dataclasses.dataclass(frozen=True)
class AnyCaller(Verifier):
    """``none``: every request addressed to this machine's loopback is served (local development;
    refused on App Engine).  ``LoopbackRule`` refuses the others before any mode is asked."""

    mode: ClassVar[str] = "none"
    alone: ClassVar[str | None] = "admits everyone"
    refused_on_app_engine: ClassVar[str | None] = "is for local development"

    @classmethod
    def from_settings(cls, settings: Settings, selection: Selection) -> Self:
        return cls()

    @property
    def wanted(self) -> str:
        return "nothing"

    def identify(self, headers: RequestHeaders) -> Principal | None:
        return Principal(name="local", granted=frozenset(Role))

    def trusts_forgeable_headers(self, on_app_engine: bool) -> bool:
        return True  # no evidence at all
