"""A Scheduler job as the app knows it at run time: what scheduler.yaml says, and what the app learned.

``SchedulerJob`` (schedules.config) is the file's entry and nothing more.  What the app learns
later (how long the ledger remembers the job's runs, from when its slots are expected, its
schedule history, its pauses) is held beside it here, never patched into it.  A ``BoundJob``
is built in one place, ``schedules.history.bind``.
"""

from __future__ import annotations

import dataclasses
import datetime

from schedules.config import SchedulerJob
from schedules.intervals import EarlierSchedule, Pause


@dataclasses.dataclass(frozen=True)
class BoundJob:
    """A declared Scheduler job bound to what the app learned of it; a field left at its default
    was not learned (a file read alone: no horizon, every slot expected, no pause known)."""

    declared: SchedulerJob
    # How long the ledger remembers a run of the job: its target's retention_seconds (jobs.yaml).
    retention_seconds: float | None = None
    # From when slots are expected of the app: scheduler.yaml's start_at, else when the app first
    # knew the job (schedules.history).
    expected_from: datetime.datetime | None = None
    # When the current schedule took effect (first seen), and the schedules before it.
    schedule_since: datetime.datetime | None = None
    earlier: tuple[EarlierSchedule, ...] = ()
    # The intervals the job was paused, oldest first, as read for this request; () unread or none.
    pauses: tuple[Pause, ...] = ()
