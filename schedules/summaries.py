"""Per-job day summaries: what each slot came to, kept as runs finish and as the audit judges slots.

A home row used to look up the record of every slot of its last 24 hours (288 reads for a
5-minute job, per view, per Scheduler job).  Now it reads its job's audit mark and two
``SlotDay`` buckets, and looks up a record only for a slot neither of them speaks for:

- **A finished run** (completed, failed, skipped) notes its ``RunDigest`` in its day's bucket:
  after a delivery's answer has gone (never on its path), or as an operator's run of a slot
  ends.  A note can be lost (a worker dies after the answer, a contended bucket outlasts its
  patience); the slot is then looked up, until the audit passes it.
- **The audit** judges every slot once its retry window has closed.  In the transaction that
  moves its mark it keeps, in the mark, the digest of each judged slot that completed and whose
  note the buckets lack (a lost note: ``repairs``), for a day or so.

Only a completed run's digest stands in for its record (``SETTLED``): a failed, skipped or
missed slot may be run again by hand at any time, and that run's note may be lost like any, so
such slots are always looked up.  So the status a row shows for a slot is what
``schedules.slots.shown_status`` makes of the same facts its record holds: exact for every slot
the summaries speak for, and the rest looked up.  A healthy job's row reads its mark and two
buckets; one with failed or missed slots reads their records too (ROW_SLOTS at most).  A test
builds a week and holds every hour's row to a recount from the records (tests/test_summaries.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.cloud import ndb

from dedup.keys import format_utc, is_run_id, parse_rfc3339
from dedup.record_store import RecordStore
from dedup.store import Store, Transaction
from dedup.transactions import get_many, transact
from models import RunRecord, RunStatus
from models.audit import AuditMark
from models.slot_day import SUMMARY_DAYS, SlotDay
from schedules.slots import Slot

log = logging.getLogger(__name__)
# How long a contended bucket is tried before the note is let go (the audit repairs it): as a tally's.
NOTE_PATIENCE_SECONDS = 5.0
# How long the audit keeps a repair in its mark: past the 24 hours a row counts, no longer.
REPAIRS_KEPT = datetime.timedelta(hours=26)
# What a digest may stand in for its record as: a completed run, which nothing runs again.  A failed,
# skipped or missed slot may be reopened or run by hand at any time (a catch-up, a bulk run), and a
# note of that run can be lost like any: such slots are always looked up, so a row never shows an
# outcome its record has moved on from.
SETTLED = (RunStatus.COMPLETED,)
# The runs that note themselves: only what a row may take a note for.
NOTED = SETTLED


@dataclasses.dataclass(frozen=True)
class RunDigest:
    """What a slot's status needs of its run's record (``schedules.slots.RunFacts``), and no more."""

    job_id: str
    status: RunStatus
    attempt: int
    finished: datetime.datetime | None
    lease_expires: datetime.datetime
    compacted_into: str | None = None  # stored as a sixth item only when set

    def lease_is_live(self, now: datetime.datetime) -> bool:
        return self.status == RunStatus.IN_PROGRESS and self.lease_expires > now

    @classmethod
    def of(cls, record: RunRecord | RunDigest) -> RunDigest:
        if isinstance(record, RunDigest):
            return record
        return cls(
            record.job_id,
            RunStatus(record.status),
            record.attempt,
            record.finished,
            record.lease_expires,
            record.compacted_into or None,
        )

    def stored(self) -> list[Any]:
        finished = format_utc(self.finished) if self.finished else None
        stored = [self.job_id, str(self.status), self.attempt, finished, format_utc(self.lease_expires)]
        return [*stored, self.compacted_into] if self.compacted_into else stored

    @classmethod
    def from_stored(cls, value: Any) -> RunDigest | None:
        """None for anything this code did not write: the slot is then looked up, never misread."""
        try:
            job_id, status, attempt, finished, lease_expires, *more = value
            if len(more) > 1 or (more and not is_run_id(more[0])):
                return None
            return cls(
                str(job_id),
                RunStatus(status),
                int(attempt),
                parse_rfc3339(finished, "finished") if finished is not None else None,
                parse_rfc3339(lease_expires, "lease_expires"),
                more[0] if more else None,
            )
        except (TypeError, ValueError):  # InvalidRunRequest is a ValueError
            return None


def day_of(instant: datetime.datetime) -> datetime.date:
    return instant.astimezone(datetime.UTC).date()


def days_between(first: datetime.datetime, last: datetime.datetime) -> list[datetime.date]:
    """Every UTC day from ``first``'s to ``last``'s, both in (at most the ring's: older ones are gone)."""
    days, day = [], day_of(first)
    while day <= day_of(last):
        days.append(day)
        day += datetime.timedelta(days=1)
    return days[-SUMMARY_DAYS:]


def day_keys(scheduler_job: str, days: Iterable[datetime.date]) -> list[ndb.Key]:
    return [SlotDay.key_for(scheduler_job, day) for day in days]


def bucket_for(found: SlotDay | None, key: ndb.Key, day: datetime.date) -> SlotDay | None:
    """The bucket to change for ``day``: the one found, a fresh one where it held an older day (or
    none), None where it has moved on to a newer day (``day`` is older than the ring keeps)."""
    if found is not None and found.day > day:
        return None
    if found is None or found.day < day:
        return SlotDay.fresh(key, day)
    return found


def note_run(
    scheduler_job: str, schedule_time: datetime.datetime, record: RunRecord, store: Store | None = None
) -> None:
    """Keep a finished run's digest in the summary of its slot's day (``scheduler_job``: its history id).

    Setting a digest is idempotent, so a try in doubt is tried again; a note never replaces one
    of a later attempt (two notes of a slot run again by hand may land in either order)."""
    if record.status not in NOTED:
        return
    day = day_of(schedule_time)
    key = SlotDay.key_for(scheduler_job, day)
    slot, digest = format_utc(schedule_time), RunDigest.of(record)

    def put(transaction: Transaction) -> None:
        (found,) = transaction.get([key])
        summary = bucket_for(found.record if found else None, key, day)
        if summary is None:
            return
        kept = RunDigest.from_stored((summary.runs or {}).get(slot))
        if kept == digest or (kept is not None and kept.attempt > digest.attempt):
            return
        summary.runs = {**(summary.runs or {}), slot: digest.stored()}
        transaction.put(summary)

    transact(put, NOTE_PATIENCE_SECONDS, store or RecordStore.of_context())


@dataclasses.dataclass(frozen=True)
class RunNote:
    """A finished run of a declared Scheduler job's slot, to note in its day's summary once the
    delivery's answer has gone (``note_run`` in a context of its own: it never raises)."""

    scheduler_job: str  # its history id
    schedule_time: datetime.datetime
    record: RunRecord
    client: ndb.Client = dataclasses.field(repr=False, compare=False)

    def write(self, *_: Any) -> None:
        """After the answer, in a context of its own."""
        try:
            with self.client.context():
                note_run(self.scheduler_job, self.schedule_time, self.record)
        except Exception:
            self._lost()

    def keep(self) -> None:
        """In the caller's context (an operator's run of a slot, whose answer may wait for it)."""
        try:
            note_run(self.scheduler_job, self.schedule_time, self.record)
        except Exception:
            self._lost()

    def _lost(self) -> None:
        log.warning(
            "the run of %s at %s went unnoted in its day's summary: the audit repairs it",
            self.scheduler_job,
            self.schedule_time.isoformat(),
            exc_info=True,
        )


def count_duplicate(summary: SlotDay, schedule_time: datetime.datetime) -> None:
    """One more duplicate delivery absorbed by a slot of ``summary``'s day."""
    slot = format_utc(schedule_time)
    counts = dict(summary.duplicates or {})
    counts[slot] = _count(counts.get(slot)) + 1
    summary.duplicates = counts


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclasses.dataclass(frozen=True)
class JobSummaries:
    """One Scheduler job's summaries as a page read them: its day buckets and its audit mark."""

    days: Mapping[datetime.date, SlotDay]
    mark: AuditMark | None

    @classmethod
    def of(
        cls, found: Iterable[SlotDay | None], wanted: Iterable[datetime.date], mark: AuditMark | None
    ) -> JobSummaries:
        """From buckets read for the ``wanted`` days (in order): those holding another day are left out."""
        days = {day: bucket for bucket, day in zip(found, wanted, strict=True) if bucket and bucket.day == day}
        return cls(days, mark)

    def noted(self, schedule_time: datetime.datetime) -> RunDigest | None:
        """The digest of the slot's completed run, as noted in its day's summary, or None."""
        bucket = self.days.get(day_of(schedule_time))
        noted = RunDigest.from_stored((bucket.runs or {}).get(format_utc(schedule_time))) if bucket else None
        return noted if noted is not None and noted.status in SETTLED else None

    def facts(self, schedule_time: datetime.datetime, now: datetime.datetime) -> RunDigest | None:
        """The digest of the slot's completed run, from its note or the audit's repair of a lost
        one; None where only its record can say (anything else may still change: see SETTLED)."""
        noted = self.noted(schedule_time)
        if noted is not None or self.mark is None or schedule_time <= now - REPAIRS_KEPT:
            return noted
        repaired = RunDigest.from_stored((self.mark.repairs or {}).get(format_utc(schedule_time)))
        return repaired if repaired is not None and repaired.status in SETTLED else None

    def facts_of(self, slot: Slot, now: datetime.datetime) -> RunDigest | None:
        """``facts`` of a slot, where it lies within its horizon: past it (a retention under a
        day) only its record can say, since its absence then means ``unknown``."""
        return self.facts(slot.schedule_time, now) if slot.is_remembered(now) else None

    def duplicates(self, schedule_times: Iterable[datetime.datetime]) -> int:
        """The duplicates counted for the slots at ``schedule_times``, of the buckets read."""
        total = 0
        for schedule_time in schedule_times:
            bucket = self.days.get(day_of(schedule_time))
            if bucket is not None:
                total += _count((bucket.duplicates or {}).get(format_utc(schedule_time)))
        return total


def summaries_of(store: Store, scheduler_jobs: Sequence[str], days: Sequence[datetime.date]) -> list[JobSummaries]:
    """Each Scheduler job's (history id's) audit mark and day summaries of ``days``, in one lookup:
    what a home row, a history page's hours and an audit pass read before any record."""
    marks = [ndb.Key(AuditMark, scheduler_job) for scheduler_job in scheduler_jobs]
    buckets = [key for scheduler_job in scheduler_jobs for key in day_keys(scheduler_job, days)]
    found = get_many(store, marks + buckets)
    read = iter(found[len(marks) :])
    return [JobSummaries.of([next(read) for _ in days], days, mark) for mark in found[: len(marks)]]


def repairs_for(
    judged: Iterable[tuple[datetime.datetime, RunRecord | RunDigest | None]],
    summaries: JobSummaries,
    kept: Mapping[str, Any] | None,
    now: datetime.datetime,
) -> dict[str, Any]:
    """The audit mark's repairs after a pass judged ``judged`` (each slot's time and record as
    read): those it kept that a row may still count, and the digest of each judged slot whose
    run the buckets do not hold as its record says."""
    repairs = {
        slot: value
        for slot, value in (kept or {}).items()
        if (when := _parsed(slot)) is not None and when > now - REPAIRS_KEPT
    }
    for schedule_time, record in judged:
        if record is None or record.status not in SETTLED or schedule_time <= now - REPAIRS_KEPT:
            continue
        digest = RunDigest.of(record)
        if summaries.noted(schedule_time) != digest:
            repairs[format_utc(schedule_time)] = digest.stored()
    return repairs


def _parsed(text: str) -> datetime.datetime | None:
    try:
        return parse_rfc3339(text, "schedule_time")
    except ValueError:
        return None
