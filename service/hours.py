"""A range's slots counted by the hour: what a job's history shows for a day of more slots than a page.

A job behind thousands of Scheduler jobs has millions of slots a day.  Each slot's status comes
from its Scheduler job's day summaries where they speak for it (schedules.summaries: three
entities a Scheduler job), else from its record.  The records read are capped at HOUR_LOOKUPS,
what a home page of rows may read: past it, a Scheduler job's slots that lack a summary are
counted ``unread``, not guessed, and the page says how many and where each job's own row is.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

from schedules.bound import BoundJob
from schedules.config import history_id
from schedules.slots import RunFacts, Slot, shown_status, slots_between
from schedules.summaries import days_between, summaries_of
from service.state import AppState

# The records one count reads at most: a home page's 25 rows of 288 slots each (handlers.job_rows).
HOUR_LOOKUPS = 25 * 288
UNREAD = "unread"  # a slot counted without its status: its record was past HOUR_LOOKUPS
DAY_SLOTS = 24 * 60  # the most a day holds: a per-minute cron's
CLOCK_SKEW_SECONDS = 60
RANGE_DAYS = 2  # a history range is a day of its time zone (or an hour of it): two UTC days at most


@dataclasses.dataclass(frozen=True)
class HourCounts:
    """Each hour's slots by status (``hours``: hour, counts), and what went unread."""

    hours: list[dict[str, Any]]
    unread_slots: int  # counted UNREAD
    unread_jobs: int  # the Scheduler jobs they belong to
    lookups: int  # the records a count reads at most (HOUR_LOOKUPS)


def hour_counts(
    state: AppState,
    scheduler_jobs: Sequence[BoundJob],
    since: datetime.datetime,
    until: datetime.datetime,
    zone: Any,
) -> HourCounts:
    """The slots of [since, until) counted by hour of ``zone`` and by status, in two lookups
    whatever their number; a Scheduler job whose slots lacking a summary would take the records
    read past HOUR_LOOKUPS has them counted UNREAD (whole jobs: a job's count is never half read)."""
    now = state.clock.now()
    # A slot this far ahead has no record, whatever the clocks of the instances that deliver it.
    ahead = now + datetime.timedelta(seconds=CLOCK_SKEW_SECONDS)
    ids = [history_id(job.declared) for job in scheduler_jobs]
    summaries = summaries_of(state.ledger.store(), ids, days_between(since, until - datetime.timedelta(microseconds=1)))
    counts: dict[int, dict[str, int]] = {}

    def count(slot: Slot, status: str) -> None:
        hour = slot.schedule_time.astimezone(zone).hour
        counts.setdefault(hour, {})
        counts[hour][status] = counts[hour].get(status, 0) + 1

    def counted(slot: Slot, facts: RunFacts | None) -> None:
        count(slot, str(shown_status(slot, facts, now)))

    # A job at a time (a range's slots of thousands of Scheduler jobs are never all held at once);
    # the slots the summaries do not speak for are kept, and looked up together.
    unspoken: list[Slot] = []
    unread_slots = unread_jobs = 0
    for job, summary in zip(scheduler_jobs, summaries, strict=True):
        lacking = []
        for slot in slots_between([job], since, until, DAY_SLOTS * RANGE_DAYS):
            digest = summary.facts_of(slot, now)
            if digest is not None:
                counted(slot, digest)
            elif slot.schedule_time > ahead:  # upcoming: no delivery can have come yet, nothing to read
                counted(slot, None)
            else:
                lacking.append(slot)
        if len(unspoken) + len(lacking) <= HOUR_LOOKUPS:
            unspoken += lacking
        elif lacking:
            unread_slots, unread_jobs = unread_slots + len(lacking), unread_jobs + 1
            for slot in lacking:
                count(slot, UNREAD)
    records = state.ledger.lookup_many([slot.run_id for slot in unspoken])
    for slot in unspoken:
        counted(slot, records.get(slot.run_id))
    hours = [{"hour": hour, "counts": dict(sorted(counts[hour].items()))} for hour in sorted(counts)]
    return HourCounts(hours, unread_slots, unread_jobs, HOUR_LOOKUPS)
