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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from google.cloud import ndb

from dedup.clock import Clock
from dedup.keys import format_utc, parse_rfc3339
from dedup.record_store import RecordStore
from dedup.store import Store, Transaction
from dedup.transactions import COMMIT_BATCH, get_many, transact
from jobs.config import JobSpec
from models.audit import AuditMark
from models.schedule_history import ScheduleHistory
from schedules.bound import BoundJob
from schedules.config import SchedulerJob, history_id
from schedules.intervals import EarlierSchedule, Pause
from schedules.pauses import FILE_PRINCIPAL, change_pause, load_pauses, paused, resumed
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


def bind(
    job: SchedulerJob,
    versions: Sequence[ScheduleVersion],
    retention_seconds: float | None = None,
    pauses: Sequence[Pause] = (),
) -> BoundJob:
    """``job`` as the app knows it: how long its runs are remembered, when its slots are expected
    from, when its schedule took effect and the schedules before, and its pauses.  The one place
    a BoundJob is built."""
    earlier = tuple(
        EarlierSchedule(old.schedule, old.time_zone, old.since, new.since)
        for old, new in zip(versions, versions[1:], strict=False)
    )
    return BoundJob(
        job,
        retention_seconds=retention_seconds,
        expected_from=job.start_at or versions[0].since,
        schedule_since=versions[-1].since if earlier else None,
        earlier=earlier,
        pauses=tuple(pauses),
    )


FilePause = Callable[[SchedulerJob, bool], None]  # makes Cloud Scheduler match the file's paused


def record_schedules(
    jobs: Sequence[SchedulerJob],
    now: datetime.datetime,
    on_file_pause: FilePause | None = None,
    store: Store | None = None,
) -> dict[str, list[ScheduleVersion]]:
    """Record any schedule not seen before, and return each job's history, by history id.

    ``store``: default Datastore's, in the current NDB context.  One batched lookup; one batched
    write when something is new.
    """
    if not jobs:
        return {}
    store = store or RecordStore.of_context()
    keys = [ndb.Key(ScheduleHistory, history_id(job)) for job in jobs]
    marks = [ndb.Key(AuditMark, history_id(job)) for job in jobs]
    fetched = get_many(store, keys + marks)  # one batch
    stored, audited = fetched[: len(keys)], fetched[len(keys) :]
    changed = []
    histories = {}
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
        histories[history_id(job)] = versions
    # Nothing read: blind writes, each batch one commit, at most COMMIT_BATCH entities (a first
    # deploy of a large fleet writes every history at once).
    for first in range(0, len(changed), COMMIT_BATCH):
        transact(_put_all(changed[first : first + COMMIT_BATCH]), HISTORY_PATIENCE_SECONDS, store)
    return histories


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
    """scheduler.yaml's jobs and what the app learned of them: their histories, recorded once per
    process, their targets' retention (jobs.yaml), and their pauses, read when asked.

    The first request that needs the schedules bound (a delivery, a listing, a page, an audit
    pass) records them; building the app needs no Datastore.  If Datastore cannot be reached
    then, that request fails as any request does while Datastore is down, and the next one
    records them.
    """

    def __init__(
        self,
        declared: tuple[SchedulerJob, ...],
        clock: Clock,
        on_file_pause: FilePause | None = None,
        app_jobs: Mapping[str, JobSpec] | None = None,
    ) -> None:
        self.declared = declared
        self._clock = clock
        self._on_file_pause = on_file_pause
        self._app_jobs = app_jobs or {}
        self._histories: dict[str, list[ScheduleVersion]] | None = None if declared else {}
        self._tracked: tuple[BoundJob, ...] | None = None if declared else ()
        self._lock = threading.Lock()

    def get(self) -> tuple[BoundJob, ...]:
        """Every declared job bound to its history and retention, its pauses unread (needs an NDB
        context the first time)."""
        tracked_jobs = self._tracked
        if tracked_jobs is not None:
            return tracked_jobs
        with self._lock:
            if self._tracked is None:
                histories = record_schedules(self.declared, self._clock.now(), self._on_file_pause)
                self._histories = histories
                self._tracked = tuple(self._bind(job, histories) for job in self.declared)
            return self._tracked

    def bound(self, jobs: Iterable[SchedulerJob]) -> list[BoundJob]:
        """``jobs`` (declared ones) bound to their history and retention and to their pauses, read
        now in one batched lookup (after the histories: a file's ``paused`` is applied first)."""
        self.get()
        histories = self._histories
        assert histories is not None  # recorded by get
        jobs = list(jobs)
        pauses = load_pauses(jobs)
        return [self._bind(job, histories, pauses[history_id(job)]) for job in jobs]

    def _bind(
        self, job: SchedulerJob, histories: Mapping[str, Sequence[ScheduleVersion]], pauses: Sequence[Pause] = ()
    ) -> BoundJob:
        return bind(job, histories[history_id(job)], retention_of(job, self._app_jobs), pauses)


def retention_of(job: SchedulerJob, app_jobs: Mapping[str, JobSpec]) -> float | None:
    """How long the ledger remembers a run of ``job``: its target's retention_seconds (jobs.yaml);
    None when the file is not bound to jobs.yaml (no horizon is known)."""
    spec = app_jobs.get(job.target)
    return spec.policy.retention_seconds if spec is not None else None
