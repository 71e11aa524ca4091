"""The dashboard's home rows: one per Scheduler job, as Cloud Scheduler's console shows them,
plus what only this app knows (issue 25 §1, issue 39).

A row says the schedule and its time zone, the job's state (enabled, or paused with who and
why), its last expected execution and that execution's status, its next one (none while
paused), every slot of the page's window by status (they add up to the slots expected, at any
frequency), and its failure streak.  Rows that need attention sort first.  A row costs no round
trip of its own: every row's day summaries are read in one lookup and the slots they do not
speak for in another (``service.hours.judged_slots``, capped page-wide).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from dedup.keys import format_utc
from handlers.slot_statuses import LEGEND, NEEDS_ATTENTION
from schedules.attention import needing_attention
from schedules.bound import BoundJob
from schedules.config import history_id
from schedules.pauses import current
from schedules.slots import latest_slots, ran_once_or_more_of, shown_status, slots_between
from service.audits import audit_shares
from service.hours import UNREAD, JudgedJob, judged_slots
from service.state import AppState
from service.window import Window, window_of

# A row's counts: the legend's statuses in its order, and last the slots whose records went unread.
SHOWN_ORDER = (*(status for status, _ in LEGEND), UNREAD)
# What makes a row need attention (handlers/slot_statuses.py).
COUNTED = NEEDS_ATTENTION
# The rows a page shows: what a person reads at once, and what bounds a page's reads whatever the fleet.
ROWS_PER_PAGE = 25
# The longest search a page takes: a Scheduler job's name is at most 500 characters.
SEARCH_MAX = 500


@dataclasses.dataclass(frozen=True)
class RowPage:
    """One page of home rows: those that need attention first (by index, schedules.attention),
    then by name; of the Scheduler jobs whose name holds ``search`` (case aside).  ``shown``:
    the page's Scheduler jobs, pauses unread (the page binds them with the rest it shows)."""

    shown: list[BoundJob]
    number: int  # 1-based
    pages: int
    total: int  # the Scheduler jobs the search found
    first: int  # of those, how many the index puts first (attention)


class PageOutOfRange(ValueError):
    """A page number past the pages the rows make (a bad link, or a fleet that shrank)."""


def row_page(
    state: AppState,
    now: datetime.datetime,
    number: int,
    search: str = "",
    job_id: str | None = None,
) -> RowPage:
    """Page ``number`` of the home rows: the audit shares' attention for the order
    (schedules.attention), whatever the number of Scheduler jobs; ``job_rows`` makes its rows.
    PageOutOfRange past the last."""
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
    leading = sum(1 for job in found if history_id(job.declared) in first)
    return RowPage(shown, number, pages, len(found), leading)


def job_rows(
    state: AppState,
    jobs: Sequence[BoundJob],
    now: datetime.datetime,
    window: Window | None = None,
    judged_by_id: Mapping[str, JudgedJob] | None = None,
) -> list[dict[str, Any]]:
    """A row per Scheduler job (bound to its pauses), those that need attention first, then by name.

    Every slot of the window up to now is counted, whatever the job's frequency, so the counts add
    up to the slots expected (``service.hours.judged_slots``: the summaries, then the records they
    do not speak for, capped page-wide).  Each job's last slot is the window's last when the window
    reaches now; else its record is read with the others' in one more lookup.  ``judged_by_id``:
    the jobs' slots judged already (by history id), with the page's other slots."""
    window = window or window_of({}, state.night, now)
    if judged_by_id is not None:
        judged = [judged_by_id[history_id(job.declared)] for job in jobs]
    else:
        judged = judged_slots(state, jobs, window.since, window.counted_until(now))
    latest = {id(job): latest_slots([job], now, 1) for job in jobs}
    outside = [
        slots[0]
        for found in judged
        if (slots := latest[id(found.job)])
        and (not found.slots or found.slots[-1].schedule_time != slots[0].schedule_time)
    ]
    records = state.ledger.lookup_many([slot.run_id for slot in outside]) if outside else {}
    rows = []
    for found in judged:
        job, summary = found.job, found.summaries
        counts = found.counts()
        ran_once, ran_more = ran_once_or_more_of(zip(found.statuses, found.attempts, strict=True))
        # The next slot after now (one at now is the row's last expected, due).
        after_now = now + datetime.timedelta(microseconds=1)
        upcoming = slots_between([job], after_now, now + datetime.timedelta(days=366), limit=1)
        last_slot = latest[id(job)][0] if latest[id(job)] else None
        if last_slot is None:
            last = None
        elif found.slots and found.slots[-1].schedule_time == last_slot.schedule_time:
            last = {"schedule_time": format_utc(last_slot.schedule_time), "status": found.statuses[-1]}
        else:
            record = records.get(last_slot.run_id)
            last = {
                "schedule_time": format_utc(last_slot.schedule_time),
                "status": str(shown_status(last_slot, record, now)),
            }
        pause = current(job.pauses)
        streak = summary.mark.failure_streak if summary.mark else 0
        attention = bool(pause or streak or any(counts[status] for status in COUNTED))
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
                # A paused job has no next run until it is resumed: the row says so, not a time.
                "next": format_utc(upcoming[0].schedule_time) if upcoming and not pause else None,
                # Every status the window's slots came to, in the legend's order: they add up to "expected".
                "counts": {status: counts[status] for status in SHOWN_ORDER if counts[status]},
                "expected": len(found.slots),
                "ran_once": ran_once,
                "ran_more": ran_more,
                "duplicates": summary.duplicates(slot.schedule_time for slot in found.slots),
                "streak": streak,
                "attention": attention,
                # Past what one page judges (service.hours.SLOT_BUDGET): no count, and the row says so.
                "uncounted": not found.counted,
            }
        )
    return sorted(rows, key=lambda row: (not row["attention"], row["scheduler_job"]))
