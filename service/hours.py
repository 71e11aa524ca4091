"""A window's slots judged, with capped reads: what a home row, a job's card, a history's hours
and a status listing count, whatever the frequency of the jobs.

A job behind thousands of Scheduler jobs has millions of slots a day.  Each slot's status comes
from its Scheduler job's day summaries where they speak for it (schedules.summaries: three
entities a Scheduler job), else from its record.  The records read are capped at HOUR_LOOKUPS,
what a home page of rows may read: past it, a Scheduler job's slots that lack a summary are
counted ``unread``, not guessed, and the page says how many and where each job's own row is.
Every slot of the window is counted, so the counts always add up to the slots expected.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import Counter
from collections.abc import Sequence
from typing import Any

from schedules.bound import BoundJob
from schedules.config import history_id
from schedules.slots import Slot, shown_status, slots_between
from schedules.summaries import JobSummaries, days_between, summaries_of
from service.state import AppState
from service.window import MAX_WINDOW_DAYS

# The records one count reads at most: a home page's 25 rows of a 5-minute job's day each.
HOUR_LOOKUPS = 25 * 288
UNREAD = "unread"  # a slot counted without its status: its record was past HOUR_LOOKUPS
DAY_SLOTS = 24 * 60  # the most a day holds: a per-minute cron's
CLOCK_SKEW_SECONDS = 60
WINDOW_SLOTS = DAY_SLOTS * (MAX_WINDOW_DAYS + 1)  # a window's slots of one Scheduler job, at most
# The slots one count judges at most, whatever the fleet (about a second of CPU and their objects'
# memory): past it, whole Scheduler jobs are left uncounted, and the page says how many.
SLOT_BUDGET = 100_000


@dataclasses.dataclass
class JudgedJob:
    """One Scheduler job's slots of a window, oldest first, each with its shown status (UNREAD when
    its record went unread) and its run's attempt (None: no run, or unread)."""

    job: BoundJob
    summaries: JobSummaries
    slots: list[Slot]
    statuses: list[str]
    attempts: list[int | None]
    looked_up: int = 0  # the records read for it (its slots the summaries did not speak for)
    counted: bool = True  # False: past the count's SLOT_BUDGET, its slots were not judged (none listed)

    @property
    def unread(self) -> int:
        return self.statuses.count(UNREAD)

    def counts(self) -> Counter[str]:
        """Its slots by status: they add up to its slots."""
        return Counter(self.statuses)


def judged_slots(
    state: AppState,
    scheduler_jobs: Sequence[BoundJob],
    since: datetime.datetime,
    until: datetime.datetime,
    lookups: int | None = None,
) -> list[JudgedJob]:
    """Every slot of [since, until) of each Scheduler job, judged, in two lookups whatever their
    number: their summaries, then the records of the slots those do not speak for.  A Scheduler
    job whose slots lacking a summary would take the records read past ``lookups`` (HOUR_LOOKUPS)
    has them judged UNREAD (whole jobs: a job's count is never half read)."""
    cap = HOUR_LOOKUPS if lookups is None else lookups
    budget, used = SLOT_BUDGET, 0
    now = state.clock.now()
    # A slot this far ahead has no record, whatever the clocks of the instances that deliver it.
    ahead = now + datetime.timedelta(seconds=CLOCK_SKEW_SECONDS)
    ids = [history_id(job.declared) for job in scheduler_jobs]
    days = days_between(since, until - datetime.timedelta(microseconds=1))
    summaries = summaries_of(state.ledger.store(), ids, days)
    judged: list[JudgedJob] = []
    unspoken: list[tuple[JudgedJob, int]] = []
    for job, summary in zip(scheduler_jobs, summaries, strict=True):
        slots = slots_between([job], since, until, min(WINDOW_SLOTS, budget - used + 1)) if used < budget else []
        if used >= budget or used + len(slots) > budget:  # a whole job, or none of it
            used = budget
            judged.append(JudgedJob(job, summary, [], [], [], counted=False))
            continue
        used += len(slots)
        found = JudgedJob(job, summary, slots, [""] * len(slots), [None] * len(slots))
        lacking = []
        for index, slot in enumerate(slots):
            digest = summary.facts_of(slot, now)
            if digest is not None:
                found.statuses[index], found.attempts[index] = str(shown_status(slot, digest, now)), digest.attempt
            elif slot.schedule_time > ahead:  # upcoming: no delivery can have come yet, nothing to read
                found.statuses[index] = str(shown_status(slot, None, now))
            else:
                lacking.append(index)
        if len(unspoken) + len(lacking) <= cap:
            unspoken += [(found, index) for index in lacking]
        else:
            for index in lacking:
                found.statuses[index] = UNREAD
        judged.append(found)
    records = state.ledger.lookup_many([found.slots[index].run_id for found, index in unspoken])
    for found, index in unspoken:
        found.looked_up += 1
        slot = found.slots[index]
        record = records.get(slot.run_id)
        found.statuses[index] = str(shown_status(slot, record, now))
        found.attempts[index] = record.attempt if record is not None else None
    return judged


@dataclasses.dataclass(frozen=True)
class HourCounts:
    """Each hour's slots by status (``hours``: hour, counts), and what went unread."""

    hours: list[dict[str, Any]]
    unread_slots: int  # counted UNREAD
    unread_jobs: int  # the Scheduler jobs they belong to
    lookups: int  # the records a count reads at most (HOUR_LOOKUPS)
    uncounted_jobs: int = 0  # Scheduler jobs past the count's SLOT_BUDGET: not in any hour

    @property
    def total(self) -> dict[str, int]:
        """The range's slots by status, every hour's added."""
        summed: Counter[str] = Counter()
        for hour in self.hours:
            summed.update(hour["counts"])
        return dict(sorted(summed.items()))


def hour_counts(
    state: AppState,
    scheduler_jobs: Sequence[BoundJob],
    since: datetime.datetime,
    until: datetime.datetime,
    zone: Any,
) -> HourCounts:
    """The slots of [since, until) counted by hour of ``zone`` and by status (``judged_slots``)."""
    return count_hours(judged_slots(state, scheduler_jobs, since, until), zone)


def count_hours(judged: Sequence[JudgedJob], zone: Any) -> HourCounts:
    """Judged slots counted by hour of ``zone`` (each hour with its day: a range spans several)."""
    counts: dict[tuple[datetime.date, int], Counter[str]] = {}
    for found in judged:
        for slot, status in zip(found.slots, found.statuses, strict=True):
            local = slot.schedule_time.astimezone(zone)
            counts.setdefault((local.date(), local.hour), Counter())[status] += 1
    hours = [
        {"day": day.isoformat(), "hour": hour, "counts": dict(sorted(counts[(day, hour)].items()))}
        for day, hour in sorted(counts)
    ]
    unread = [found.unread for found in judged if found.unread]
    uncounted = sum(1 for found in judged if not found.counted)
    return HourCounts(hours, sum(unread), len(unread), HOUR_LOOKUPS, uncounted)


@dataclasses.dataclass(frozen=True)
class StatusPage:
    """A page of the slots of one status (``slots``: slot, attempt), oldest first, with the total of
    the range scanned, where the next page starts, and how many went unread (never listed)."""

    slots: list[tuple[Slot, int | None]]
    total: int
    next_from: datetime.datetime | None
    unread: int


def in_status(judged: Sequence[JudgedJob], status: str, page_from: datetime.datetime, limit: int) -> StatusPage:
    """The slots of ``judged`` in ``status``, at or after ``page_from``, ``limit`` at most; a page
    ends before a time the limit cut into, so a time shared by several Scheduler jobs is never split."""
    found = sorted(
        (
            (slot, attempt)
            for one in judged
            for slot, shown, attempt in zip(one.slots, one.statuses, one.attempts, strict=True)
            if shown == status
        ),
        key=lambda item: (item[0].schedule_time, item[0].job.name, item[0].job.project, item[0].job.location),
    )
    unread = sum(one.unread for one in judged)
    after = [item for item in found if item[0].schedule_time >= page_from]
    if len(after) <= limit:
        return StatusPage(after, len(found), None, unread)
    next_time = after[limit][0].schedule_time
    kept = [item for item in after[:limit] if item[0].schedule_time < next_time]
    if not kept:  # more than a page share one time: that time whole
        kept = [item for item in after if item[0].schedule_time == next_time]
        later = [item for item in after if item[0].schedule_time > next_time]
        return StatusPage(kept, len(found), later[0][0].schedule_time if later else None, unread)
    return StatusPage(kept, len(found), next_time, unread)
