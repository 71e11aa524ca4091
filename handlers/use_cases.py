"""The use cases: what a request asks the app to do, apart from how the request said it.

Run a scheduled delivery (``run_scheduled``), run a job by hand under a client token
(``run_manually``), and run a slot of a schedule now (``run_slot_now``).  Each takes the
app's state and the principal it acts for as parameters, so the views that call them
(the Scheduler endpoint, the run API, the executions API and the dashboard's forms) stay
thin and never import one another.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from werkzeug.exceptions import NotFound

from dedup.claims import REOPENED, RunDescription, RunPolicy
from dedup.clock import Clock
from dedup.idempotency import FINISHED_TOKEN_LIFETIME_SECONDS, TOKEN_LIFETIME_SECONDS, IdempotencyGuard, fingerprint
from dedup.keys import ScheduledRunKey, format_utc, scheduled_run_key
from dedup.outcomes import Attempt, RunOutcome
from dedup.queries import RunFilter
from dedup.runner import Waiting, run_once
from dispatch import Dispatched, DispatchError, Work, task_id
from handlers.access import Principal
from handlers.logs import note_run
from handlers.responses import note_outcome
from handlers.state import AppState
from jobs.base import RunContext
from jobs.config import JobSpec
from models import RunRecord, RunSource, RunStatus
from schedules.config import SchedulerJob
from schedules.pauses import Pause, change_pause, current, paused, pauses_of, pauses_read, resumed, with_pauses
from schedules.slots import (
    CLOCK_SKEW_SECONDS,
    MAX_SLOTS,
    NEEDS_FORCE,
    ExecutionStatus,
    Slot,
    declared_job,
    delivery_scope,
    execution_document,
    execution_status,
    force_run_reason,
    force_run_retry,
    is_slot,
    latest_slots,
    may_be_force_run_retry,
    nearest_slots,
    schedule_at,
    slot_of_run,
    slot_page,
    slot_pages,
)

log = logging.getLogger(__name__)


def run_scheduled(
    state: AppState,
    principal: Principal,
    job_id: str,
    job: JobSpec,
    key: ScheduledRunKey,
    body: bytes,
    *,
    skip_reason: str | None = None,
    reopen_attempt: int | None = None,
    force_run: bool = False,
) -> RunOutcome:
    """Run a scheduled execution once under its key, for ``principal``: a delivery's path, and an
    operator's run of a slot.  ``force_run``: recorded as a Force run (its key may be its own)."""
    source = RunSource.FORCE_RUN if force_run or key.force_run else RunSource.SCHEDULER
    description = RunDescription(
        source=source,
        job_id=job_id,
        scheduler_job_name=key.scheduler_job_name,
        schedule_time=key.schedule_time,
        project=key.project,
        location=key.location,
        requested_by=principal.name,
    )

    def work(attempt: Attempt):
        return job.runner.run(
            RunContext.for_attempt(
                attempt,
                job_id,
                source=source,
                scheduler_job_name=key.scheduler_job_name,
                schedule_time=key.schedule_time,
                body=body,
                project=key.project,
                location=key.location,
                clock=state.clock,
            )
        )

    return run_once(
        state.ledger, key.run_id, description, job.policy, work, skip_reason=skip_reason, reopen_attempt=reopen_attempt
    )


@dataclasses.dataclass(frozen=True)
class Delivery:
    """A Scheduler delivery as it is run: its key, why it is a Force run (None: a slot's delivery),
    the declared Scheduler job it is of (None: none is), and that job's pause intervals."""

    key: ScheduledRunKey
    force_run: str | None
    declared: SchedulerJob | None
    pauses: list[Pause]


def delivered_key(state: AppState, job_id: str, key: ScheduledRunKey, now: datetime.datetime) -> Delivery:
    """The key a delivery runs under, why it is a Force run, and its Scheduler job's pauses.

    A Force run carrying a slot still to come is keyed apart (``ScheduledRunKey.as_force_run``),
    so it never takes that slot, and the slot's own delivery still runs the slot.  Its retries
    keep its schedule time and may come at any time after it, within the skew before the slot,
    at the slot or after: ``force_run_retry`` says which deliveries are its retries.  The Force
    run's record is read only where a retry of one may come, in one lookup with the pause
    intervals every delivery of a declared Scheduler job reads: no round trip more.
    """
    found = force_run_reason(key, job_id, state.schedules, now)
    declared = declared_job(state.schedules, key.scheduler_job_name, key.project, key.location)
    own = declared if declared is not None and declared.target == job_id else None
    forced_id = key.as_force_run().run_id if found is None and may_be_force_run_retry(key, own, now) else None
    # Both reads sent before either is waited for: NDB sends them in one lookup.
    read_pauses = pauses_read(declared) if declared is not None else None
    read_forced = RunRecord.get_by_id_async(forced_id) if forced_id is not None else None
    pauses = read_pauses() if read_pauses is not None else []
    forced = read_forced.result() if read_forced is not None else None
    if found is None and forced is not None and not forced.is_expired(now):
        found = force_run_retry(key, forced, own, now)
    if found is None:
        return Delivery(key, None, declared, pauses)
    return Delivery(key.as_force_run() if found.own_key else key, found.reason, declared, pauses)


def late_delivery(job: JobSpec, key: ScheduledRunKey, now: datetime.datetime, force_run: bool = False) -> str | None:
    """Why this delivery is too late to run (its job's max_delay_seconds), or None.

    A Force run is asked for now, whatever time it carries: never late."""
    if job.max_delay_seconds is None or force_run or key.force_run:
        return None
    delay = (now - key.schedule_time).total_seconds()
    if delay <= job.max_delay_seconds:
        return None
    return (
        f"delivered {delay:.0f}s after its schedule time, later than the job's max_delay_seconds "
        f"({job.max_delay_seconds:g}s): not run; an operator can run the slot by hand"
    )


MANUAL_RUN_NAMESPACE = "manual-run"


def manual_run_policy(job: JobSpec) -> RunPolicy:
    """The job's lease, heartbeat and run limit, with the client-token lifetime (ECS)."""
    return dataclasses.replace(
        job.policy,
        retention_seconds=TOKEN_LIFETIME_SECONDS,
        finished_retention_seconds=FINISHED_TOKEN_LIFETIME_SECONDS,
    )


@dataclasses.dataclass(frozen=True)
class ManualRunRequest:
    """A manual run as asked: its client token (given or generated) and its parameters."""

    client_token: str
    parameters: dict[str, Any]

    def context(self, attempt: Attempt, job_id: str, clock: Clock) -> RunContext:
        return RunContext.for_attempt(
            attempt,
            job_id,
            source=RunSource.API,
            parameters=self.parameters,
            client_token=self.client_token,
            clock=clock,
        )


def run_manually(
    state: AppState,
    principal: Principal,
    job_id: str,
    job: JobSpec,
    ask: ManualRunRequest,
    wait: Waiting | None = None,
) -> RunOutcome:
    """Run ``job`` once per client token, for ``principal``: the API's and the dashboard's one path."""
    guard = IdempotencyGuard(state.ledger, MANUAL_RUN_NAMESPACE, manual_run_policy(job), RunSource.API)
    outcome = guard.run(
        ask.client_token,
        lambda attempt: job.runner.run(ask.context(attempt, job_id, state.clock)),
        scope=job_id,
        parameters=ask.parameters,
        exclude=job.fingerprint_exclude,
        wait=wait,
        job_id=job_id,
        requested_by=principal.name,
    )
    note_outcome(outcome)
    return outcome


MAX_SEEN_ATTEMPT = 10**6  # far above any attempt number a run reaches


class InvalidSlotRun(ValueError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclasses.dataclass(frozen=True)
class SlotRunRequest:
    """An operator's run of a slot: the attempt they saw (0 for none), and whether they force an unknown one.

    The attempt is the reopen's precondition: a failed or skipped slot is run
    again only while it is still that attempt, so the same request sent again
    (a double click, a lost answer, a client's timeout) is answered from the
    attempt it started instead of starting another.
    """

    seen_attempt: int | None
    force: bool = False

    @classmethod
    def parse(cls, attempt: str | None, force: str | None) -> SlotRunRequest:
        seen = None
        if attempt is not None:
            if not attempt.isascii() or not attempt.isdigit() or len(attempt) > 7 or int(attempt) > MAX_SEEN_ATTEMPT:
                raise InvalidSlotRun(
                    f"attempt must be the slot's attempt number as listed (0 to {MAX_SEEN_ATTEMPT}; 0 for none)"
                )
            seen = int(attempt)
        if force not in (None, "true", "false"):
            raise InvalidSlotRun("force must be true or false")
        return cls(seen, force == "true")


@dataclasses.dataclass(frozen=True)
class SlotRunRefused:
    """Why an operator's run of a slot did not go ahead as asked (nothing ran)."""

    http_status: int
    error: str
    message: str
    details: dict[str, Any]


NO_SCHEDULE = "no schedule is loaded: the app reads DEDUP_SCHEDULER_FILE, else the scheduler.yaml beside the jobs file"


MAX_UNSCHEDULED = 100
MAX_UNSCHEDULED_PAGES = 5  # the run pages read to find MAX_UNSCHEDULED runs that match no slot


@dataclasses.dataclass(frozen=True)
class ExecutionsPage:
    """The expected executions of a range, oldest first, each as the listing documents it; the runs
    of the job created in the range that match no slot; and where the next page starts, if the
    cap cut the range."""

    executions: list[dict[str, Any]]
    unscheduled: list[RunRecord]
    next_since: datetime.datetime | None


def executions_between(
    state: AppState,
    scheduler_jobs: list[SchedulerJob],
    job_id: str,
    since: datetime.datetime,
    until: datetime.datetime,
    limit: int = MAX_SLOTS,
) -> ExecutionsPage:
    """A page of the executions listing (the API's and the history page's): every slot in [since,
    until) up to ``limit``, their records in one batched lookup, and the runs apart from them."""
    now = state.clock.now()
    slots, next_since = slot_page(scheduler_jobs, since, until, limit)
    records = state.ledger.lookup_many([slot.run_id for slot in slots])
    unscheduled: list[RunRecord] = []
    cursor = None
    # The runs apart from the slots of this page's own span: the next page lists those after it.
    spanned = RunFilter(job_id=job_id, since=since, until=next_since or until)
    for _ in range(MAX_UNSCHEDULED_PAGES):
        found, cursor = state.ledger.find_runs(spanned, 100, cursor)
        unscheduled += [record for record in found if slot_of_run(record, scheduler_jobs) is None]
        if cursor is None or len(unscheduled) >= MAX_UNSCHEDULED:
            break
    return ExecutionsPage(
        [execution_document(slot, records.get(slot.run_id), now) for slot in slots],
        unscheduled[:MAX_UNSCHEDULED],
        next_since,
    )


def schedules_of(state: AppState, job_id: str) -> list[SchedulerJob]:
    """The Scheduler jobs that target ``job_id``, with their pauses; 404 when the job is unknown or no
    schedule is loaded."""
    if job_id not in state.jobs:
        raise NotFound(f"no job {job_id!r} is declared in the jobs file")
    if not state.schedules:
        raise NotFound(NO_SCHEDULE)
    return with_pauses([job for job in state.schedules if job.target == job_id])


def scheduler_job_named(state: AppState, name: str, project: str | None, location: str | None) -> SchedulerJob | str:
    """The declared Scheduler job ``name`` (in ``project`` and ``location`` when several share it): 404
    when there is none, a 400 message when the choice is ambiguous."""
    if not state.schedules:
        raise NotFound(NO_SCHEDULE)
    found = [
        job
        for job in state.schedules
        if job.name == name and project in (None, job.project) and location in (None, job.location)
    ]
    if not found:
        raise NotFound(f"no Scheduler job {name!r} is declared in scheduler.yaml")
    if len(found) > 1:
        places = ", ".join(sorted(f"{job.project}/{job.location}" for job in found))
        return f"Scheduler job {name!r} is declared in several places ({places}): choose with project and location"
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


CATCH_UP = ("none", "latest", "all")
SLOT_RUN_TASK = "/tasks/run-slot"  # the endpoint a dispatched run of a slot calls (handlers/tasks.py)


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


def slot_run_work(job_id: str, slot: Slot, seen_attempt: int, requested_by: str, force: bool = False) -> Work:
    """A run of ``slot`` dispatched to be done later, under the slot's own key (run_slot_now).

    The task id is the run id and the attempt seen: the queue refuses the same catch-up twice,
    and a slot reopened after a later failure is new work.  ``force``: an operator confirmed
    running a slot whose record may have expired (it rides only when set)."""
    body = {
        "job_id": job_id,
        "schedule_time": format_utc(slot.schedule_time),
        "scheduler_job": slot.job.name,
        "project": slot.job.project,
        "location": slot.job.location,
        "attempt": seen_attempt,
        "requested_by": requested_by,
        **({"force": True} if force else {}),
    }
    return Work(task_id("slot-run", slot.run_id, str(seen_attempt)), SLOT_RUN_TASK, body)


MANUAL_RUN_TASK = "/tasks/manual-run"  # the endpoint a dispatched manual run calls (handlers/tasks.py)


def manual_run_id(state: AppState, job_id: str, job: JobSpec, client_token: str) -> str:
    """The run id a manual run of ``job`` under ``client_token`` has: known before it starts."""
    return IdempotencyGuard(state.ledger, MANUAL_RUN_NAMESPACE, manual_run_policy(job), RunSource.API).run_id(
        client_token, scope=job_id
    )


def runs_of_token(state: AppState, client_token: str) -> list[RunRecord]:
    """The manual runs ``client_token`` names, a run per job at most: one batched lookup."""
    ids = [manual_run_id(state, job_id, job, client_token) for job_id, job in sorted(state.jobs.items())]
    found = state.ledger.lookup_many(ids)
    return [found[run_id] for run_id in ids if run_id in found]


def manual_run_work(
    state: AppState, job_id: str, job: JobSpec, ask: ManualRunRequest, requested_by: str, seen_attempt: int = 0
) -> Work:
    """A manual run dispatched to be done later (run_manually, under its client token).  The task
    id is its run id, the attempt seen (0: none) and the parameters' fingerprint, so the queue
    refuses the same request twice, a task delivered twice is one run, a released run sent again
    is new work, and a form resent with other parameters is not silently dropped: its task runs,
    and the token's one run takes whichever claims first (the other is refused as a conflict)."""
    body = {
        "job_id": job_id,
        "client_token": ask.client_token,
        "parameters": ask.parameters,
        "requested_by": requested_by,
    }
    run_id = manual_run_id(state, job_id, job, ask.client_token)
    sent = fingerprint(ask.parameters, job.fingerprint_exclude)
    return Work(task_id("manual-run", run_id, str(seen_attempt), sent), MANUAL_RUN_TASK, body)


def starts_a_run(record: RunRecord | None, now: datetime.datetime, reopen_attempt: int | None = None) -> bool:
    """Whether asking for this run would start an attempt (and so is dispatched to the queue):
    no record, one released, one whose lease ran out, or one failed or skipped at
    ``reopen_attempt`` (a slot's run replacing the attempt the operator saw).  Otherwise the
    record answers at once (done, running, or already replaced): nothing is queued."""
    if record is None or record.status == RunStatus.RELEASED:
        return True
    if record.status in REOPENED:
        return reopen_attempt == record.attempt
    return record.status == RunStatus.IN_PROGRESS and not record.lease_is_live(now)


def catch_up(state: AppState, principal: Principal, job: SchedulerJob, interval: Pause, mode: str) -> list[CaughtUp]:
    """Dispatch the slots of a pause ``interval`` that never ran: none, the latest, or all of them,
    as far back as the job's catchup_window.  Each runs under its own key, so a late Scheduler
    retry of a caught-up slot is the same run; the queue refuses the same catch-up twice."""
    if mode == "none":
        return []
    now = state.clock.now()
    since = max(interval.since, now - datetime.timedelta(seconds=job.catchup_window))
    until = min(interval.until or now, now)
    pages: Iterable[list[Slot]]
    if mode == "latest":
        # The pause's newest slot, read from the newest end: only that one, and only while it has
        # not run, so the resume sent again after it ran takes no older slot in its place.
        newest = latest_slots([job], until - datetime.timedelta(microseconds=1), 1)
        pages = [[slot for slot in newest if slot.schedule_time >= since]]
    else:
        pages = slot_pages([job], since, until)  # the whole range, however many slots: none left paused
    caught_up = []
    for slots in pages:
        records = state.ledger.lookup_many([slot.run_id for slot in slots])
        for slot in slots:
            record = records.get(slot.run_id)
            if execution_status(slot, record, now) != ExecutionStatus.PAUSED:
                continue
            work = slot_run_work(job.target, slot, record.attempt if record else 0, principal.name)
            caught_up.append(CaughtUp(slot, state.dispatcher.dispatch(work)))
    return caught_up


AUDIT_SHARE_TASK = "/tasks/audit-share"  # the endpoint a dispatched share of an audit pass calls
# The Scheduler jobs one request audits.  A pass over 1,000 takes about 7 s at a 10 ms round trip
# (bench/fleet.py), far inside App Engine's 10-minute request timeout; a larger fleet (Cloud
# Scheduler allows 5,000 jobs a region, and one app may serve several regions) is split.
AUDIT_SHARE_SIZE = 1000


@dataclasses.dataclass(frozen=True)
class AuditShare:
    """Scheduler jobs of one pass audited by a task of their own: ``count`` from ``first``, in
    scheduler.yaml's order.  ``dispatched`` is None where the queue could not take it."""

    first: str
    count: int
    dispatched: Dispatched | None

    def document(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "count": self.count,
            "task_id": self.dispatched.task_id if self.dispatched else None,
            "already_dispatched": bool(self.dispatched and self.dispatched.already),
        }


def split_audit(state: AppState, jobs: Sequence[SchedulerJob]) -> tuple[tuple[SchedulerJob, ...], list[AuditShare]]:
    """The first AUDIT_SHARE_SIZE Scheduler jobs, for this request to audit, and the rest
    dispatched in shares of that size (``/tasks/audit-share``).

    A share names its first job's key and a count, not every key: its task stays small
    whatever the names.  If a deploy changes the file before a share runs, it may audit a
    job twice or leave one to the next pass; both are harmless, since each job's mark says
    what it has already judged.  The task id holds the pass's minute, so cron's retry of the
    same pass is refused by the queue; a share the queue refused outright is audited by the
    next pass, whose slots it has not judged yet."""
    pass_minute = format_utc(state.clock.now().replace(second=0, microsecond=0))
    shares = []
    for start in range(AUDIT_SHARE_SIZE, len(jobs), AUDIT_SHARE_SIZE):
        share = jobs[start : start + AUDIT_SHARE_SIZE]
        body = {"first": share[0].key, "count": len(share)}
        work = Work(task_id("audit-share", pass_minute, share[0].key, str(len(share))), AUDIT_SHARE_TASK, body)
        dispatched: Dispatched | None
        try:
            dispatched = state.dispatcher.dispatch(work)
        except DispatchError:
            log.exception("%d Scheduler jobs from %s wait for the next audit pass", len(share), share[0].key)
            dispatched = None
        shares.append(AuditShare(share[0].key, len(share), dispatched))
    return tuple(jobs[:AUDIT_SHARE_SIZE]), shares


def audit_share(jobs: Sequence[SchedulerJob], first: str, count: int) -> tuple[SchedulerJob, ...] | None:
    """The ``count`` Scheduler jobs from the one declared as ``first``; None if none is."""
    keys = [job.key for job in jobs]
    if first not in keys:
        return None
    start = keys.index(first)
    return tuple(jobs[start : start + count])


MISFIRE_PRINCIPAL = "misfire-policy"  # requested_by of a run the audit's misfire policy dispatched


def misfire_catch_up(state: AppState) -> Callable[[Slot], bool]:
    """The audit's catch-up (schedules.audit.CatchUp): dispatch a missed slot to run under its key."""

    def dispatch_slot(slot: Slot) -> bool:
        # Never raises: the audit's mark has moved, and its lines must still be written.
        try:
            record = state.ledger.lookup(slot.run_id)
            work = slot_run_work(slot.job.target, slot, record.attempt if record else 0, MISFIRE_PRINCIPAL)
            state.dispatcher.dispatch(work)
        except Exception:
            log.warning("the misfire policy could not dispatch %s: reported as missed", slot.run_id, exc_info=True)
            return False
        return True

    return dispatch_slot


FAILURE_STREAK_PRINCIPAL = "failure-streak"  # who paused a job its pause_after_consecutive_failures paused


def failure_streak_pause(state: AppState) -> Callable[[SchedulerJob, str], bool]:
    """The audit's pause (schedules.audit.Pause): the job paused in the app and in Cloud Scheduler."""

    def pause(job: SchedulerJob, note: str) -> bool:
        who = Principal(name=FAILURE_STREAK_PRINCIPAL, granted=frozenset())
        try:  # never raises: the audit's mark has moved, and its lines must still be written
            change = set_schedule_paused(state, who, job, True, note)
        except Exception:
            log.exception("%s could not be paused after its failure streak", job.name)
            return False
        if change.scheduler_problem:
            log.error("%s: %s", job.name, change.scheduler_problem, extra={"scheduler_job": job.name})
        return change.pause is not None

    return pause


def last_pause(job: SchedulerJob) -> Pause | None:
    """The job's most recent pause interval, lasting or ended."""
    return job.pauses[-1] if job.pauses else None


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


def find_slot(
    job_id: str,
    scheduler_jobs: list[SchedulerJob],
    instant: datetime.datetime,
    scheduler_job: str | None = None,
    project: str | None = None,
    location: str | None = None,
) -> Slot | str:
    """The slot of ``job_id`` at ``instant``; NotFound naming the nearest slots, or a 400 message.

    ``scheduler_job``, ``project`` and ``location`` pick among several Scheduler jobs
    (one job id may be declared in several projects or locations).
    """
    picked = [
        job
        for job in scheduler_jobs
        if scheduler_job in (None, job.name) and project in (None, job.project) and location in (None, job.location)
    ]
    if not picked:
        wanted = ", ".join(
            f"{k}={v!r}"
            for k, v in (("scheduler_job", scheduler_job), ("project", project), ("location", location))
            if v is not None
        )
        raise NotFound(f"no Scheduler job with {wanted} targets job {job_id!r}")
    scheduler_jobs = picked
    matching = [job for job in scheduler_jobs if is_slot(job, instant)]
    if not matching:
        nearest = "; ".join(
            f"{job.name}: {format_utc(before)} or {format_utc(after)}"
            for job in scheduler_jobs
            for before, after in [nearest_slots(job, instant)]
        )
        raise NotFound(
            f"{format_utc(instant)} is not a slot of {job_id!r}'s schedule; the nearest: {nearest or 'none'}"
        )
    if len(matching) > 1:
        names = ", ".join(sorted(f"{job.name} in {job.project}/{job.location}" for job in matching))
        return f"several Scheduler jobs have this slot ({names}): choose with scheduler_job, project and location"
    return Slot(schedule_at(matching[0], instant), instant)


def run_slot_now(
    state: AppState, principal: Principal, job_id: str, slot: Slot, ask: SlotRunRequest
) -> RunOutcome | SlotRunRefused:
    """Run ``slot`` under its Scheduler key as ``ask`` says: the API's and the dashboard's one path
    (the dashboard's through a task: ``check_slot_run`` first, then ``slot_run_work``)."""
    key = slot_key(slot)
    note_run(job_id=job_id, source=RunSource.SCHEDULER, run_id=key.run_id)
    refused, _ = check_slot_run(state, slot, ask)
    if refused is not None:
        return refused
    body = (slot.job.body or "").encode("utf-8")  # what Scheduler sends for this job
    return run_scheduled(state, principal, job_id, state.jobs[job_id], key, body, reopen_attempt=ask.seen_attempt)


def slot_key(slot: Slot) -> ScheduledRunKey:
    """The key Cloud Scheduler's delivery of ``slot`` carries."""
    project, location = delivery_scope(slot.job)
    return scheduled_run_key(
        slot.job.name, format_utc(slot.schedule_time), query_project=project, query_location=location
    )


def check_slot_run(state: AppState, slot: Slot, ask: SlotRunRequest) -> tuple[SlotRunRefused | None, RunRecord | None]:
    """Why ``slot`` may not be run as ``ask`` says (None: it may), and its record (one lookup).

    A slot that has not come is refused (422): taking it now would answer its
    own delivery as a duplicate.  Without the attempt the operator saw, a failed
    or skipped slot is not reopened (428, naming its attempt); a slot whose record
    the ledger may have forgotten (``unknown``) runs only when forced, since it may have run.
    """
    now = state.clock.now()
    if (slot.schedule_time - now).total_seconds() > CLOCK_SKEW_SECONDS:
        return SlotRunRefused(
            422,
            "SlotNotDue",
            f"this slot is due at {format_utc(slot.schedule_time)}, {slot.schedule_time - now} from now: "
            "Cloud Scheduler delivers it then, and running it now would answer that delivery as a duplicate. "
            "To run the job now, start a manual run",
            {"execution_status": ExecutionStatus.UPCOMING},
        ), None
    record = state.ledger.lookup(slot_key(slot).run_id)
    status = execution_status(slot, record, now)
    if status in NEEDS_FORCE and not ask.force:
        if status == ExecutionStatus.UNTRACKED:
            assert slot.job.expected_from is not None  # an untracked slot lies before a known time
            why = (
                f"this slot is before {slot.job.name}'s slots are expected from "
                f"({format_utc(slot.job.expected_from)}: when the app first knew its schedule), so the app "
                "was not expecting it and cannot say it did not run"
            )
        else:
            why = (
                f"no record of this slot is left: the ledger keeps a run {slot.job.retention_seconds:g}s past its "
                "schedule time, so it may have completed"
            )
        return SlotRunRefused(
            422,
            "ExecutionUnknown",
            f"{why}; running it may run the job twice. Send force=true to run it anyway",
            {
                "execution_status": status,
                "remembered_until": format_utc(slot.remembered_until) if slot.remembered_until else None,
            },
        ), record
    if ask.seen_attempt is None and record is not None and record.status in REOPENED:
        return SlotRunRefused(
            428,
            "PreconditionRequired",
            f"this slot {record.status} at attempt {record.attempt}; to run it again send attempt={record.attempt}, "
            "so that sending the same request again cannot run it a second time",
            {"execution_status": status, "attempt": record.attempt},
        ), record
    return None, record
