"""The intervals a Scheduler job's run-time state is made of: its pauses and its earlier schedules.

Each is a span of time the app learned about a job after reading scheduler.yaml (schedules.bound).
Below schedules/config.py, so the run-time type can hold them typed, with no import cycle.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from dedup.keys import format_utc, parse_rfc3339


@dataclasses.dataclass(frozen=True)
class Pause:
    """One interval a Scheduler job was paused: [since, until), ``until`` None while it lasts."""

    since: datetime.datetime
    paused_by: str
    note: str | None = None
    until: datetime.datetime | None = None
    resumed_by: str | None = None
    # Its slots the audit left to the resume (schedules.pauses.left_paused) have been counted
    # ``paused``: once, by the resume whose catch-up was dispatched, or by the audit for a pause
    # nobody caught up (ended by scheduler.yaml, or a resume whose catch-up never went out).
    counted: bool = False

    def covers(self, instant: datetime.datetime) -> bool:
        return self.since <= instant and (self.until is None or instant < self.until)

    def document(self) -> dict[str, Any]:
        """The pause as the API and the pages show it."""
        return {
            "since": format_utc(self.since),
            "paused_by": self.paused_by,
            "note": self.note,
            "until": format_utc(self.until) if self.until else None,
            "resumed_by": self.resumed_by,
        }

    def stored(self) -> dict[str, Any]:
        """The pause as its job's SchedulePauses entity keeps it (``from_document`` reads either)."""
        return {**self.document(), "counted": self.counted}

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> Pause:
        until = document.get("until")
        return cls(
            since=parse_rfc3339(document["since"], "since"),
            paused_by=document["paused_by"],
            note=document.get("note"),
            until=parse_rfc3339(until, "until") if until else None,
            resumed_by=document.get("resumed_by"),
            # Kept before ``counted`` was: an ended pause was counted by its resume then.
            counted=document["counted"] is True if "counted" in document else until is not None,
        )


@dataclasses.dataclass(frozen=True)
class EarlierSchedule:
    """A schedule a Scheduler job had before its current one, and when it applied: [since, until)."""

    schedule: str
    time_zone: str
    since: datetime.datetime
    until: datetime.datetime
