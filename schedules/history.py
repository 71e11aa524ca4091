"""A Scheduler job's schedule history: when its slots are expected from, and when each change took effect.

The app expects a slot of a Scheduler job only from when it first knew the job's
schedule: first seen in scheduler.yaml (the first process to load it records the
time), or the job's explicit ``start_at``.  A slot before that time was never
expected of this app, so it is ``untracked``, never ``missed``: a fresh deploy pages
no one for the day before it.  A changed schedule takes effect from when the change
was first seen; slots of the old schedule before then keep their old meaning.

Recording is one batched lookup per process, and one batched write when something is new,
blind (a commit that reads nothing first), both through the store: two processes starting
together write the same version within moments of each other, and the earlier ``since`` of two
equal neighbours is kept.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from collections.abc import Callable, Sequence
from typing import Any

from google.cloud import ndb

from dedup.clock import Clock
from dedup.keys import format_utc, parse_rfc3339
from dedup.record_store import RecordStore
from dedup.store import Store, Transaction
from dedup.transactions import get_many, transact
from models.audit import AuditMark
from models.schedule_history import ScheduleHistory
from schedules.config import EarlierSchedule, SchedulerJob, history_id
from schedules.pauses import FILE_PRINCIPAL, change_pause, paused, resumed
from schedules.slots import Slot

# Recording the schedules is a start-up's first request: a few seconds of retries at most.
HISTORY_PATIENCE_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class ScheduleVersion:
    """A schedule a Scheduler job had from ``since`` (when the app first saw it) on."""

    schedule: str
    time_zone: str
    since: datetime.datetime

    def document(self) -> dict[str, str]:
        return {"schedule": self.schedule, "time_zone": self.time_zone, "since": format_utc(self.since)}

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> ScheduleVersion:
        return cls(document["schedule"], document["time_zone"], parse_rfc3339(document["since"], "since"))

    def same_schedule(self, job: SchedulerJob) -> bool:
        return (self.schedule, self.time_zone) == (job.schedule, job.time_zone)


def seen(versions: Sequence[ScheduleVersion], job: SchedulerJob, now: datetime.datetime) -> list[ScheduleVersion]:
    """The versions once ``job``'s schedule is seen at ``now``: unchanged unless it is new."""
    merged: list[ScheduleVersion] = []
    for version in sorted(versions, key=lambda v: v.since):
        if merged and merged[-1].schedule == version.schedule and merged[-1].time_zone == version.time_zone:
            continue  # two processes recorded one change: the first sighting counts
        merged.append(version)
    if not merged or not merged[-1].same_schedule(job):
        merged.append(ScheduleVersion(job.schedule, job.time_zone, now))
    return merged


def tracked(job: SchedulerJob, versions: Sequence[ScheduleVersion]) -> SchedulerJob:
    """``job`` bound to its history: when its slots are expected from, when its schedule took effect,
    and the schedules before."""
    earlier = tuple(
        EarlierSchedule(old.schedule, old.time_zone, old.since, new.since)
        for old, new in zip(versions, versions[1:], strict=False)
    )
    first_seen = versions[0].since
    return dataclasses.replace(
        job,
        expected_from=job.start_at or first_seen,
        schedule_since=versions[-1].since if earlier else None,
        earlier=earlier,
    )


FilePause = Callable[[SchedulerJob, bool], None]  # makes Cloud Scheduler match the file's paused


def record_schedules(
    jobs: Sequence[SchedulerJob],
    now: datetime.datetime,
    on_file_pause: FilePause | None = None,
    store: Store | None = None,
) -> tuple[SchedulerJob, ...]:
    """Record any schedule not seen before, and return the jobs bound to their histories.

    ``store``: default Datastore's, in the current NDB context.  One batched lookup; one batched
    write when something is new.
    """
    if not jobs:
        return ()
    store = store or RecordStore.of_context()
    keys = [ndb.Key(ScheduleHistory, history_id(job)) for job in jobs]
    marks = [ndb.Key(AuditMark, history_id(job)) for job in jobs]
    fetched = get_many(store, keys + marks)  # one batch
    stored, audited = fetched[: len(keys)], fetched[len(keys) :]
    changed = []
    bound = []
    for job, key, entity, mark in zip(jobs, keys, stored, audited, strict=True):
        before = [ScheduleVersion.from_document(v) for v in entity.versions] if entity else []
        versions = seen(before, job, now if before or mark is None else known_since(job, mark, now))
        file_paused = entity.file_paused if entity else None
        if job.paused is not None and job.paused != file_paused:
            apply_file_pause(job, now, store)  # before the flag is stored: a failure here is tried again
            if on_file_pause is not None:
                on_file_pause(job, job.paused)
            file_paused = job.paused
        if versions != before or file_paused != (entity.file_paused if entity else None):
            changed.append(ScheduleHistory(key=key, versions=[v.document() for v in versions], file_paused=file_paused))
        bound.append(tracked(job, versions))
    if changed:
        transact(_put_all(changed), HISTORY_PATIENCE_SECONDS, store)  # nothing read: one commit
    return tuple(bound)


def _put_all(entities: list[ScheduleHistory]) -> Callable[[Transaction], None]:
    def put(transaction: Transaction) -> None:
        for entity in entities:
            transaction.put(entity)

    return put


def known_since(job: SchedulerJob, mark: AuditMark, now: datetime.datetime) -> datetime.datetime:
    """When an app from before schedule histories already expected the job's slots: the audit had
    judged them up to its mark, so the slots whose windows close after it are expected still."""
    window = Slot(job, now).window_closes - now
    checked_until: datetime.datetime = mark.checked_until
    return min(now, checked_until - window)


def apply_file_pause(job: SchedulerJob, now: datetime.datetime, store: Store | None = None) -> None:
    """scheduler.yaml's ``paused: true`` (or ``false``), applied when a version that says so first runs.

    Idempotent: a job paused already stays paused with its first note."""
    if job.paused:
        change_pause(job, lambda pauses: paused(pauses, now, FILE_PRINCIPAL, job.note), store)
    else:
        change_pause(job, lambda pauses: resumed(pauses, now, FILE_PRINCIPAL), store)


class TrackedSchedules:
    """scheduler.yaml's jobs bound to their histories, recorded once per process.

    The first request that needs the schedules (a delivery, a listing, a page, an audit pass)
    records them; building the app needs no Datastore.  If Datastore cannot be reached then,
    ``get`` raises, that request fails as any request does while Datastore is down, and the
    next one records them.
    """

    def __init__(
        self, declared: tuple[SchedulerJob, ...], clock: Clock, on_file_pause: FilePause | None = None
    ) -> None:
        self.declared = declared
        self._clock = clock
        self._on_file_pause = on_file_pause
        self._tracked: tuple[SchedulerJob, ...] | None = None if declared else ()
        self._lock = threading.Lock()

    def get(self) -> tuple[SchedulerJob, ...]:
        """The jobs bound to their histories (needs an NDB context the first time)."""
        tracked_jobs = self._tracked
        if tracked_jobs is not None:
            return tracked_jobs
        with self._lock:
            if self._tracked is None:
                self._tracked = record_schedules(self.declared, self._clock.now(), self._on_file_pause)
            return self._tracked
