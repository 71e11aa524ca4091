"""``appengine``: the markers App Engine itself sets, and the admin signed in behind ``login: admin``."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Self

from dedup.app_engine_markers import MarkersForged, internal_caller
from dedup.callers import normal_email
from handlers.access import Principal, Role
from handlers.auth.verifier import AuthConfigError, ForbiddenEvidence, RequestHeaders, Selection, Verifier
from settings import OFF_APP_ENGINE_SETTING as OFF_APP_ENGINE_SETTING
from settings import OFF_APP_ENGINE_VALUE as OFF_APP_ENGINE_VALUE
from settings import Settings

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


# App Engine's markers are only as good as App Engine stripping client-sent copies: outside it
# `appengine` is refused, unless tests and local tools say they know (OFF_APP_ENGINE_SETTING set to
# OFF_APP_ENGINE_VALUE, settings.py's appengine_off_app_engine; then only loopback is served).


@dataclasses.dataclass(frozen=True)
class AppEngineMarkers(Verifier):
    """``appengine``: the markers App Engine sets, and the admin signed in behind ``login: admin``."""

    mode: ClassVar[str] = "appengine"
    default_on_app_engine: ClassVar[bool] = True
    trusted_markers: frozenset[str] = frozenset(APPENGINE_MARKERS)

    @classmethod
    def from_settings(cls, settings: Settings, selection: Selection) -> Self:
        if not selection.on_app_engine and not settings.appengine_off_app_engine:
            raise AuthConfigError(
                "DEDUP_AUTH=appengine trusts X-Appengine-* headers, which only App Engine strips from "
                "client requests; outside App Engine (GAE_ENV not standard: unset, or localdev under "
                "dev_appserver) anyone can send them. Choose iap or oidc there (tests and local tools may "
                f"set {OFF_APP_ENGINE_SETTING}={OFF_APP_ENGINE_VALUE}, and are served on loopback only)"
            )
        markers = settings.appengine_trusted
        if markers is None:
            if selection.people_superseded(cls.mode):
                # Behind IAP people come with a signed assertion; an unsigned signed-in-user header alone is no one.
                return cls(trusted_markers=frozenset(APPENGINE_MARKERS) - {"admin"})
            return cls()
        unknown = sorted(markers - set(APPENGINE_MARKERS))
        if unknown or not markers:
            raise AuthConfigError(
                f"DEDUP_APPENGINE_TRUSTED: unknown or no markers {unknown}; choose from {', '.join(APPENGINE_MARKERS)}"
            )
        return cls(trusted_markers=markers)

    @property
    def wanted(self) -> str:
        return "App Engine's cron, task queue or Cloud Scheduler markers" + (
            ", or an admin signed in behind login: admin" if "admin" in self.trusted_markers else ""
        )

    def identify(self, headers: RequestHeaders) -> Principal | None:
        trusted = self.trusted_markers
        try:  # trusted or not, markers beside a signed-in user are refused (the library's rule)
            caller = internal_caller(headers, trusted)
        except MarkersForged as forged:
            raise ForbiddenEvidence(forged.reason) from None
        if caller is not None:
            return Principal(name=f"appengine:{caller}", granted=frozenset({Role.DELIVER}))
        if "admin" in trusted and headers.get("X-Appengine-User-Is-Admin") == "1":
            # A person, named by unsigned headers: beside a mode that supersedes them (iap) the gate ignores it.
            email = normal_email(headers.get("X-Appengine-User-Email", ""))
            if email is not None:
                return Principal.person(email, admitted=True)
        return None

    def trusts_forgeable_headers(self, on_app_engine: bool) -> bool:
        # Off App Engine nothing strips client-sent X-Appengine-* markers (the signed-in user's among them).
        return not on_app_engine
