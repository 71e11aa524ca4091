"""The stretch of a job's history a page shows (a day of its zone, or an hour of it), read from
the request once for the history page and its bulk run, and the slots a bulk run takes."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

from flask import abort, request

from dedup.keys import EARLIEST_SCHEDULE_TIME, LATEST_SCHEDULE_TIME
from handlers.request_times import BadTime, request_time
from handlers.slot_statuses import RUNS_IN_BULK
from schedules.bound import BoundJob
from schedules.config import schedule_zone
from service.slots import schedules_of

HISTORY_PAGE = 288  # a day of a 5-minute job, slot by slot; a day with more is shown by the hour
# A history's total, its status listing and its bulk run cover this much of a range (a per-minute
# job's 8 days: 11,520 slots, service.hours.WINDOW_SLOTS).
COUNTED_DAYS = datetime.timedelta(days=8)
DAYS = datetime.timedelta(days=1)


# The slots a history page offers to run in bulk (each under its own key), and at most how many at once:
# a 5-minute job's day (a per-minute job's night of failures in one confirmation, a bad day in five).
BULK_STATUSES = RUNS_IN_BULK  # handlers/slot_statuses.py
BULK_LIMIT = 288


def bulk_slots(executions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The missed and failed slots of a listing, the newest BULK_LIMIT of them."""
    return [e for e in executions if e["status"] in BULK_STATUSES][-BULK_LIMIT:]


@dataclasses.dataclass(frozen=True)
class HistoryRange:
    """The stretch a history page (and its bulk run) shows: a day of the job's zone, an hour of
    it, or any ``since``/``until`` range, from ``from=`` on (its next page)."""

    scheduler_jobs: list[BoundJob]
    zone_name: str
    zone: Any
    day: datetime.date
    hour: int | None
    since: datetime.datetime
    until: datetime.datetime
    # The query that names the range (day and hour, or since and until, and the Scheduler job
    # chosen): for its links.
    where: dict[str, str | int | None] = dataclasses.field(default_factory=dict)
    # Where the range starts (``since`` is where this page of it starts: ``from=``).
    start: datetime.datetime | None = None

    @property
    def range_start(self) -> datetime.datetime:
        return self.start or self.since

    @property
    def ranged(self) -> bool:
        """A since/until range: paged through, never counted by the hour."""
        return "since" in self.where

    def by_the_hour(self, more_than_a_page: bool) -> bool:
        """Whether the page shows this range hour by hour (counts, no slots): a day, not one of its
        hours, holding more slots than a page.  The history page and the bulk run both ask this."""
        return more_than_a_page and self.hour is None and not self.ranged

    def link_fields(self, page_from: str | None) -> dict[str, Any]:
        """The query that shows this page again: its range and where the page starts."""
        return {**self.where, "from": page_from}


MAX_RANGE = datetime.timedelta(days=31)


def history_range(state: Any, job_id: str) -> HistoryRange:
    """``day`` and ``hour`` (or ``since`` and ``until``) and ``from`` of the request, checked (400s)
    and in UTC; 404 for no such job."""
    scheduler_jobs = schedules_of(state, job_id)  # 404: no such job, or no scheduler.yaml
    chosen = request.args.get("scheduler_job") or None
    picked: dict[str, str | int | None] = {}
    if chosen is not None:  # one Scheduler job's slots: a home row's counts link here
        # Its scope too, where given: one name may be declared in several projects or locations.
        scope = {name: request.args.get(name) or None for name in ("project", "location")}
        scheduler_jobs = [
            job
            for job in scheduler_jobs
            if job.declared.name == chosen
            and scope["project"] in (None, job.declared.project)
            and scope["location"] in (None, job.declared.location)
        ]
        if not scheduler_jobs:
            abort(404, f"no Scheduler job named {chosen[:200]!r} (in the scope given) targets job {job_id!r}")
        picked = {"scheduler_job": chosen, **{name: value for name, value in scope.items() if value}}
    zone_name = scheduler_jobs[0].declared.time_zone if scheduler_jobs else "UTC"
    zone = schedule_zone(zone_name)
    if request.args.get("since") or request.args.get("until"):
        since, until = _since_until()
        where: dict[str, str | int | None] = {
            "since": request.args["since"],
            "until": request.args["until"],
            **picked,
        }
        return HistoryRange(
            scheduler_jobs, zone_name, zone, since.astimezone(zone).date(), None, _from(since), until, where, since
        )
    now = state.clock.now()
    try:
        day = (
            datetime.date.fromisoformat(request.args["day"]) if request.args.get("day") else now.astimezone(zone).date()
        )
    except ValueError:
        abort(400, f"day {request.args['day']!r} is not a date such as 2030-01-01")
    # The days a schedule time may fall on: none of the date arithmetic below can leave years 1 to 9999.
    if not EARLIEST_SCHEDULE_TIME.date() <= day < LATEST_SCHEDULE_TIME.date():
        abort(400, f"day {day.isoformat()} is outside the schedule times kept, 2000-01-01 up to 2100-01-01")
    hour_text = request.args.get("hour")
    # ASCII digits only: str.isdigit() passes "²", which int() refuses, and 5,000 digits, which it cannot read.
    whole_hour = hour_text is not None and len(hour_text) <= 2 and hour_text.isascii() and hour_text.isdigit()
    if hour_text is not None and not (whole_hour and int(hour_text) <= 23):
        abort(400, f"hour {hour_text!r} is not a whole number from 0 to 23")
    hour = int(hour_text) if hour_text is not None else None
    start = datetime.datetime.combine(day, datetime.time(hour or 0), zone)
    end = start + (datetime.timedelta(hours=1) if hour is not None else DAYS)
    # The first and last days kept, in a zone east or west of UTC, reach past the keyable range: cut there.
    since = max(start.astimezone(datetime.UTC), EARLIEST_SCHEDULE_TIME)
    until = min(end.astimezone(datetime.UTC), LATEST_SCHEDULE_TIME)
    where = {"day": day.isoformat(), "hour": hour, **picked}
    return HistoryRange(scheduler_jobs, zone_name, zone, day, hour, _from(since), until, where, since)


def _since_until() -> tuple[datetime.datetime, datetime.datetime]:
    if not (request.args.get("since") and request.args.get("until")):
        abort(400, "since and until go together: RFC 3339 times, such as 2030-01-01T00:00:00Z")
    since, until = _time("since"), _time("until")
    if not since < until <= since + MAX_RANGE:
        abort(400, f"until must come after since, by at most {MAX_RANGE.days} days")
    return since, until


def _from(since: datetime.datetime) -> datetime.datetime:
    """``from=``: where the next page of a range that holds more than one starts."""
    if not request.args.get("from"):
        return since
    return max(since, _time("from"))


def _time(field: str) -> datetime.datetime:
    """The query's ``field``, a time within the bounds every request's time keeps (else 400)."""
    try:
        return request_time(field, request.args[field])
    except BadTime as bad:
        abort(400, bad.message)
