"""The window an operator's page describes: the last 24 hours, last night, or a range of days.

Every view of the home page (the rows, the cards, the timeline, the runs list) counts and lists
the same window and says which, so no two figures on one page describe different stretches of
time (issue 39 §5).  "Last night" is the latest night that has ended, by ``DEDUP_NIGHT``: its
hours and the operator's time zone (``22:00-07:00 UTC`` unless set), so at 09:00 it is the night
just gone, whatever the jobs' own zones.  A range is whole days of that zone, at most
MAX_WINDOW_DAYS of them.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Mapping
from typing import Any

from schedules.config import schedule_zone
from service.errors import Invalid

UTC = datetime.UTC
DAY = datetime.timedelta(days=1)
MAX_WINDOW_DAYS = 7  # a range's days at most: a per-minute job's week is 10,080 slots a row
WINDOWS = ("24h", "night", "range")
DEFAULT_NIGHT = "22:00-07:00 UTC"
_NIGHT = re.compile(r"([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]|24):([0-5]\d)(?:\s+(\S+))?")


@dataclasses.dataclass(frozen=True)
class Night:
    """When night is for the operators (``DEDUP_NIGHT``): its start and end, and their time zone."""

    starts: datetime.time
    ends: datetime.time
    zone_name: str = "UTC"

    @classmethod
    def parse(cls, text: str) -> Night:
        """``HH:MM-HH:MM [ZONE]``, such as ``22:00-07:00 Europe/Berlin``; ValueError saying what is wrong."""
        found = _NIGHT.fullmatch(text.strip())
        if found is None:
            raise ValueError(f"{text!r} is not HH:MM-HH:MM with an optional IANA time zone, such as {DEFAULT_NIGHT!r}")
        start_hour, start_minute, end_hour, end_minute, zone = found.groups()
        ends = datetime.time(0, 0) if end_hour == "24" and end_minute == "00" else None
        if end_hour == "24" and ends is None:
            raise ValueError(f"{text!r}: 24 is only 24:00")
        starts = datetime.time(int(start_hour), int(start_minute))
        ends = ends if ends is not None else datetime.time(int(end_hour), int(end_minute))
        if starts == ends:
            raise ValueError(f"{text!r}: a night starts and ends at different times")
        zone_name = zone or "UTC"
        try:
            schedule_zone(zone_name)
        except Exception:
            raise ValueError(f"{text!r}: {zone_name!r} is not an IANA time zone") from None
        return cls(starts, ends, zone_name)

    @property
    def zone(self) -> Any:
        return schedule_zone(self.zone_name)

    def last(self, now: datetime.datetime) -> tuple[datetime.datetime, datetime.datetime]:
        """The latest night that has ended at or before ``now``, [since, until) in UTC."""
        zone = self.zone
        today = now.astimezone(zone).date()
        for days_back in range(0, 3):
            end_day = today - datetime.timedelta(days=days_back)
            end = datetime.datetime.combine(end_day, self.ends, zone)
            start_day = end_day if self.starts < self.ends else end_day - DAY
            start = datetime.datetime.combine(start_day, self.starts, zone)
            if end.astimezone(UTC) <= now:
                return start.astimezone(UTC), end.astimezone(UTC)
        raise AssertionError("a night ends within two days")  # pragma: no cover

    def hours(self) -> str:
        return f"{self.starts:%H:%M} to {self.ends:%H:%M} {self.zone_name}"


@dataclasses.dataclass(frozen=True)
class Window:
    """[since, until) in UTC, what it is called, and the query that names it (for every link)."""

    kind: str  # one of WINDOWS
    since: datetime.datetime
    until: datetime.datetime
    words: str  # what the page says it shows
    fields: Mapping[str, str]  # the query fields that name it ({} for the default)

    def counted_until(self, now: datetime.datetime) -> datetime.datetime:
        """Where the counts stop: the window's end, or now if it has not come (later slots are upcoming)."""
        return min(self.until, now + datetime.timedelta(microseconds=1))

    @property
    def span(self) -> datetime.timedelta:
        return self.until - self.since


def window_of(query: Mapping[str, str], night: Night, now: datetime.datetime) -> Window:
    """The window ``query`` names (``window``: 24h, night or range with ``first`` and ``last``, days
    of the night's zone), checked: Invalid says what is wrong."""
    kind = query.get("window") or "24h"
    if kind not in WINDOWS:
        raise Invalid(f"window must be one of {', '.join(WINDOWS)}, not {kind[:40]!r}")
    if kind == "24h":
        # (now - 24 h, now]: a 5-minute job's 288 slots, the one 24 hours ago no longer among them.
        tick = datetime.timedelta(microseconds=1)
        return Window(kind, now - DAY + tick, now + tick, "the last 24 hours", {})
    if kind == "night":
        since, until = night.last(now)
        local = since.astimezone(night.zone)
        words = f"last night, {local:%a %Y-%m-%d} {night.hours()}"
        return Window(kind, since, until, words, {"window": "night"})
    first, last = _day(query, "first"), _day(query, "last")
    if last < first:
        raise Invalid("last must be the same day as first or after it")
    if (last - first).days + 1 > MAX_WINDOW_DAYS:
        raise Invalid(f"a range is at most {MAX_WINDOW_DAYS} days")
    zone = night.zone
    since = datetime.datetime.combine(first, datetime.time(0), zone).astimezone(UTC)
    until = datetime.datetime.combine(last + DAY, datetime.time(0), zone).astimezone(UTC)
    span = first.isoformat() if first == last else f"{first.isoformat()} to {last.isoformat()}"
    fields = {"window": "range", "first": first.isoformat(), "last": last.isoformat()}
    return Window(kind, since, until, f"{span} ({night.zone_name})", fields)


def _day(query: Mapping[str, str], name: str) -> datetime.date:
    text = query.get(name) or ""
    try:
        day = datetime.date.fromisoformat(text) if len(text) == 10 and text.isascii() else None
    except ValueError:
        day = None
    if day is None or not 2000 <= day.year < 2100:
        raise Invalid(f"{name} must be a day such as 2030-01-07, from 2000 to 2099, not {text[:40]!r}")
    return day
