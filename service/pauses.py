"""Pauses: a Scheduler job paused and resumed, in the app's record and in Cloud Scheduler,
and the catch-up of a pause's slots that never ran.

``pause_schedule`` and ``resume_schedule`` are the operator's actions, whichever surface asks
(the API, the dashboard's forms); ``failure_streak_pause`` is the audit's own pause."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dedup.keys import format_utc
from dispatch import Dispatched, DispatchError
from models import RunStatus
from schedules.bound import BoundJob
from schedules.config import SchedulerJob
from schedules.metrics import Source, count_left_paused
from schedules.pauses import (
    Pause,
    PauseRefused,
    change_pause,
    check_note,
    current,
    mark_counted,
    paused,
    pauses_of,
    resumed,
)
from schedules.slots import ExecutionStatus, Slot, execution_status, latest_slots, slot_pages
from service.compaction import COMPACT_MAX_SLOTS, Compacted, CompactionRefused, NothingToCompact, compact
from service.errors import Invalid, NotFound
from service.principal import Principal
from service.slots import NO_SCHEDULE, external_of, slot_run_work, spread_seconds
from service.state import AppState

log = logging.getLogger(__name__)


def scheduler_job_named(state: AppState, name: str, project: str | None, location: str | None) -> SchedulerJob:
    """The declared Scheduler job ``name`` (in ``project`` and ``location`` when several share it):
    NotFound when there is none, Invalid when the choice is ambiguous."""
    if not state.schedules:
        raise NotFound(NO_SCHEDULE)
    # Bound first, as every first use of the schedules is: a file's own ``paused`` is applied before
    # the operator's pause or resume, never after it (which would undo it).
    found = [
        job
        for job in (bound.declared for bound in state.bound_schedules)
        if job.name == name and project in (None, job.project) and location in (None, job.location)
    ]
    if not found:
        raise NotFound(f"no Scheduler job {name!r} is declared in scheduler.yaml")
    if len(found) > 1:
        places = ", ".join(sorted(f"{job.project}/{job.location}" for job in found))
        raise Invalid(
            f"Scheduler job {name!r} is declared in several places ({places}): choose with project and location"
        )
    return found[0]


@dataclasses.dataclass(frozen=True)
class PauseChange:
    """What a pause or resume did: the job's pause after it, whether it changed, and Cloud Scheduler's part."""

    job: SchedulerJob
    pause: Pause | None  # the lasting pause; None once resumed
    changed: bool
    scheduler_problem: str | None  # why Cloud Scheduler's job was not paused or resumed, with the command

    def document(self) -> dict[str, Any]:
        return {
            "scheduler_job": self.job.name,
            "project": self.job.project,
            "location": self.job.location,
            "paused": self.pause is not None,
            "pause": self.pause.document() if self.pause else None,
            "changed": self.changed,
        }


def set_schedule_paused(
    state: AppState, principal: Principal, job: SchedulerJob, pause: bool, note: str | None = None
) -> PauseChange:
    """Pause (or resume) ``job`` in the app's record, then in Cloud Scheduler.

    The record comes first: a pause Scheduler missed still keeps its slots from being
    called missed (and a delivery during it runs, saying so); a resume Scheduler missed
    lets the audit report the slots it then misses.  Both are idempotent, so a request
    sent again after a lost answer or a Scheduler failure only does what is left.
    """
    now = state.clock.now()
    seen: list[list[Pause]] = []

    def change(pauses: list[Pause]) -> list[Pause]:
        seen.append(pauses)
        return paused(pauses, now, principal.name, note) if pause else resumed(pauses, now, principal.name)

    after = change_pause(job, change)
    problem = state.scheduler_api.set_paused(job, pause)
    # A pause and a resume at once (two clicks, two operators) may reach Scheduler in the other
    # order than the record: make Scheduler match the record as it stands now.
    standing = current(pauses_of(job))
    if (standing is not None) != pause:
        problem = state.scheduler_api.set_paused(job, standing is not None)
        after = [standing] if standing else []
    return PauseChange(job, current(after), after != seen[-1], problem)


def last_pause(job: BoundJob) -> Pause | None:
    """The job's most recent pause interval, lasting or ended."""
    return job.pauses[-1] if job.pauses else None


CATCH_UP = ("none", "latest", "all", "compact")


@dataclasses.dataclass(frozen=True)
class CaughtUp:
    """A slot a catch-up dispatched: its time, its run id, and the task (``already``: dispatched before)."""

    slot: Slot
    dispatched: Dispatched

    def document(self) -> dict[str, Any]:
        return {
            "schedule_time": format_utc(self.slot.schedule_time),
            "run_id": self.slot.run_id,
            "task_id": self.dispatched.task_id,
            "already_dispatched": self.dispatched.already,
        }


# The slots a catch-up's answer names of those its cap left (the newest of them, next to what ran).
LEFT_LISTED = 100


@dataclasses.dataclass(frozen=True)
class LeftByCap:
    """The slots a catch-up left as they are because the job's max_catchup_runs was reached: how
    many, the first and last of them (the newest were run), and which (LEFT_LISTED at most)."""

    count: int
    first: datetime.datetime
    last: datetime.datetime
    cap: int
    words: str = "catch-up cap: max_catchup_runs is"
    listed: tuple[datetime.datetime, ...] = ()

    @classmethod
    def of(cls, left: Sequence[Slot], cap: int, words: str = "catch-up cap: max_catchup_runs is") -> LeftByCap:
        times = [slot.schedule_time for slot in left]
        return cls(len(times), times[0], times[-1], cap, words, tuple(times[-LEFT_LISTED:]))

    def document(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "first": format_utc(self.first),
            "last": format_utc(self.last),
            "slots": [format_utc(time) for time in self.listed],
            "reason": f"{self.words} {self.cap}, the newest ran",
        }


@dataclasses.dataclass(frozen=True)
class CatchUpDone:
    """What a resume's catch-up dispatched (``caught_up``), what the cap left (``left_by_cap``),
    and for ``compact`` what the one run stands for."""

    caught_up: list[CaughtUp]
    left_by_cap: LeftByCap | None = None
    compacted: Compacted | None = None


def catch_up(state: AppState, principal: Principal, job: BoundJob, interval: Pause, mode: str) -> CatchUpDone:
    """Dispatch the slots of a pause ``interval`` that never ran: none, the latest, all of them
    or one run standing for all (``compact``: service.compaction), as far back as the job's
    catchup_window, and at most its max_catchup_runs, the newest; the older are left ``paused``
    (and said).  Each runs under its own key, so a late Scheduler retry of a caught-up slot is
    the same run; the queue refuses the same catch-up twice."""
    if mode == "none":
        return CatchUpDone([])
    if mode == "compact":
        return _compact_pause(state, principal, job, interval)
    now = state.clock.now()
    since = max(interval.since, now - datetime.timedelta(seconds=job.declared.catchup_window))
    until = min(interval.until or now, now)
    pages: Iterable[list[Slot]]
    if mode == "latest":
        # The pause's newest slot, read from the newest end: only that one, and only while it has
        # not run, so the resume sent again after it ran takes no older slot in its place.
        newest = latest_slots([job], until - datetime.timedelta(microseconds=1), 1)
        pages = [[slot for slot in newest if slot.schedule_time >= since]]
    else:
        pages = slot_pages([job], since, until)  # the whole range, however many slots: none left unjudged
    # The catch-up's share of the pause: the slots that never ran, and those run since it ended
    # (this catch-up's runs, sent before).  The cap counts both, so a resume sent again after its
    # tasks ran finds the same newest slots, done, and takes no older ones in their place.
    share: list[tuple[Slot, int | None]] = []  # a slot, and the attempt it was seen at (None: it ran)
    for slots in pages:
        records = state.ledger.lookup_many([slot.run_id for slot in slots])
        for slot in slots:
            record = records.get(slot.run_id)
            if execution_status(slot, record, now) == ExecutionStatus.PAUSED:
                share.append((slot, record.attempt if record else 0))
            elif record is not None and interval.until is not None and record.created >= interval.until:
                share.append((slot, None))
    cap = job.declared.max_catchup_runs
    left = [(slot, seen) for slot, seen in share[:-cap] if seen is not None]
    external = external_of(state, job.declared.target)
    delay = spread_seconds(job.declared)
    caught_up = [
        CaughtUp(
            slot,
            state.dispatcher.dispatch(
                slot_run_work(job.declared.target, slot, seen, principal.name, external=external, delay_seconds=delay)
            ),
        )
        for slot, seen in share[-cap:]
        if seen is not None
    ]
    if not left:
        return CatchUpDone(caught_up)
    return CatchUpDone(caught_up, LeftByCap.of([slot for slot, _ in left], cap))


def _compact_pause(state: AppState, principal: Principal, job: BoundJob, interval: Pause) -> CatchUpDone:
    """``compact``: the pause's slots that never ran, covered by one run of the newest
    (service.compaction).  Sent again, it finds that run still standing for them (a released
    record listing them) and dispatches it again, covering what it had not; once the run has
    begun, nothing is left to do."""
    now = state.clock.now()
    since = max(interval.since, now - datetime.timedelta(seconds=job.declared.catchup_window))
    never_ran: list[tuple[Slot, int]] = []
    covered_into: dict[str, list[Slot]] = {}
    for slots in slot_pages([job], since, min(interval.until or now, now)):
        records = state.ledger.lookup_many([slot.run_id for slot in slots])
        for slot in slots:
            record = records.get(slot.run_id)
            status = execution_status(slot, record, now)
            standing = record is not None and record.status == RunStatus.RELEASED and bool(record.covers)
            if status == ExecutionStatus.PAUSED or standing:
                never_ran.append((slot, record.attempt if record else 0))
            elif status == ExecutionStatus.COVERED and record is not None:
                covered_into.setdefault(record.compacted_into, []).append(slot)
    if not never_ran:
        return CatchUpDone([])
    try:
        done = compact(state, principal.name, job, never_ran)
    except NothingToCompact:
        return CatchUpDone([])  # its run began meanwhile: it stands for what was covered
    if done.error is not None or done.dispatched is None:
        raise done.error or DispatchError("the queue did not take the compacted run")
    covered = sorted([*covered_into.get(done.slot.run_id, ()), *done.covered], key=lambda slot: slot.schedule_time)
    left = LeftByCap.of(done.left, COMPACT_MAX_SLOTS, "compaction limit: a compacted run covers") if done.left else None
    return CatchUpDone([CaughtUp(done.slot, done.dispatched)], left, dataclasses.replace(done, covered=covered))


def catch_up_preview(state: AppState, job: SchedulerJob) -> tuple[int, int]:
    """What a resume's catch-up would run now: (all, latest), read as ``catch_up`` reads them: the
    slots of the job's lasting pause, as far back as its catchup_window, still ``paused`` (never
    run), page by page however many; "latest" runs the newest slot only if it is one of them."""
    [bound] = state.with_pauses([job])
    lasting = current(bound.pauses)
    if lasting is None:
        return 0, 0
    now = state.clock.now()
    since = max(lasting.since, now - datetime.timedelta(seconds=job.catchup_window))
    every, newest = 0, False
    for slots in slot_pages([bound], since, now):
        records = state.ledger.lookup_many([slot.run_id for slot in slots])
        statuses = [execution_status(slot, records.get(slot.run_id), now) for slot in slots]
        every += statuses.count(ExecutionStatus.PAUSED)
        if statuses:
            newest = statuses[-1] == ExecutionStatus.PAUSED
    return every, int(newest)


FAILURE_STREAK_PRINCIPAL = "failure-streak"  # who paused a job its pause_after_consecutive_failures paused


def failure_streak_pause(state: AppState) -> Callable[[SchedulerJob, str], bool]:
    """The audit's pause (schedules.audit.Pause): the job paused in the app and in Cloud Scheduler."""

    def pause(job: SchedulerJob, note: str) -> bool:
        who = Principal.named(FAILURE_STREAK_PRINCIPAL)
        try:  # never raises: the audit's mark has moved, and its lines must still be written
            change = set_schedule_paused(state, who, job, True, note)
        except Exception:
            log.exception("%s could not be paused after its failure streak", job.name)
            return False
        if change.scheduler_problem:
            log.error("%s: %s", job.name, change.scheduler_problem, extra={"scheduler_job": job.name})
        return change.pause is not None

    return pause


@dataclasses.dataclass(frozen=True)
class ScheduleChangeRequest:
    """An operator's pause or resume of a Scheduler job as any surface asks it: the job (its
    ``project`` and ``location`` where several share the name), the pause's note, the resume's
    catch-up (``CATCH_UP``), each as sent: the service checks them."""

    name: str
    project: str | None = None
    location: str | None = None
    note: Any = None
    catch_up: Any = "none"


@dataclasses.dataclass(frozen=True)
class ScheduleChanged:
    """What a pause or resume did: the change, the slots its catch-up dispatched (None for a
    pause), and why the queue did not take the catch-up, if it did not."""

    change: PauseChange
    caught_up: list[CaughtUp] | None = None
    not_dispatched: DispatchError | None = None
    left_by_cap: LeftByCap | None = None  # the slots the catch-up's cap left paused
    compacted: Compacted | None = None  # catch_up compact: what its one run stands for


def pause_schedule(state: AppState, principal: Principal, ask: ScheduleChangeRequest) -> ScheduleChanged:
    """Pause the Scheduler job ``ask`` names: idempotent (pausing a paused job changes nothing).
    Invalid for a note that cannot be kept; NotFound, Invalid: ``scheduler_job_named``'s."""
    try:
        note = check_note(ask.note)
    except PauseRefused as refused:
        raise Invalid(refused.message) from None
    job = scheduler_job_named(state, ask.name, ask.project, ask.location)
    return ScheduleChanged(set_schedule_paused(state, principal, job, True, note))


def resume_schedule(state: AppState, principal: Principal, ask: ScheduleChangeRequest) -> ScheduleChanged:
    """Resume the Scheduler job ``ask`` names, then dispatch its pause's slots that never ran as
    ``ask.catch_up`` says.  Sent again, it only does what is left: the pause that just ended (or
    an earlier one) is caught up again, and the queue refuses the tasks it took before."""
    if ask.catch_up not in CATCH_UP:
        raise Invalid(f"catch_up must be one of {', '.join(CATCH_UP)}")
    job = scheduler_job_named(state, ask.name, ask.project, ask.location)
    if ask.catch_up == "compact" and external_of(state, job.target) is not None:
        raise Invalid(str(CompactionRefused.of(job.target)))  # refused before anything changes
    change = set_schedule_paused(state, principal, job, False)
    [bound] = state.with_pauses([job])
    interval = last_pause(bound)
    try:
        done = catch_up(state, principal, bound, interval, str(ask.catch_up)) if interval else CatchUpDone([])
    except DispatchError as exc:
        return ScheduleChanged(change, None, exc)
    if interval is not None and interval.until is not None and not interval.counted:
        # The first resume whose catch-up went out decides what it left: paused (once, marked on
        # the interval: a resume sent again after a queue's failure counts then, and only then).
        if mark_counted(job, interval.since):
            count_left_paused(state.ledger, bound, interval, {c.slot.run_id for c in done.caught_up}, Source.RESUME)
    return ScheduleChanged(change, done.caught_up, left_by_cap=done.left_by_cap, compacted=done.compacted)
