"""The dashboard's home rows: one per Scheduler job, as Cloud Scheduler's console shows them,
plus what only this app knows (issue 25 §1).

A row says the schedule and its time zone, the job's state (enabled, or paused with who and
why), its last expected execution and that execution's status, its next one, what was missed,
failed and late in the last 24 hours, and its failure streak.  Rows that need attention sort
first.  A row costs no round trip of its own: the day's slots of every Scheduler job are
looked up in one batch, and the streaks (the audit's marks) and the duplicate deliveries
absorbed (schedules.tallies) in another.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from google.cloud import ndb

from dedup.keys import format_utc
from dedup.ledger import Ledger
from dedup.transactions import get_many
from handlers.slot_statuses import NEEDS_ATTENTION
from models.audit import AuditMark
from schedules.bound import BoundJob
from schedules.config import history_id
from schedules.pauses import current
from schedules.slots import ExecutionStatus, execution_document, latest_slots, ran_once_or_more, slots_between
from schedules.tallies import duplicates_in, hours_between, tally_keys

DAY = datetime.timedelta(hours=24)
# The slots a row reads: a 5-minute job's day.  A job with more slots a day (a per-minute job)
# is counted over its newest ROW_SLOTS, and its row says over how long: a view's reads stay
# bounded by what it shows until per-job summaries kept as runs finish replace the reads.
ROW_SLOTS = 288
# What a row counts over its last 24 hours, and what makes it need attention (handlers/slot_statuses.py).
COUNTED = NEEDS_ATTENTION


def job_rows(ledger: Ledger, jobs: Sequence[BoundJob], now: datetime.datetime) -> list[dict[str, Any]]:
    """A row per Scheduler job (bound to its pauses), those that need attention first, then by name."""
    of_day = {id(job): _newest_of_day(job, now) for job in jobs}
    day_slots = {key: slots for key, (slots, _) in of_day.items()}
    # A job whose slots are more than a day apart: its last one, in the same batch.
    earlier = {id(job): latest_slots([job], now, 1) for job in jobs if not day_slots[id(job)]}
    wanted = [slot for slots in (*day_slots.values(), *earlier.values()) for slot in slots]
    records = ledger.lookup_many([slot.run_id for slot in wanted])
    hours = {
        id(job): hours_between(slots[0].schedule_time, slots[-1].schedule_time) if (slots := day_slots[id(job)]) else []
        for job in jobs
    }
    # The audit's marks and the duplicate tallies of the slots' hours, in one batch.
    mark_keys = [ndb.Key(AuditMark, history_id(job.declared)) for job in jobs]
    wanted_tallies = [key for job in jobs for key in tally_keys(history_id(job.declared), hours[id(job)])]
    found = get_many(ledger.store(), mark_keys + wanted_tallies)
    marks = found[: len(mark_keys)]
    tallies = dict(zip(wanted_tallies, found[len(mark_keys) :], strict=True))
    rows = []
    for job, mark in zip(jobs, marks, strict=True):
        documents = [execution_document(slot, records.get(slot.run_id), now) for slot in day_slots[id(job)]]
        counts = {status: sum(d["status"] == status for d in documents) for status in COUNTED}
        ran_once, ran_more = ran_once_or_more(documents)
        upcoming = slots_between([job], now, now + datetime.timedelta(days=366), limit=1)
        before = [execution_document(slot, records.get(slot.run_id), now) for slot in earlier.get(id(job), [])]
        shown = documents or before
        last = shown[-1] if shown else None
        pause = current(job.pauses)
        streak = mark.failure_streak if mark else 0
        attention = bool(pause or streak or any(counts.values()))
        rows.append(
            {
                "scheduler_job": job.declared.name,
                "job_id": job.declared.target,
                "project": job.declared.project,
                "location": job.declared.location,
                "schedule": job.declared.schedule,
                "time_zone": job.declared.time_zone,
                "pause": pause.document() if pause else None,
                "last": last,
                "next": format_utc(upcoming[0].schedule_time) if upcoming else None,
                "counts": {str(status): n for status, n in counts.items()},
                # Over how long the counts are: the whole day, or the newest ROW_SLOTS slots of it.
                "counted_since": documents[0]["schedule_time"] if of_day[id(job)][1] else None,
                "expected": sum(
                    d["status"] not in (ExecutionStatus.UNTRACKED, ExecutionStatus.UPCOMING) for d in documents
                ),
                "ran_once": ran_once,
                "ran_more": ran_more,
                "duplicates": duplicates_in(tallies, history_id(job.declared), hours[id(job)]),
                "streak": streak,
                "attention": attention,
            }
        )
    return sorted(rows, key=lambda row: (not row["attention"], row["scheduler_job"]))


def _newest_of_day(job: BoundJob, now: datetime.datetime) -> tuple[list[Any], bool]:
    """The job's slots of the last 24 hours, the newest ROW_SLOTS of them at most, and whether
    the day held more (one slot more is computed, never looked up, to know)."""
    newest = latest_slots([job], now - datetime.timedelta(microseconds=1), ROW_SLOTS + 1)
    of_day = [slot for slot in newest if slot.schedule_time > now - DAY]
    return of_day[-ROW_SLOTS:], len(of_day) > ROW_SLOTS
