"""Slots: a Scheduler job's expected executions, and an operator's run of one.

``schedules_of``, ``find_slot`` and ``slot_of`` say which slot a request names, ``check_slot_run``
whether it may run as asked (a ``Declined`` otherwise), ``run_slot_now`` runs it under the key a
Scheduler delivery of it carries, ``run_slot_later`` and ``run_slots_later`` (a bulk run) answer
it from its record or queue it (``slot_run_work``).  ``executions_between`` is a page of the
executions listing.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from google.cloud import ndb

from dedup.claims import REOPENED
from dedup.keys import CLOCK_SKEW_SECONDS, ScheduledRunKey, format_utc, scheduled_run_key
from dedup.outcomes import RunOutcome
from dedup.queries import RunFilter
from dispatch import DispatchError, HttpTarget, Work, task_id
from jobs.base import ExternalTarget
from models import RunRecord
from schedules.bound import BoundJob
from schedules.config import SchedulerJob, delivery_scope
from schedules.metrics import Source
from schedules.slots import (
    MAX_SLOTS,
    NEEDS_FORCE,
    ExecutionStatus,
    Slot,
    execution_document,
    execution_status,
    is_slot,
    nearest_slots,
    schedule_at,
    slot_of_run,
    slot_page,
)
from service.errors import Declined, Invalid, NotFound, RefusalKind
from service.outcomes import count_finish
from service.principal import Principal
from service.runs import Queued, answer_or_queue, job_named, run_note, run_scheduled
from service.state import AppState

MAX_SEEN_ATTEMPT = 10**6  # far above any attempt number a run reaches


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
                raise Invalid(
                    f"attempt must be the slot's attempt number as listed (0 to {MAX_SEEN_ATTEMPT}; 0 for none)"
                )
            seen = int(attempt)
        if force not in (None, "true", "false"):
            raise Invalid("force must be true or false")
        return cls(seen, force == "true")


NO_SCHEDULE = "no schedule is loaded: the app reads DEDUP_SCHEDULER_FILE, else the scheduler.yaml beside the jobs file"


def schedules_of(state: AppState, job_id: str) -> list[BoundJob]:
    """The Scheduler jobs that target ``job_id``, with their pauses; NotFound when the job is
    unknown or no schedule is loaded."""
    job_named(state, job_id)
    if not state.schedules:
        raise NotFound(NO_SCHEDULE)
    return state.with_pauses(job for job in state.schedules if job.target == job_id)


def find_slot(
    job_id: str,
    scheduler_jobs: list[BoundJob],
    instant: datetime.datetime,
    scheduler_job: str | None = None,
    project: str | None = None,
    location: str | None = None,
) -> Slot:
    """The slot of ``job_id`` at ``instant``; NotFound naming the nearest slots, Invalid when several have it.

    ``scheduler_job``, ``project`` and ``location`` pick among several Scheduler jobs
    (one job id may be declared in several projects or locations).
    """
    picked = [
        job
        for job in scheduler_jobs
        if scheduler_job in (None, job.declared.name)
        and project in (None, job.declared.project)
        and location in (None, job.declared.location)
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
            f"{job.declared.name}: {format_utc(before)} or {format_utc(after)}"
            for job in scheduler_jobs
            for before, after in [nearest_slots(job, instant)]
        )
        raise NotFound(
            f"{format_utc(instant)} is not a slot of {job_id!r}'s schedule; the nearest: {nearest or 'none'}"
        )
    if len(matching) > 1:
        places = sorted((m.declared.name, m.declared.project, m.declared.location) for m in matching)
        names = ", ".join(f"{name} in {project}/{location}" for name, project, location in places)
        raise Invalid(
            f"several Scheduler jobs have this slot ({names}): choose with scheduler_job, project and location"
        )
    return Slot(schedule_at(matching[0], instant), instant, matching[0])


def slot_key(slot: Slot) -> ScheduledRunKey:
    """The key Cloud Scheduler's delivery of ``slot`` carries."""
    project, location = delivery_scope(slot.job)
    return scheduled_run_key(
        slot.job.name, format_utc(slot.schedule_time), query_project=project, query_location=location
    )


def check_slot_run(state: AppState, slot: Slot, ask: SlotRunRequest) -> tuple[Declined | None, RunRecord | None]:
    """Why ``slot`` may not be run as ``ask`` says (None: it may), and its record (one lookup).

    A slot that has not come is refused (``SLOT_NOT_DUE``): taking it now would answer its
    own delivery as a duplicate.  Without the attempt the operator saw, a failed
    or skipped slot is not reopened (``PRECONDITION_REQUIRED``, naming its attempt); a slot whose record
    the ledger may have forgotten (``unknown``) runs only when forced, since it may have run.
    """
    now = state.clock.now()
    if (slot.schedule_time - now).total_seconds() > CLOCK_SKEW_SECONDS:
        return Declined(
            RefusalKind.SLOT_NOT_DUE,
            f"this slot is due at {format_utc(slot.schedule_time)}, {slot.schedule_time - now} from now: "
            "Cloud Scheduler delivers it then, and running it now would answer that delivery as a duplicate. "
            "To run the job now, start a manual run",
            {"execution_status": ExecutionStatus.UPCOMING},
        ), None
    record = state.ledger.lookup(slot_key(slot).run_id)
    status = execution_status(slot, record, now)
    if status == ExecutionStatus.COVERED:
        return None, record  # answered from its record, naming the run that stands for it: never run
    if status == ExecutionStatus.STUCK and not ask.force:
        assert record is not None  # a stuck slot's run holds it
        return Declined(
            RefusalKind.EXECUTION_UNKNOWN,
            f"{stuck_words(record)}; send force=true to run it anyway",
            {"execution_status": status, "attempt": record.attempt, "downstream_key": record.run_id},
        ), record
    if status in NEEDS_FORCE and not ask.force:
        assert slot.bound is not None  # what the app learned makes a slot untracked or unknown
        if status == ExecutionStatus.UNTRACKED:
            assert slot.bound.expected_from is not None  # an untracked slot lies before a known time
            why = (
                f"this slot is before {slot.job.name}'s slots are expected from "
                f"({format_utc(slot.bound.expected_from)}: when the app first knew its schedule), so the app "
                "was not expecting it and cannot say it did not run"
            )
        else:
            why = (
                f"no record of this slot is left: the ledger keeps a run {slot.bound.retention_seconds:g}s past its "
                "schedule time, so it may have completed"
            )
        return Declined(
            RefusalKind.EXECUTION_UNKNOWN,
            f"{why}; running it may run the job twice. Send force=true to run it anyway",
            {
                "execution_status": status,
                "remembered_until": format_utc(slot.remembered_until) if slot.remembered_until else None,
            },
        ), record
    external = external_of(state, slot.job.target)
    if external is not None and record is not None and record.status in REOPENED:
        return Declined(
            RefusalKind.RUNS_ELSEWHERE,
            f"this slot {record.status} at attempt {record.attempt} in {slot.job.target}'s own handler "
            f"({external.url}), which answers every delivery of the slot from that record until it expires: "
            "the library reopens no slot, so running it again here would change nothing",
            {"execution_status": status, "attempt": record.attempt, "url": external.url},
        ), record
    if ask.seen_attempt is None and record is not None and record.status in REOPENED:
        return Declined(
            RefusalKind.PRECONDITION_REQUIRED,
            f"this slot {record.status} at attempt {record.attempt}; to run it again send attempt={record.attempt}, "
            "so that sending the same request again cannot run it a second time",
            {"execution_status": status, "attempt": record.attempt},
        ), record
    return None, record


def stuck_words(record: RunRecord) -> str:
    """What an operator must know before running a stuck slot again: the one text the API's
    refusal and the dashboard's acknowledgement say."""
    latest = (record.attempts or [{}])[-1]
    started = latest.get("started") or (format_utc(record.started) if record.started else "an unknown time")
    on = f" on instance {latest['instance']}" if latest.get("instance") else ""
    downstream = f" (it recorded downstream resource {record.downstream})" if record.downstream else ""
    return (
        f"attempt {record.attempt} of this slot started at {started}{on} and never finished: its lease ran out at "
        f"{format_utc(record.lease_expires)}{downstream}. It may have taken effect before it stopped. Running the slot "
        f"again starts attempt {record.attempt + 1}, which passes the same downstream key, {record.run_id}: a "
        "downstream that deduplicates by it applies the effect once, one that does not may apply it twice"
    )


def run_slot_now(
    state: AppState, principal: Principal, job_id: str, slot: Slot, ask: SlotRunRequest
) -> RunOutcome | Declined:
    """Run ``slot`` under its Scheduler key as ``ask`` says: the API's and the dashboard's one path
    (the dashboard's through a task: ``run_slot_later`` queues it, ``/tasks/run-slot`` runs it here)."""
    key = slot_key(slot)
    refused, record = check_slot_run(state, slot, ask)
    if refused is not None:
        return refused
    body = (slot.job.body or "").encode("utf-8")  # what Scheduler sends for this job
    # A covered slot is never reopened: the claim answers from its record, a duplicate of the
    # compacted run that stands for it (dedup.claims.refusal holds that inside the claim too).
    covered = record is not None and bool(record.compacted_into)
    try:
        outcome = run_scheduled(
            state,
            principal,
            job_id,
            state.jobs[job_id],
            key,
            body,
            reopen_attempt=None if covered else ask.seen_attempt,
        )
    except Declined as elsewhere:  # an external job's slot with nothing to answer from: its handler runs it
        return elsewhere
    count_finish(slot.job, job_id, key, outcome, state.clock.now(), Source.SLOT_RUN)  # schedules.metrics
    note = run_note(slot.job, job_id, key, outcome, ndb.get_context().client)
    if note is not None:
        note.keep()  # the slot's row counts the run at once, not after the audit's repair
    return outcome


SLOT_RUN_TASK = "/tasks/run-slot"  # the endpoint a dispatched run of a slot calls (handlers/tasks.py)


# A catch-up's runs wait a share of this long, by their Scheduler job's name, so that the jobs an
# outage left behind do not all catch up in the same second (n8n spreads its catch-up the same way).
CATCH_UP_SPREAD_SECONDS = 60


def spread_seconds(job: SchedulerJob) -> float:
    """The delay of ``job``'s catch-up runs: the same for every catch-up of the job (a hash of its
    key, not a random draw), and different, within CATCH_UP_SPREAD_SECONDS, from job to job."""
    digest = hashlib.sha256(job.key.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % (CATCH_UP_SPREAD_SECONDS * 1000) / 1000


def slot_run_work(
    job_id: str,
    slot: Slot,
    seen_attempt: int,
    requested_by: str,
    force: bool = False,
    external: ExternalTarget | None = None,
    delay_seconds: float = 0,
) -> Work:
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
    work_id = task_id("slot-run", slot.run_id, str(seen_attempt))
    if external is not None:  # to its handler, as Scheduler's delivery of the slot: one key for both
        return Work(work_id, SLOT_RUN_TASK, body, http=slot_delivery(slot, external), delay_seconds=delay_seconds)
    return Work(work_id, SLOT_RUN_TASK, body, delay_seconds=delay_seconds)


def slot_delivery(slot: Slot, external: ExternalTarget) -> HttpTarget:
    """The request Cloud Scheduler sends an external job's handler for ``slot``: its URL (with the
    scope), method, headers, schedule time and body, with the OIDC token of the job's caller."""
    job = slot.job
    headers = {
        **job.headers,
        "X-CloudScheduler": "true",
        "X-CloudScheduler-JobName": job.name,
        "X-CloudScheduler-ScheduleTime": format_utc(slot.schedule_time),
    }
    return HttpTarget(
        url=external.delivery_url(job.project, job.location, job.pass_scope),
        method=job.method,
        headers=headers,
        body=(job.body or "").encode("utf-8") if job.method == "POST" else b"",
        service_account=external.service_account,
        audience=external.audience,
        deadline_seconds=job.deadline,  # the Scheduler job's attempt deadline, as its own deliveries wait
    )


def external_of(state: AppState, job_id: str) -> ExternalTarget | None:
    """Where ``job_id``'s own handler is, if it is an external job."""
    job = state.jobs.get(job_id)
    return job.runner.external if job is not None else None


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
    scheduler_jobs: list[BoundJob],
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


def slot_of(
    state: AppState,
    job_id: str,
    instant: datetime.datetime,
    scheduler_job: str | None = None,
    project: str | None = None,
    location: str | None = None,
) -> Slot:
    """The slot of ``job_id`` at ``instant`` among the Scheduler jobs that target it: what a slot
    run names, on every surface.  NotFound, Invalid: ``schedules_of``'s and ``find_slot``'s."""
    return find_slot(job_id, schedules_of(state, job_id), instant, scheduler_job, project, location)


def _queue_slot_run[Answer](
    state: AppState, principal: Principal, job_id: str, slot: Slot, ask: SlotRunRequest, answer: Callable[[], Answer]
) -> Answer | Declined | Queued:
    """A slot run refused, answered from its record (``answer()``), or queued: one check, one lookup."""
    refusal, record = check_slot_run(state, slot, ask)
    if refusal is not None:
        return refusal
    return answer_or_queue(
        state,
        slot.run_id,
        record,
        answer,
        lambda seen: slot_run_work(
            job_id, slot, seen, principal.name, force=ask.force, external=external_of(state, job_id)
        ),
        reopen_attempt=ask.seen_attempt,
    )


def run_slot_later(
    state: AppState, principal: Principal, job_id: str, slot: Slot, ask: SlotRunRequest
) -> RunOutcome | Declined | Queued:
    """An operator's run of ``slot`` queued (the dashboard's), or refused, or answered at once from
    its record (done, running): nothing is queued then."""
    return _queue_slot_run(
        state, principal, job_id, slot, ask, lambda: run_slot_now(state, principal, job_id, slot, ask)
    )


@dataclasses.dataclass(frozen=True)
class BulkRun:
    """What a bulk run of slots did: how many it queued, found answered by their records (or
    queued before), and refused; ``stopped``: why the queue stopped taking them, if it did."""

    queued: int = 0
    answered: int = 0
    refused: int = 0
    stopped: DispatchError | None = None


def run_slots_later(
    state: AppState, principal: Principal, job_id: str, asked: Sequence[tuple[Slot, SlotRunRequest]]
) -> BulkRun:
    """Each slot run as its own run would be (refused, answered by its record, or queued), stopping
    where the queue stops taking them.  Sent twice, it queues nothing twice: each task id is the
    slot's run id and attempt."""
    done = BulkRun()
    for slot, ask in asked:
        try:
            answer = _queue_slot_run(state, principal, job_id, slot, ask, lambda: None)
        except DispatchError as exc:
            return dataclasses.replace(done, stopped=exc)
        match answer:
            case Declined():
                done = dataclasses.replace(done, refused=done.refused + 1)
            case Queued() if not answer.dispatched.already:
                done = dataclasses.replace(done, queued=done.queued + 1)
            case _:  # answered by its record, or queued by this bulk run sent before
                done = dataclasses.replace(done, answered=done.answered + 1)
    return done
