"""Expected executions: each slot of a Scheduler job's cron, the run id its delivery would have, and its status.

Every slot's key is deterministic (the Scheduler job id, the schedule time
and the scope the delivery carries), so the app can tell, without any
delivery arriving, which executions happened, which are still inside their
retry window, and which were missed.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import heapq
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from croniter import croniter

from dedup.keys import CLOCK_SKEW_SECONDS, ScheduledRunKey, ahead_of_its_time, format_utc, scheduled_run_key
from models import RunRecord, RunSource, RunStatus
from schedules.bound import BoundJob
from schedules.config import (
    DELIVERY_GRACE_SECONDS,
    ExclusionWindow,
    SchedulerJob,
    delivery_scope,
    retry_window_seconds,
    schedule_zone,
)
from schedules.intervals import Pause

# The most slots one answer lists (a job every minute: 16 hours of them).
MAX_SLOTS = 1000
UTC = datetime.UTC


class ExecutionStatus(enum.StrEnum):
    """What became of an expected execution (the run's own status where there is a run)."""

    COMPLETED = RunStatus.COMPLETED
    FAILED = RunStatus.FAILED
    IN_PROGRESS = RunStatus.IN_PROGRESS
    RELEASED = RunStatus.RELEASED
    SKIPPED = RunStatus.SKIPPED
    DUE = "due"
    MISSED = "missed"
    UPCOMING = "upcoming"
    # No record, and any record the slot had would have expired by now: it may have run.
    UNKNOWN = "unknown"
    # A run of another job holds the slot's key (a misrouted delivery): the slot's own job
    # never ran, and only an operator can sort it out.
    CONFLICT = "conflict"
    # No run, or none that can still finish, and the slot lies in an interval its Scheduler job was
    # paused (schedules.pauses): nothing was to be delivered, so it is not missed.
    PAUSED = "paused"
    # The job's finish_within passed: ``late`` completed after it, ``overdue`` has not completed
    # (listed so; the run's own status stays what it is).
    LATE = "late"
    OVERDUE = "overdue"
    # No record, and the slot is before its Scheduler job's slots are expected from (schedules.history): the
    # app did not know the schedule then, so the slot was never expected of it.
    UNTRACKED = "untracked"
    # The slot lies in one of its Scheduler job's exclusion windows (scheduler.yaml's exclude:
    # planned downtime): not expected, never reported; a delivery of it is skipped, not run.
    EXCLUDED = "excluded"
    # A compacted catch-up's run (``catch_up: compact``, ``misfire: compact``) stands for the slot:
    # its record, skipped, names that run (``compacted_into``), and the slot never runs on its own.
    COVERED = "covered"
    # A run holds the slot: its attempt started, its lease ran out and it never finished.  Not
    # ``missed``: the attempt may have called downstream before it died, so running the slot again
    # needs an operator's acknowledgement (NEEDS_FORCE).  While the retry window is open the next
    # delivery takes it over; after that it stays stuck until someone runs it or it expires.
    STUCK = "stuck"


# What makes a Scheduler job need an operator's attention: its home row counts these over its
# last 24 hours and sorts first, and the audit indexes its mark by them (``attention_until``).
# handlers/slot_statuses.py orders and draws them, and refuses to load if its table disagrees.
NEEDS_ATTENTION = frozenset(
    {
        ExecutionStatus.MISSED,
        ExecutionStatus.FAILED,
        ExecutionStatus.LATE,
        ExecutionStatus.OVERDUE,
        ExecutionStatus.STUCK,
    }
)

# What an operator may run again by hand (the dashboard's run, dedupctl backfill); an unknown,
# untracked or stuck slot only when forced (acknowledged), since it may have run or taken effect.
RUNNABLE = (
    ExecutionStatus.EXCLUDED,
    ExecutionStatus.MISSED,
    ExecutionStatus.STUCK,
    ExecutionStatus.PAUSED,
    ExecutionStatus.FAILED,
    ExecutionStatus.RELEASED,
    ExecutionStatus.SKIPPED,
    ExecutionStatus.UNKNOWN,
    ExecutionStatus.UNTRACKED,
)
NEEDS_FORCE = (ExecutionStatus.UNKNOWN, ExecutionStatus.UNTRACKED, ExecutionStatus.STUCK)


class RunFacts(Protocol):
    """What a slot's status needs of its run: a RunRecord, or a day summary's digest of one
    (schedules.summaries), which then gives the status the record would."""

    @property
    def job_id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def finished(self) -> datetime.datetime | None: ...

    @property
    def compacted_into(self) -> str | None: ...

    def lease_is_live(self, now: datetime.datetime) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Slot:
    """One expected execution of a Scheduler job."""

    job: SchedulerJob  # as scheduler.yaml said at the slot's time (the schedule it had then)
    schedule_time: datetime.datetime  # aware, UTC
    # What the app learned of the job (retention, expected from, pauses); None: nothing, as of a
    # file read alone (no horizon, expected, never paused).
    bound: BoundJob | None = None

    @functools.cached_property
    def run_id(self) -> str:
        """Exactly the run id a Scheduler delivery of this slot gets (handlers/scheduler.py).
        Computed once a slot: a page asks it of each slot for its lookup, its documents and its links."""
        project, location = delivery_scope(self.job)
        return scheduled_run_key(
            self.job.name, format_utc(self.schedule_time), query_project=project, query_location=location
        ).run_id

    @property
    def window_closes(self) -> datetime.datetime:
        """When no delivery of this slot can arrive any more: every attempt and retry, however late.

        Google's pages disagree on whether retries stop at the next slot or run
        through it; this takes the later bound (schedules.config.retry_window_seconds).
        """
        seconds = retry_window_seconds(self.job) + DELIVERY_GRACE_SECONDS
        return self.schedule_time + datetime.timedelta(seconds=seconds)

    @property
    def remembered_until(self) -> datetime.datetime | None:
        """Until when a run of this slot is surely still in the ledger (None: no horizon is known).

        A slot's record expires no earlier than its schedule time plus its job's
        retention (the ledger counts retention from the later of the claim and the
        schedule time), so before then no record means no run; after it, none
        means nothing: the run may have completed and been forgotten.
        """
        if self.bound is None or self.bound.retention_seconds is None:
            return None
        return self.schedule_time + datetime.timedelta(seconds=self.bound.retention_seconds)

    def is_remembered(self, now: datetime.datetime) -> bool:
        until = self.remembered_until
        return until is None or now < until

    @property
    def deadline(self) -> datetime.datetime | None:
        """When the job's finish_within says the slot must have completed (None: no deadline)."""
        if self.job.finish_within is None:
            return None
        return self.schedule_time + datetime.timedelta(seconds=self.job.finish_within)

    @functools.cached_property
    def exclusion(self) -> ExclusionWindow | None:
        """The exclusion window of its Scheduler job that the slot lies in, or None."""
        if not self.job.exclude:
            return None
        zone = schedule_zone(self.job.time_zone)
        return next((window for window in self.job.exclude if window.covers(self.schedule_time, zone)), None)

    @property
    def pause(self) -> Pause | None:
        """The interval its Scheduler job was paused that the slot lies in, or None."""
        for interval in self.bound.pauses if self.bound else ():
            if interval.covers(self.schedule_time):
                return interval
        return None

    @property
    def tracked(self) -> bool:
        """Whether the slot is at or after the time its Scheduler job's slots are expected from."""
        expected_from = self.bound.expected_from if self.bound else None
        return expected_from is None or self.schedule_time >= expected_from


EARLIEST = datetime.datetime.min.replace(tzinfo=UTC)
LATEST = datetime.datetime.max.replace(tzinfo=UTC)


def _segments(job: BoundJob) -> list[tuple[SchedulerJob, datetime.datetime, datetime.datetime]]:
    """The job's declaration as each of its schedules had it, with the [from, to) that schedule applied.

    The oldest known schedule also covers the time before it was first seen (slots there
    are before the job's are expected: untracked), and the current one runs on from when it took effect.
    """
    if not job.earlier or job.schedule_since is None:
        return [(job.declared, EARLIEST, LATEST)]
    segments = []
    for index, old in enumerate(job.earlier):
        as_then = job.declared.model_copy(update={"schedule": old.schedule, "time_zone": old.time_zone})
        segments.append((as_then, EARLIEST if index == 0 else old.since, old.until))
    segments.append((job.declared, job.schedule_since, LATEST))
    return segments


def schedule_at(job: BoundJob, instant: datetime.datetime) -> SchedulerJob:
    """The job's declaration with the schedule it had at ``instant``."""
    for as_then, start, end in _segments(job):
        if start <= instant < end:
            return as_then
    return job.declared


def _times(job: SchedulerJob, since: datetime.datetime) -> Iterator[datetime.datetime]:
    """The schedule times of ``job``'s own schedule (not its history) at or after ``since``, in UTC."""
    start = (since - datetime.timedelta(microseconds=1)).astimezone(schedule_zone(job.time_zone))
    iterator = croniter(job.schedule, start)
    while True:
        yield iterator.get_next(datetime.datetime).astimezone(UTC)


def _times_before(job: SchedulerJob, until: datetime.datetime) -> Iterator[datetime.datetime]:
    """The schedule times of ``job``'s own schedule before ``until``, newest first, in UTC."""
    iterator = croniter(job.schedule, until.astimezone(schedule_zone(job.time_zone)))
    while True:
        yield iterator.get_prev(datetime.datetime).astimezone(UTC)


# A range this short is computed whole and kept (a few, the newest first): a fleet's Scheduler jobs
# mostly share a few schedules, so a page over thousands of them computes each schedule's times
# in its range once, not once a job (croniter takes about 100 µs a time).
CACHED_RANGE = datetime.timedelta(days=2)


@functools.lru_cache(maxsize=64)
def _times_in(
    schedule: str, time_zone: str, since: datetime.datetime, until: datetime.datetime
) -> tuple[datetime.datetime, ...]:
    """The schedule times of ``schedule`` in [since, until), in UTC: a short range's, kept."""
    start = (since - datetime.timedelta(microseconds=1)).astimezone(schedule_zone(time_zone))
    iterator, found = croniter(schedule, start), []
    while (instant := iterator.get_next(datetime.datetime).astimezone(UTC)) < until:
        found.append(instant)
    return tuple(found)


def _job_slots(job: BoundJob, since: datetime.datetime, until: datetime.datetime, limit: int) -> Iterator[Slot]:
    """``job``'s slots in [since, until), oldest first, each of the schedule it had then."""
    count = 0
    for as_then, start, end in _segments(job):
        if end <= since or start >= until:
            continue
        low, high = max(since, start), min(until, end)
        times: Iterable[datetime.datetime] = (
            _times_in(as_then.schedule, as_then.time_zone, low, high)
            if high - low <= CACHED_RANGE
            else _times(as_then, low)
        )
        for instant in times:
            if instant >= high or count >= limit:
                break
            count += 1
            yield Slot(as_then, instant, job)


def slots_between(
    jobs: Iterable[BoundJob], since: datetime.datetime, until: datetime.datetime, limit: int = MAX_SLOTS
) -> list[Slot]:
    """The slots in [since, until) of every job, oldest first, at most ``limit`` of them.

    Merged from each job's slots as they are computed, so a page of ``limit`` costs about
    ``limit`` plus a slot a job: computing every job's ``limit`` first made a range read page by
    page quadratic in its Scheduler jobs (a day of 200 five-minute jobs: 84 s of CPU)."""
    merged = heapq.merge(*(_job_slots(job, since, until, limit) for job in jobs), key=_slot_order)
    return list(itertools.islice(merged, limit))


def _slot_order(slot: Slot) -> tuple[datetime.datetime, str, str, str]:
    """Time first; a time shared by several Scheduler jobs in one order on every page."""
    return slot.schedule_time, slot.job.name, slot.job.project, slot.job.location


def slot_page(
    jobs: Sequence[BoundJob], since: datetime.datetime, until: datetime.datetime, limit: int = MAX_SLOTS
) -> tuple[list[Slot], datetime.datetime | None]:
    """The first page of the slots in [since, until), oldest first, at most ``limit`` of them, and
    where the next page starts (None: the page ends the range).

    A page ends before the time the cap cut into, so a time shared by several Scheduler jobs
    is never split over two pages (nor listed twice)."""
    slots = slots_between(jobs, since, until, limit + 1)
    if len(slots) <= limit:
        return slots, None
    next_time = slots[limit].schedule_time
    kept = [slot for slot in slots[:limit] if slot.schedule_time < next_time]
    if kept:
        return kept, next_time
    return [slot for slot in slots if slot.schedule_time == next_time], next_time + datetime.timedelta(microseconds=1)


def slot_pages(
    jobs: Sequence[BoundJob], since: datetime.datetime, until: datetime.datetime, limit: int = MAX_SLOTS
) -> Iterator[list[Slot]]:
    """Every slot in [since, until), oldest first, a page of at most ``limit`` at a time: the whole
    range, however long.  What acts on a range's slots (a catch-up) reads it so, never one capped
    listing, which would leave its newest slots out."""
    cursor: datetime.datetime | None = since
    while cursor is not None:
        page, cursor = slot_page(jobs, cursor, until, limit)
        yield page


def latest_slots(jobs: Iterable[BoundJob], now: datetime.datetime, count: int) -> list[Slot]:
    """The newest ``count`` slots at or before ``now`` of every job, oldest first.

    Merged newest first from each job's slots as they are computed: a job card over 5,000
    Scheduler jobs computes about a slot a job and ``count`` more, not ``count`` a job."""
    after_now = now + datetime.timedelta(microseconds=1)
    merged = heapq.merge(*(_newest_first(job, after_now, count) for job in jobs), key=_slot_order, reverse=True)
    return sorted(itertools.islice(merged, count), key=_slot_order)


def _newest_first(job: BoundJob, before: datetime.datetime, count: int) -> Iterator[Slot]:
    """``job``'s newest ``count`` slots before ``before``, newest first, each of the schedule it had then."""
    taken = 0
    for as_then, start, end in reversed(_segments(job)):
        if start >= before or taken >= count:
            continue
        for instant in _times_before(as_then, min(before, end)):
            if instant < start or taken >= count:
                break
            taken += 1
            yield Slot(as_then, instant, job)


def nearest_slots(job: BoundJob, instant: datetime.datetime) -> tuple[datetime.datetime, datetime.datetime]:
    """The job's last schedule time before ``instant`` and its first one after it (of the schedule it had then)."""
    as_then = schedule_at(job, instant)
    zone_instant = instant.astimezone(schedule_zone(as_then.time_zone))
    before = croniter(as_then.schedule, zone_instant).get_prev(datetime.datetime).astimezone(UTC)
    after = croniter(as_then.schedule, zone_instant).get_next(datetime.datetime).astimezone(UTC)
    return before, after


def is_slot(job: BoundJob, instant: datetime.datetime) -> bool:
    """Whether ``instant`` is a slot of the schedule ``job`` had at that instant."""
    return next(_times(schedule_at(job, instant), instant)) == instant


def declared_job(
    jobs: Iterable[BoundJob], scheduler_job_name: str, project: str | None, location: str | None
) -> BoundJob | None:
    """The scheduler.yaml entry whose deliveries carry this name and scope, if one is declared."""
    for job in jobs:
        named = job.declared
        if named.name == scheduler_job_name and delivery_scope(named) == (project or None, location or None):
            return job
    return None


@dataclasses.dataclass(frozen=True)
class ForceRun:
    """Why a delivery is a Force run, and whether it needs a key of its own."""

    reason: str
    # Ahead of the clock: its time names a slot still to come, which it must not take.  Carrying
    # its own execution time, it names no slot, so the key of that time is its own already (and
    # every process computes the same one, whatever schedule history it holds).
    own_key: bool


def force_run_reason(
    key: ScheduledRunKey, job_id: str, jobs: Iterable[BoundJob], now: datetime.datetime
) -> ForceRun | None:
    """Why this delivery is a Force run rather than a slot's delivery, or None if it may be the slot's.

    Cloud Scheduler's Force run (console, ``gcloud scheduler jobs run``, ``jobs.run``) is
    delivered at once, and which schedule time it carries is not clearly documented: the
    next slot's (then it is ahead of the clock) or its own execution time (then it is no
    slot of a declared schedule).  Keyed as the slot, the first would take a slot that has
    not come and the real delivery would be answered as a duplicate.
    """
    ahead = ahead_of_its_time(key, now)
    if ahead is not None:
        return ForceRun(ahead, own_key=True)
    found = declared_job(jobs, key.scheduler_job_name, key.project, key.location)
    if found is not None and found.declared.target == job_id and not is_slot(found, key.schedule_time):
        declared = found.declared
        return ForceRun(f"its schedule time is no slot of {declared.name}'s schedule ({declared.schedule!r})", False)
    return None


def may_be_force_run_retry(key: ScheduledRunKey, job: SchedulerJob | None, now: datetime.datetime) -> bool:
    """Whether this delivery of a slot's time (no Force run by its time alone) may be a retry of a
    Force run that carried the time: then that Force run's record is read (``force_run_retry``).

    ``job``: the declared Scheduler job the delivery is of (None: none is known, nor its retries).
    A Force run carrying the time came more than the skew before it, so its retries end a retry
    window after that; a job Scheduler retries nothing of has none."""
    if job is None:
        return now < key.schedule_time
    if not (job.retry.retry_count or job.retry.max_retry_duration):
        return False
    last = retry_window_seconds(job) + DELIVERY_GRACE_SECONDS - CLOCK_SKEW_SECONDS
    return now < key.schedule_time + datetime.timedelta(seconds=last)


def force_run_retry(
    key: ScheduledRunKey, forced: RunRecord | None, job: SchedulerJob | None, now: datetime.datetime
) -> ForceRun | None:
    """Why this delivery of a slot's time is a retry of the Force run that carried the time
    (``forced``, its record), or None: the slot's own delivery.

    A Force run's retries carry its time, whenever they come.  Before that time no slot is
    delivered, so a delivery that finds the Force run is its retry, whatever it came to (a
    completed one whose answer was lost too).  At the time or after it, one that finds the Force
    run still to finish (in progress, released) is its retry: Scheduler has one execution of a job
    outstanding at a time, so the slot's own delivery does not come meanwhile.  A Force run that
    finished leaves the deliveries from then on to the slot (its retry could not be told from the
    slot's delivery then; either way the slot runs once).  ``job`` (its declared Scheduler job)
    says whether Scheduler may still retry it: retries left, within the retry window from its
    first attempt."""
    if forced is None or (job is not None and not scheduler_may_retry(forced, job, now)):
        return None
    if now < key.schedule_time:
        return ForceRun("a retry of the Force run that carried this slot's time, before that time", own_key=True)
    if job is not None and forced.status in (RunStatus.IN_PROGRESS, RunStatus.RELEASED):
        return ForceRun(
            "a retry of the Force run that carried this slot's time, still to finish: Scheduler delivers "
            "no other execution of the job meanwhile",
            own_key=True,
        )
    return None


def scheduler_may_retry(record: RunRecord, job: SchedulerJob, now: datetime.datetime) -> bool:
    """Whether Cloud Scheduler may still deliver a retry of the execution ``record`` is the run of.

    Within the retry window from its first attempt, while retries are left: ``retry_count`` of
    them (each that took the run over began an attempt; a replay or a 409 began none, so this
    counts short, on the side of a retry) or ``max_retry_duration`` from the first attempt."""
    age = (now - record.created).total_seconds()
    if age >= retry_window_seconds(job) + DELIVERY_GRACE_SECONDS:
        return False
    retry = job.retry
    return int(record.attempt) - 1 < retry.retry_count or age < retry.max_retry_duration


def execution_status(slot: Slot, record: RunFacts | None, now: datetime.datetime) -> ExecutionStatus:
    """The slot's status: the run's own, or what its absence means at ``now``.

    A released run becomes ``missed`` once no retry can come; so does an absent run, while the ledger
    would still hold its record (``unknown`` after that).  A record of another
    job is a ``conflict``, never the slot's own outcome.  No record before the
    job's slots are expected from is ``untracked``: the app was not expecting the slot then.
    A run whose lease ran out unfinished is ``stuck``, window open or closed: it started, so
    it is never ``missed`` (which says nothing ran).
    A slot that would be ``missed`` or ``due`` inside a pause interval is ``paused``; one with no
    run (or a skipped one) inside an exclusion window is ``excluded``.
    """
    status = _status(slot, record, now)
    if status == ExecutionStatus.SKIPPED and record is not None and record.compacted_into:
        return ExecutionStatus.COVERED  # a compacted run stands for it, window or pause or not
    if status in _EXCLUDABLE and (record is None or record.status == RunStatus.SKIPPED) and slot.exclusion is not None:
        return ExecutionStatus.EXCLUDED  # planned downtime: not expected, and a delivery is skipped
    if status in (ExecutionStatus.MISSED, ExecutionStatus.DUE) and slot.pause is not None:
        return ExecutionStatus.PAUSED  # nothing was to be delivered: not missed, not waited for
    return status


# What an exclusion window turns into ``excluded``: a slot with no run, and one whose delivery was
# skipped there.  A run that went ahead (run_excluded: true, or an operator's) keeps its own
# status, released or failed ones too: an attempt started, so the operator must see how it ended.
_EXCLUDABLE = (ExecutionStatus.MISSED, ExecutionStatus.DUE, ExecutionStatus.UPCOMING, ExecutionStatus.SKIPPED)


def _status(slot: Slot, record: RunFacts | None, now: datetime.datetime) -> ExecutionStatus:
    window_open = now < slot.window_closes
    if record is not None and record.status == RunStatus.RELEASED and record.attempt == 0:
        record = None  # a compacted run set to stand for others, no attempt begun: not run yet
    if record is not None and record.job_id != slot.job.target:
        return ExecutionStatus.CONFLICT
    if record is None and not slot.tracked:
        return ExecutionStatus.UNTRACKED
    if record is None:
        if slot.schedule_time > now:
            return ExecutionStatus.UPCOMING
        if window_open:
            return ExecutionStatus.DUE
        return ExecutionStatus.MISSED if slot.is_remembered(now) else ExecutionStatus.UNKNOWN
    if record.status == RunStatus.RELEASED:
        return ExecutionStatus.RELEASED if window_open else ExecutionStatus.MISSED
    if record.status == RunStatus.IN_PROGRESS and not record.lease_is_live(now):
        # Stuck: the next delivery takes it over while one can still come; after that only an
        # operator's acknowledged run does.  Either way it started, and may have taken effect.
        return ExecutionStatus.STUCK
    return ExecutionStatus(record.status)  # completed, failed, in_progress or skipped


# What a deadline can be broken by: a run that is still to finish.
UNFINISHED = (ExecutionStatus.IN_PROGRESS, ExecutionStatus.STUCK, ExecutionStatus.DUE, ExecutionStatus.RELEASED)


def timeliness(slot: Slot, record: RunFacts | None, now: datetime.datetime) -> ExecutionStatus | None:
    """``late`` or ``overdue`` when the slot broke its job's finish_within, else None.

    ``late``: completed after the deadline.  ``overdue``: the deadline passed while the run
    was still to finish (in progress, due, released); a stuck one is shown stuck.  A slot that is missed, failed,
    skipped, paused or untracked says that instead, and one inside a pause interval (caught
    up later, perhaps) is never late."""
    deadline = slot.deadline
    if deadline is None or slot.pause is not None or slot.exclusion is not None:
        return None  # a slot of a pause is run when the operator says: never late for it
    status = execution_status(slot, record, now)
    if status == ExecutionStatus.COMPLETED and record is not None and record.finished and record.finished > deadline:
        return ExecutionStatus.LATE
    if status in UNFINISHED and status != ExecutionStatus.STUCK and now > deadline:
        return ExecutionStatus.OVERDUE  # a stuck run says more than its deadline: stuck it stays
    return None


def shown_status(slot: Slot, record: RunFacts | None, now: datetime.datetime) -> ExecutionStatus:
    """The status the listing shows: the execution status, or its deadline's breach."""
    return timeliness(slot, record, now) or execution_status(slot, record, now)


def slot_of_run(record: RunRecord, jobs: Iterable[BoundJob]) -> Slot | None:
    """The declared slot ``record`` is the run of (a scheduled delivery of a slot of ``jobs``,
    bound to their pauses), or None: a manual run, a Force run, a delivery no declaration names."""
    if record.source != RunSource.SCHEDULER or record.schedule_time is None or not record.scheduler_job_name:
        return None
    job = declared_job(jobs, record.scheduler_job_name, record.project, record.location)
    if job is None or job.declared.target != record.job_id or not is_slot(job, record.schedule_time):
        return None
    return Slot(job.declared, record.schedule_time, job)


def run_status(record: RunRecord, jobs: Iterable[BoundJob], now: datetime.datetime) -> str:
    """The one status a run is shown with, wherever it is shown (the runs table, the timeline,
    the run page, a job's card): its slot's, as the executions listing has it, when it is the
    run of a declared slot; else its own, ``stuck`` where its lease ran out unfinished."""
    slot = slot_of_run(record, jobs)
    if slot is not None:
        return shown_status(slot, record, now)
    if record.status == RunStatus.IN_PROGRESS and not record.lease_is_live(now):
        return ExecutionStatus.STUCK
    return str(record.status)


def ran_once_or_more(documents: Iterable[dict[str, Any]]) -> tuple[int, int]:
    """Of the completed executions (late ones too), how many completed at their first attempt
    (ran once) and how many took more: a takeover or a retry after a release, whose attempts
    before may have called downstream too.  The one count every view says "ran once" with."""
    return ran_once_or_more_of((d["status"], d.get("run", {}).get("attempt", 1)) for d in documents)


def ran_once_or_more_of(statuses: Iterable[tuple[str, int | None]]) -> tuple[int, int]:
    """``ran_once_or_more`` of (status, attempt) pairs: a home row's, counted from day summaries."""
    done = [attempt for status, attempt in statuses if status in (ExecutionStatus.COMPLETED, ExecutionStatus.LATE)]
    once = sum(1 for attempt in done if (attempt or 1) <= 1)
    return once, len(done) - once


def execution_document(slot: Slot, record: RunRecord | None, now: datetime.datetime) -> dict[str, Any]:
    """One entry of the executions listing."""
    document: dict[str, Any] = {
        "schedule_time": format_utc(slot.schedule_time),
        "scheduler_job": slot.job.name,
        "project": slot.job.project,
        "location": slot.job.location,
        "run_id": slot.run_id,
        "status": shown_status(slot, record, now),
        "retry_window_closes": format_utc(slot.window_closes),
        "remembered_until": format_utc(slot.remembered_until) if slot.remembered_until else None,
    }
    if record is not None:
        document["run"] = {
            "status": record.status,
            "attempt": record.attempt,
            "created": format_utc(record.created),
            "started": format_utc(record.started) if record.started else None,
            "finished": format_utc(record.finished) if record.finished else None,
            "outcome": record.preview,
            "requested_by": record.requested_by,
        }
        if record.job_id != slot.job.target:
            document["recorded_job_id"] = record.job_id
        if record.status == ExecutionStatus.SKIPPED:
            document["reason"] = (record.error or {}).get("message")
        if record.compacted_into:
            document["compacted_into"] = record.compacted_into
        if record.covers:
            document["covered_slots"] = len(record.covers)
    if slot.deadline is not None:
        document["deadline"] = format_utc(slot.deadline)
    if slot.pause is not None:
        document["pause"] = slot.pause.document()  # delivered anyway (a Force run, a racing tick) or not
    return document
