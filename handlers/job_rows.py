"""The dashboard's home rows: one per Scheduler job, as Cloud Scheduler's console shows them,
plus what only this app knows (issue 25 §1).

A row says the schedule and its time zone, the job's state (enabled, or paused with who and
why), its last expected execution and that execution's status, its next one, what was missed,
failed and late in the last 24 hours, and its failure streak.  Rows that need attention sort
first.  A row costs no round trip of its own and a few entity reads: its job's audit mark and
two day summaries (schedules.summaries) say what its slots came to and the duplicates they
absorbed, and only a slot they do not speak for (a run in flight, say) is looked up.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

from dedup.keys import format_utc
from dedup.ledger import Ledger
from handlers.slot_statuses import NEEDS_ATTENTION
from schedules.attention import needing_attention
from schedules.bound import BoundJob
from schedules.config import history_id
from schedules.pauses import current
from schedules.slots import (
    ExecutionStatus,
    Slot,
    execution_document,
    latest_slots,
    ran_once_or_more_of,
    shown_status,
    slots_between,
)
from schedules.summaries import JobSummaries, RunDigest, days_between, summaries_of
from service.audits import audit_shares
from service.hours import DAY_SLOTS
from service.state import AppState

DAY = datetime.timedelta(hours=24)
MICROSECOND = datetime.timedelta(microseconds=1)
# The slots of a row that only their records can say (no day summary, no audit pass spoke for
# them: a run in flight, a note lost, a job the audit has not reached) are looked up, the newest
# ROW_SLOTS at most; a row with more counts from the oldest of those it looked up, and says since
# when.  A 5-minute job's whole day fits, and a per-minute job's day is counted whole once the
# audit has passed it (schedules.summaries).
ROW_SLOTS = 288
# What a row counts over its last 24 hours, and what makes it need attention (handlers/slot_statuses.py).
COUNTED = NEEDS_ATTENTION
# The rows a page shows: what a person reads at once, and what bounds a page's reads whatever the fleet.
ROWS_PER_PAGE = 25
# The longest search a page takes: a Scheduler job's name is at most 500 characters.
SEARCH_MAX = 500


@dataclasses.dataclass(frozen=True)
class RowPage:
    """One page of home rows: those that need attention first (by index, schedules.attention),
    then by name; of the Scheduler jobs whose name holds ``search`` (case aside)."""

    rows: list[dict[str, Any]]
    number: int  # 1-based
    pages: int
    total: int  # the Scheduler jobs the search found
    first: int  # of those, how many the index puts first (attention)


class PageOutOfRange(ValueError):
    """A page number past the pages the rows make (a bad link, or a fleet that shrank)."""


def row_page(
    state: AppState, now: datetime.datetime, number: int, search: str = "", job_id: str | None = None
) -> RowPage:
    """Page ``number`` of the home rows: the audit shares' attention for the order
    (schedules.attention), then the page's own rows (``job_rows``), whatever the number of
    Scheduler jobs.  PageOutOfRange past the last."""
    wanted = search.casefold()
    found = [
        job
        for job in state.bound_schedules
        if (job_id is None or job.declared.target == job_id) and wanted in job.declared.name.casefold()
    ]
    first = needing_attention(state.ledger.store(), audit_shares(state.schedules), now)
    found.sort(key=lambda job: (history_id(job.declared) not in first, job.declared.name, history_id(job.declared)))
    pages = max(1, -(-len(found) // ROWS_PER_PAGE))
    if not 1 <= number <= pages:
        raise PageOutOfRange(f"page {number} is not one of 1 to {pages}")
    shown = found[(number - 1) * ROWS_PER_PAGE : number * ROWS_PER_PAGE]
    rows = job_rows(state.ledger, state.with_pauses([job.declared for job in shown]), now) if shown else []
    leading = sum(1 for job in found if history_id(job.declared) in first)
    return RowPage(rows, number, pages, len(found), leading)


@dataclasses.dataclass
class _RowSlots:
    """One row's slots of the last 24 hours: the facts the summaries give, and those to look up."""

    slots: list[Slot]
    facts: dict[int, RunDigest | None]  # by index into slots: what the summaries said
    looked_up: list[int]  # the indexes whose records are read
    since: int  # the first slot counted (0 unless the row looked up fewer than it lacks)


def job_rows(ledger: Ledger, jobs: Sequence[BoundJob], now: datetime.datetime) -> list[dict[str, Any]]:
    """A row per Scheduler job (bound to its pauses), those that need attention first, then by name.

    Two lookups whatever the fleet: every job's audit mark and day summaries, then the records
    of the slots those do not speak for and of each job's last slot (its document says more)."""
    day_slots = {id(job): slots_between([job], now - DAY + MICROSECOND, now, DAY_SLOTS) for job in jobs}
    # A job whose slots are more than a day apart: its last one, in the same batch.
    earlier = {id(job): latest_slots([job], now, 1) for job in jobs if not day_slots[id(job)]}
    read = summaries_of(ledger.store(), [history_id(job.declared) for job in jobs], days_between(now - DAY, now))
    summaries = {id(job): summary for job, summary in zip(jobs, read, strict=True)}
    of_row = {id(job): _row_slots(day_slots[id(job)], summaries[id(job)], now) for job in jobs}
    wanted = [row.slots[i].run_id for row in of_row.values() for i in row.looked_up]
    wanted += [slots[-1].run_id for slots in (*day_slots.values(), *earlier.values()) if slots]
    records = ledger.lookup_many(list(dict.fromkeys(wanted)))
    rows = []
    for job in jobs:
        of_job, summary = of_row[id(job)], summaries[id(job)]
        counted = range(of_job.since, len(of_job.slots))
        facts = [of_job.facts[i] if i in of_job.facts else records.get(of_job.slots[i].run_id) for i in counted]
        statuses = [shown_status(of_job.slots[i], fact, now) for i, fact in zip(counted, facts, strict=True)]
        counts = {status: statuses.count(status) for status in COUNTED}
        ran_once, ran_more = ran_once_or_more_of(
            (status, fact.attempt if fact is not None else None) for status, fact in zip(statuses, facts, strict=True)
        )
        upcoming = slots_between([job], now, now + datetime.timedelta(days=366), limit=1)
        shown = of_job.slots or earlier.get(id(job), [])
        last = execution_document(shown[-1], records.get(shown[-1].run_id), now) if shown else None
        pause = current(job.pauses)
        streak = summary.mark.failure_streak if summary.mark else 0
        attention = bool(pause or streak or any(counts.values()))
        first = of_job.slots[of_job.since].schedule_time if of_job.slots else None
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
                # Over how long the counts are: the whole day, or from the oldest slot looked up.
                "counted_since": format_utc(first) if first is not None and of_job.since else None,
                "expected": sum(
                    status not in (ExecutionStatus.UNTRACKED, ExecutionStatus.UPCOMING) for status in statuses
                ),
                "ran_once": ran_once,
                "ran_more": ran_more,
                "duplicates": summary.duplicates(of_job.slots[i].schedule_time for i in counted),
                "streak": streak,
                "attention": attention,
            }
        )
    return sorted(rows, key=lambda row: (not row["attention"], row["scheduler_job"]))


def _row_slots(slots: list[Slot], summaries: JobSummaries, now: datetime.datetime) -> _RowSlots:
    """Which of a row's slots the summaries speak for, and which records to read: the newest
    ROW_SLOTS of those they do not (the row then counts from the oldest of them)."""
    facts: dict[int, RunDigest | None] = {}
    lacking = []
    for index, slot in enumerate(slots):
        digest = summaries.facts_of(slot, now)
        if digest is not None:
            facts[index] = digest
        else:
            lacking.append(index)
    looked_up = lacking[-ROW_SLOTS:]
    return _RowSlots(slots, facts, looked_up, looked_up[0] if len(lacking) > ROW_SLOTS else 0)
