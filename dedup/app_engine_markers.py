"""Who called, as App Engine itself says: the ``X-Appengine-*`` markers its front end sets on its
own requests (Cloud Scheduler's App Engine-target deliveries, Cloud Tasks, cron) and strips from
everyone else's.

Two limits decide where they count (production-and-adoption-facts.md, "App Engine markers"):
- only on App Engine: anywhere else a client can send them, so ``AppEngineCallers`` refuses to
  be made off App Engine (``GAE_ENV`` not ``standard``) unless told that the process is a test;
- only with no one signed in: App Engine passes a signed-in admin's own ``X-AppEngine-*``
  headers on, for testing (a project Viewer can be one), as Google's nomulus concluded.

The app's ``appengine`` mode (handlers/auth/appengine.py) reads the same markers through here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol

from dedup.environment import on_app_engine


class Headers(Protocol):
    """The headers read: Werkzeug's ``Headers``, or ``dedup.callers.FoldedHeaders`` of a mapping."""

    def get(self, key: str, /) -> str | None: ...


@dataclasses.dataclass(frozen=True)
class InternalMarker:
    """A header App Engine sets on its own requests, and the value that marks one."""

    header: str
    value: str | None = None  # None: any value (compared without regard to case)

    def sent_in(self, headers: Headers) -> bool:
        sent = headers.get(self.header)
        return bool(sent) and (self.value is None or str(sent).lower() == self.value)

    def __str__(self) -> str:
        return self.header if self.value is None else f"{self.header}: {self.value}"


# The internal callers' markers, by the names DEDUP_APPENGINE_TRUSTED and AppEngineCallers take.
INTERNAL_MARKERS = {
    "cron": InternalMarker("X-Appengine-Cron", "true"),
    "queue": InternalMarker("X-AppEngine-QueueName"),
    # Observed on Cloud Scheduler's App Engine-target deliveries (and cron, tasks); not documented.
    "ip:0.1.0.2": InternalMarker("X-Appengine-User-Ip", "0.1.0.2"),
    "ip:0.1.0.1": InternalMarker("X-Appengine-User-Ip", "0.1.0.1"),
}
# Set beside the queue's name on a task: it names no caller, but no signed-in user sends it either.
TASK_NAME = InternalMarker("X-AppEngine-TaskName")
SIGNED_IN_USER = "X-Appengine-User-Email"


def is_signed_in(headers: Headers) -> bool:
    """Whether a user is signed in (dev_appserver sends the header empty when no one is)."""
    return bool((headers.get(SIGNED_IN_USER) or "").strip())


def from_task_queue(headers: Headers) -> bool:
    """Whether App Engine's task queue sent the request: its queue's name, and no one signed in."""
    return INTERNAL_MARKERS["queue"].sent_in(headers) and not is_signed_in(headers)


def signed_in_markers(headers: Headers) -> str | None:
    """Why the request is refused: internal markers beside a signed-in user (None: there are none)."""
    sent = [str(marker) for marker in (*INTERNAL_MARKERS.values(), TASK_NAME) if marker.sent_in(headers)]
    if not sent or not is_signed_in(headers):
        return None
    return (
        f"{' and '.join(sent)} came with a signed-in user ({SIGNED_IN_USER}): App Engine passes a signed-in "
        "admin's own X-AppEngine-* headers on, so its internal markers count only with no one signed in"
    )


class MarkersForged(Exception):
    """Internal markers beside a signed-in user: refused, whatever else the request carries."""

    @property
    def reason(self) -> str:
        return str(self.args[0])


def internal_caller(headers: Headers, trusted: Iterable[str]) -> str | None:
    """The name of the first ``trusted`` marker the request carries (None: none does).  Raises
    ``MarkersForged`` for markers beside a signed-in user, trusted or not."""
    refusal = signed_in_markers(headers)
    if refusal is not None:
        raise MarkersForged(refusal)
    return next(
        (name for name, marker in INTERNAL_MARKERS.items() if name in trusted and marker.sent_in(headers)), None
    )


NOT_FROM_APP_ENGINE = (
    "the request carries none of App Engine's own markers (Cloud Scheduler's App Engine target, Cloud Tasks, "
    "cron): only App Engine's own requests are admitted"
)


@dataclasses.dataclass(frozen=True)
class AppEngineCallers:
    """The callers a handler on App Engine admits: App Engine's own requests, by the ``trusted``
    markers (all of ``INTERNAL_MARKERS`` by default).  ``off_app_engine_for_tests``: made off App
    Engine anyway, where anyone can send the markers; for a test, never a deployment."""

    trusted: frozenset[str] = frozenset(INTERNAL_MARKERS)
    off_app_engine_for_tests: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.trusted) - set(INTERNAL_MARKERS))
        if unknown or not self.trusted:
            raise ValueError(f"unknown or no App Engine markers {unknown}: choose from {', '.join(INTERNAL_MARKERS)}")
        if not (self.off_app_engine_for_tests or on_app_engine()):
            raise ValueError(
                "AppEngineCallers trusts X-Appengine-* headers, which only App Engine strips from client "
                "requests; here (GAE_ENV is not standard) anyone can send them: use dedup.callers.Callers "
                "(the Scheduler job's OIDC token) instead"
            )

    def refusal(self, headers: Headers) -> tuple[int, str, str] | None:
        """None for App Engine's own request; else 403 and why (nothing is recorded)."""
        try:
            caller = internal_caller(headers, self.trusted)
        except MarkersForged as forged:
            return 403, "Forbidden", forged.reason
        return None if caller is not None else (403, "Forbidden", NOT_FROM_APP_ENGINE)
