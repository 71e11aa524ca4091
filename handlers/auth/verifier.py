"""What a DEDUP_AUTH mode is: a Verifier subclass, the Selection its settings see, AuthConfigError.

A mode is one frozen dataclass: its fields are its settings, ``from_settings``
takes them from the app's ``Settings`` (settings.py reads its variables) and checks them
(a bad one stops the app at start-up), ``identify`` turns a
request's headers into a ``Principal``.  How it combines with the other
modes is data on the class (``alone``, ``supersedes_refusals_of``, ...), read
by the gate, so the gate names no mode.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Protocol, Self, overload

from handlers.access import Principal
from settings import SettingError, Settings


class AuthConfigError(SettingError):
    """A bad DEDUP_AUTH configuration: the app refuses to start (a ``SettingError``, as every bad setting)."""


class ForbiddenEvidence(Exception):
    """Evidence this request may not carry, whatever else it carries: the gate refuses it (a 403).

    ``reason`` says why, naming headers, never what they hold.
    """

    @property
    def reason(self) -> str:
        return str(self.args[0])


class RequestHeaders(Protocol):
    """The headers a verifier reads: a plain mapping (tests) or Werkzeug's ``Headers`` (the request)."""

    @overload
    def get(self, key: str, /) -> str | None: ...
    @overload
    def get(self, key: str, default: str, /) -> str: ...


@dataclasses.dataclass(frozen=True)
class Selection:
    """What a mode's settings may depend on besides its own variables: the modes DEDUP_AUTH selects
    (checked, as written) and whether this is App Engine."""

    verifiers: tuple[type[Verifier], ...]
    on_app_engine: bool

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(verifier.mode for verifier in self.verifiers)

    def people_superseded(self, mode: str) -> bool:
        """Whether a selected mode's evidence replaces the people ``mode`` names (then ``mode`` may
        leave its unsigned people out by default)."""
        return any(mode in verifier.supersedes_people_of for verifier in self.verifiers)


@dataclasses.dataclass(frozen=True)
class Verifier(abc.ABC):
    """One DEDUP_AUTH mode: its settings (the dataclass fields), and the principal a request's evidence names.

    Field names are also ``AuthSettings``' keywords (``AuthSettings(modes=("oidc",), audience=...)``),
    so they are unique among the registered modes.
    """

    mode: ClassVar[str]  # its name in DEDUP_AUTH
    # Why DEDUP_AUTH may name this mode only alone (``none``: "admits everyone"); None: it combines with any.
    alone: ClassVar[str | None] = None
    # Why this mode is refused on App Engine (``none``: "is for local development"); None: it is not.
    refused_on_app_engine: ClassVar[str | None] = None
    # The mode(s) DEDUP_AUTH means when unset on App Engine (``appengine``: app.yaml's default).
    default_on_app_engine: ClassVar[bool] = False
    # Modes whose refusal yields to this mode's evidence: beside a principal of this mode their
    # refusal is ignored, and beside this mode's own refusal theirs is not the one reported.
    # (``iap`` over ``oidc``: IAP passes a script's own token, meant for IAP, on to the app.)
    supersedes_refusals_of: ClassVar[frozenset[str]] = frozenset()
    # Modes whose people this mode's evidence replaces: beside a principal of this mode a person they
    # name is ignored.  (``iap`` over ``appengine``: the signed-in-user headers are not signed.)
    supersedes_people_of: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    @abc.abstractmethod
    def from_settings(cls, settings: Settings, selection: Selection) -> Self:
        """This mode's settings, from the app's; raises ``AuthConfigError`` naming the variable that is
        wrong (never its value)."""

    @property
    @abc.abstractmethod
    def wanted(self) -> str:
        """The evidence this mode reads, for the 401 of a request that carries none."""

    @abc.abstractmethod
    def identify(self, headers: RequestHeaders) -> Principal | None:
        """The verified principal; None when the request carries none of this mode's evidence.

        Raises ``InvalidToken`` for evidence that is present but does not verify,
        ``ForbiddenEvidence`` for evidence this request may not carry at all,
        and ``CertificatesUnavailable`` when it cannot be checked now.
        """

    def trusts_forgeable_headers(self, on_app_engine: bool) -> bool:
        """Whether anyone could send this mode's evidence here: then only loopback is served (``LoopbackRule``)."""
        return False

    @classmethod
    def setting_names(cls) -> frozenset[str]:
        """Its settings' names: the ``AuthSettings`` keywords that configure it."""
        return frozenset(field.name for field in dataclasses.fields(cls) if field.init)

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, object]) -> Self:
        """This mode with the given settings (the others default): ``AuthSettings``' keyword form."""
        return cls(**{name: value for name, value in keywords.items() if name in cls.setting_names()})
