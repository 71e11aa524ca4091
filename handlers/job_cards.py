"""The dashboard's job cards and night timeline: each job of jobs.yaml over the page's window.

A card counts its Scheduler jobs' slots of the window (``service.hours.judged_slots``, the same
counting as the rows), so the card and the rows never disagree; a job behind more than
CARD_SCHEDULER_JOBS Scheduler jobs leaves the counting to their rows (a fleet's job would read a
fleet's slots).  The timeline draws the same judged slots, one strip per job, aggregated into
buckets (an hour each for a day, wider for a longer window), each bucket reached through the
card's counts rather than a tab stop of its own.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from dedup.keys import format_utc
from handlers.job_rows import SHOWN_ORDER
from handlers.slot_statuses import STATUSES
from schedules.bound import BoundJob
from schedules.config import history_id, schedule_zone
from schedules.slots import RUNNABLE, ExecutionStatus, ran_once_or_more_of
from service.hours import UNREAD, JudgedJob, judged_slots
from service.state import AppState
from service.window import Window

CARD_SCHEDULER_JOBS = 25  # a card counts its Scheduler jobs' slots itself up to this many (a page of rows)
TO_RUN = 5  # the runnable slots a card names, newest first
BUCKETS_MAX = 48  # a strip's buckets at most: an hour each over a day, two hours over two days, ...
# A bucket is drawn as its most pressing status: the attention order first, then the rest.
DRAWN_FIRST = (
    ExecutionStatus.STUCK,
    ExecutionStatus.FAILED,
    ExecutionStatus.MISSED,
    ExecutionStatus.CONFLICT,
    ExecutionStatus.OVERDUE,
    ExecutionStatus.LATE,
    UNREAD,
    ExecutionStatus.IN_PROGRESS,
    ExecutionStatus.RELEASED,
    ExecutionStatus.DUE,
    ExecutionStatus.SKIPPED,
    ExecutionStatus.PAUSED,
    ExecutionStatus.EXCLUDED,
    ExecutionStatus.COVERED,
    ExecutionStatus.COMPLETED,
    ExecutionStatus.UNKNOWN,
    ExecutionStatus.UNTRACKED,
    ExecutionStatus.UPCOMING,
)


@dataclasses.dataclass(frozen=True)
class CardCounts:
    """A job's slots of the window by status (adding up to ``expected``), or None: too many
    Scheduler jobs to count here (``scheduler_jobs`` says how many)."""

    counts: dict[str, int] | None
    expected: int
    ran_once: int
    ran_more: int
    to_run: list[dict[str, Any]]
    strip: list[dict[str, Any]] | None
    scheduler_jobs: int
    uncounted: int = 0  # of its Scheduler jobs, those past the page's slot budget (not in the counts)
    # Its Scheduler jobs' exclusion windows over the strip: where each is drawn, and what it says.
    spans: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def job_cards(
    state: AppState,
    schedules_of_job: Mapping[str, Sequence[BoundJob]],
    window: Window,
    now: datetime.datetime,
    judged_by_id: Mapping[str, JudgedJob] | None = None,
) -> dict[str, CardCounts]:
    """Each job's counts of the window, every countable job's Scheduler jobs judged together
    (``judged_by_id``: judged already, by history id, with the page's rows)."""
    counted = [job for of_job in schedules_of_job.values() if len(of_job) <= CARD_SCHEDULER_JOBS for job in of_job]
    if judged_by_id is not None:
        judged = [judged_by_id[history_id(job.declared)] for job in counted]
    else:
        judged = judged_slots(state, counted, window.since, window.counted_until(now)) if counted else []
    by_target: dict[str, list[JudgedJob]] = {}
    for one in judged:
        by_target.setdefault(one.job.declared.target, []).append(one)
    buckets = _buckets(window, now)
    cards = {}
    for job_id, of_job in schedules_of_job.items():
        if len(of_job) > CARD_SCHEDULER_JOBS:
            cards[job_id] = CardCounts(None, 0, 0, 0, [], None, len(of_job))
            continue
        found = by_target.get(job_id, [])
        counts: Counter[str] = Counter()
        pairs: list[tuple[str, int | None]] = []
        runnable = []
        for judged_job in found:
            counts.update(judged_job.statuses)
            pairs += zip(judged_job.statuses, judged_job.attempts, strict=True)
            runnable += [
                (slot, status, attempt)
                for slot, status, attempt in zip(
                    judged_job.slots, judged_job.statuses, judged_job.attempts, strict=True
                )
                if status in RUNNABLE and status not in (ExecutionStatus.UNTRACKED, ExecutionStatus.STUCK)
            ]
        runnable.sort(key=lambda item: item[0].schedule_time, reverse=True)
        once, more = ran_once_or_more_of(pairs)
        cards[job_id] = CardCounts(
            {status: counts[status] for status in SHOWN_ORDER if counts[status]},
            sum(counts.values()),
            once,
            more,
            [
                {
                    "schedule_time": format_utc(slot.schedule_time),
                    "status": status,
                    "scheduler_job": slot.job.name,
                    "project": slot.job.project,
                    "location": slot.job.location,
                    "attempt": attempt or 0,
                }
                for slot, status, attempt in runnable[:TO_RUN]
            ],
            _strip(found, buckets) if of_job else None,
            len(of_job),
            sum(1 for judged_job in found if not judged_job.counted),
            _spans(of_job, buckets),
        )
    return cards


def _spans(
    of_job: Sequence[BoundJob], buckets: list[tuple[datetime.datetime, datetime.datetime]]
) -> list[dict[str, Any]]:
    """The exclusion windows of a job's Scheduler jobs that overlap its strip, each as the strip
    draws it: from where to where in the strip's units (10 a bucket), and in words."""
    if not buckets:
        return []
    first, last = buckets[0][0], buckets[-1][1]
    width = (buckets[0][1] - buckets[0][0]).total_seconds() or 1.0
    spans = []
    for job in of_job:
        zone = schedule_zone(job.declared.time_zone)
        for window in job.declared.exclude:
            for begins, ends in window.occurrences(first, last, zone):
                start, stop = max(begins, first), min(ends, last)
                label = f"{job.declared.name}: excluded from {begins:%Y-%m-%d %H:%M} to {ends:%Y-%m-%d %H:%M} UTC"
                spans.append(
                    {
                        "since": format_utc(begins),
                        "until": format_utc(ends),
                        "x": round((start - first).total_seconds() / width * 10, 3),
                        "width": round((stop - start).total_seconds() / width * 10, 3),
                        "label": label + (f" ({window.note})" if window.note else ""),
                    }
                )
    return sorted(spans, key=lambda span: span["x"])


def _buckets(window: Window, now: datetime.datetime) -> list[tuple[datetime.datetime, datetime.datetime]]:
    """The window cut into at most BUCKETS_MAX buckets of whole hours, the first from the hour the
    window starts in (a bucket then reads as "03:00", not "03:27")."""
    hours = max(1, -(-int(window.span.total_seconds()) // 3600))
    width = datetime.timedelta(hours=max(1, -(-hours // BUCKETS_MAX)))
    found, start = [], window.since.replace(minute=0, second=0, microsecond=0)
    while start < window.until:
        found.append((start, min(start + width, window.until)))
        start += width
    return found


def _strip(
    found: Sequence[JudgedJob], buckets: list[tuple[datetime.datetime, datetime.datetime]]
) -> list[dict[str, Any]]:
    """A job's strip: each bucket's slots by status, drawn as the most pressing of them."""
    counted: list[Counter[str]] = [Counter() for _ in buckets]
    starts = [start for start, _ in buckets]
    for judged_job in found:
        index = 0
        for slot, status in zip(judged_job.slots, judged_job.statuses, strict=True):
            while index + 1 < len(starts) and slot.schedule_time >= starts[index + 1]:
                index += 1
            counted[index][status] += 1
    strip = []
    for (start, end), counts in zip(buckets, counted, strict=True):
        drawn = next((status for status in DRAWN_FIRST if counts[status]), None)
        words = ", ".join(f"{status} {counts[status]}" for status in SHOWN_ORDER if counts[status]) or "no slot"
        # Plain text (an attribute's and a title's): UTC, as the page's other times are written.
        label = f"{start:%Y-%m-%d %H:%M} to {end:%H:%M} UTC: {words}"
        strip.append({"since": format_utc(start), "until": format_utc(end), "drawn": drawn, "label": label})
    return strip


def strip_colour(status: str | None) -> str:
    """A bucket's fill: its drawn status's colour (the legend's), grey for unread, none for an empty one."""
    if status is None:
        return "#ffffff"
    if status == UNREAD:
        return "#57606a"
    return STATUSES[ExecutionStatus(status)].colour
