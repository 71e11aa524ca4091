"""``/api/v1/jobs/<job_id>/executions``: every expected execution of a job, and what became of it.

The app holds its schedules (scheduler.yaml, validated at start-up), so it
lists the slots in a range with the run id each delivery would have, looks
their records up in one batch, and says of each whether it completed,
failed, is running, was released, skipped, is still due, was missed, or is
still to come.  Runs of the job in the range that match no slot (manual
runs, a changed schedule) are listed apart.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from flask import Blueprint, jsonify, request
from werkzeug.exceptions import NotFound

from dedup.errors import InvalidRunRequest
from dedup.keys import EARLIEST_SCHEDULE_TIME, check_schedule_time, format_utc, parse_rfc3339, scheduled_run_key
from dedup.ledger import REOPENED
from dedup.outcomes import RunOutcome
from dedup.queries import RunFilter
from handlers import app_state
from handlers.access import Role, requires
from handlers.logs import note_run
from handlers.problems import problem
from handlers.responses import outcome_response
from handlers.run_documents import run_summaries
from handlers.scheduler import run_scheduled
from models import RunRecord, RunSource
from schedules.config import SchedulerJob
from schedules.slots import (
    MAX_SLOTS,
    Slot,
    Status,
    delivery_scope,
    execution_document,
    execution_status,
    is_slot,
    nearest_slots,
    slots_between,
)

blueprint = Blueprint("executions", __name__, url_prefix="/api/v1")

DEFAULT_RANGE = datetime.timedelta(hours=24)
MAX_UNSCHEDULED = 100


MAX_UNSCHEDULED_PAGES = 5  # the run pages read to find MAX_UNSCHEDULED runs that match no slot


def _time_problem(name: str, exc: InvalidRunRequest) -> str:
    if "outside the accepted range" in exc.message:
        return exc.message
    return f"{name} must be an RFC 3339 timestamp such as 2026-11-29T00:00:00Z"


def is_expected_run(record: RunRecord, scheduler_jobs: list[SchedulerJob]) -> bool:
    """A Scheduler run of a declared Scheduler job of its own job, in its scope, at one of its slots.

    A run of this job under another job's slot (a misrouted delivery) is unscheduled here:
    the slot's own listing calls it a conflict, and it must not vanish from both.
    """
    if record.source != RunSource.SCHEDULER.value or record.schedule_time is None:
        return False
    return any(
        job.target == record.job_id
        and job.name == record.scheduler_job_name
        and delivery_scope(job) == (record.project or None, record.location or None)
        and is_slot(job, record.schedule_time)
        for job in scheduler_jobs
    )


def unscheduled_runs(
    job_id: str, scheduler_jobs: list[SchedulerJob], since: datetime.datetime, until: datetime.datetime
) -> list[RunRecord]:
    """Runs of the job created in [since, until) that match no slot: manual runs, undeclared Scheduler jobs."""
    state = app_state()
    found: list[RunRecord] = []
    cursor = None
    for _ in range(MAX_UNSCHEDULED_PAGES):
        page, cursor = state.ledger.find_runs(RunFilter(job_id=job_id, since=since, until=until), 100, cursor)
        found += [record for record in page if not is_expected_run(record, scheduler_jobs)]
        if cursor is None or len(found) >= MAX_UNSCHEDULED:
            break
    return found[:MAX_UNSCHEDULED]


def schedules_of(job_id: str) -> list[SchedulerJob]:
    """The Scheduler jobs that target ``job_id``; 404 when the job is unknown or no schedule is loaded."""
    state = app_state()
    if job_id not in state.jobs:
        raise NotFound(f"no job {job_id!r} is declared in the jobs file")
    if not state.schedules:
        raise NotFound(
            "no schedule is loaded: the app reads DEDUP_SCHEDULER_FILE, else the scheduler.yaml beside the jobs file"
        )
    return [job for job in state.schedules if job.target == job_id]


@blueprint.get("/jobs/<job_id>/executions", provide_automatic_options=False)
@requires(Role.VIEW)
def list_executions(job_id: str):
    """The expected executions in [since, until), oldest first; ``next_since`` when the cap cut the range."""
    scheduler_jobs = schedules_of(job_id)
    state = app_state()
    now = state.clock.now()
    bounds = {}
    for name in ("since", "until"):
        if request.args.get(name):
            try:
                bounds[name] = check_schedule_time(name, parse_rfc3339(request.args[name], name))
            except InvalidRunRequest as exc:
                return problem(400, "InvalidParameterException", _time_problem(name, exc))
    until = bounds.get("until", now)
    since = bounds.get("since", max(until - DEFAULT_RANGE, EARLIEST_SCHEDULE_TIME))
    if since >= until:
        return problem(400, "InvalidParameterException", "since must be before until")
    slots = slots_between(scheduler_jobs, since, until, MAX_SLOTS + 1)
    next_since = None
    if len(slots) > MAX_SLOTS:
        # End the page before the time the cap cut into, so a time shared by several
        # Scheduler jobs is never split over two pages (nor listed twice).
        next_time = slots[MAX_SLOTS].schedule_time
        kept = [slot for slot in slots[:MAX_SLOTS] if slot.schedule_time < next_time]
        slots = kept or [slot for slot in slots if slot.schedule_time == next_time]
        next_since = format_utc(next_time if kept else next_time + datetime.timedelta(microseconds=1))
    records = state.ledger.lookup_many([slot.run_id for slot in slots])
    unscheduled = unscheduled_runs(job_id, scheduler_jobs, since, until)
    return jsonify(
        {
            "job_id": job_id,
            "since": format_utc(since),
            "until": format_utc(until),
            "scheduler_jobs": sorted({job.name for job in scheduler_jobs}),
            "executions": [execution_document(slot, records.get(slot.run_id), now) for slot in slots],
            "unscheduled": run_summaries(unscheduled, now),
            "next_since": next_since,
        }
    )


@blueprint.post("/jobs/<job_id>/executions/<schedule_time>/run", provide_automatic_options=False)
@requires(Role.OPERATE)
def run_slot(job_id: str, schedule_time: str):
    """Run one slot by hand under exactly the key a Scheduler delivery of it has.

    A slot run by hand and a late Scheduler retry of it are one run.  A
    failed or skipped slot is reopened (run again, its history kept) when
    ``attempt`` is the attempt it still is; released and missed ones run;
    a completed one is answered as a duplicate, and one in progress gets
    409.  An ``unknown`` slot (past the ledger's horizon) runs only with
    ``force=true``.  The answer is a delivery's.
    """
    scheduler_jobs = schedules_of(job_id)
    try:
        instant = check_schedule_time("schedule_time", parse_rfc3339(schedule_time, "schedule_time"))
    except InvalidRunRequest as exc:
        return problem(400, "InvalidParameterException", _time_problem("schedule_time", exc))
    chosen = {name: request.args.get(name) for name in ("scheduler_job", "project", "location")}
    found = find_slot(job_id, scheduler_jobs, instant, **chosen)
    if isinstance(found, str):
        return problem(400, "InvalidParameterException", found)
    try:
        ask = SlotRunRequest.parse(request.args.get("attempt"), request.args.get("force"))
    except InvalidSlotRun as refused:
        return problem(400, "InvalidParameterException", refused.message)
    outcome = run_slot_now(job_id, found, ask)
    if isinstance(outcome, SlotRunRefused):
        return problem(outcome.http_status, outcome.error, outcome.message, **outcome.details)
    return outcome_response(outcome)


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
            if not attempt.isascii() or not attempt.isdigit() or int(attempt) > MAX_SEEN_ATTEMPT:
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


def find_slot(
    job_id: str,
    scheduler_jobs: list[SchedulerJob],
    instant: datetime.datetime,
    scheduler_job: str | None = None,
    project: str | None = None,
    location: str | None = None,
):
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
    return Slot(matching[0], instant)


def run_slot_now(job_id: str, slot: Slot, ask: SlotRunRequest) -> RunOutcome | SlotRunRefused:
    """Run ``slot`` under its Scheduler key as ``ask`` says: the API's and the dashboard's one path.

    Without the attempt the operator saw, a failed or skipped slot is not
    reopened (428, naming its attempt); a slot whose record the ledger may
    have forgotten (``unknown``) runs only when forced, since it may have run.
    """
    state = app_state()
    project, location = delivery_scope(slot.job)
    key = scheduled_run_key(
        slot.job.name, format_utc(slot.schedule_time), query_project=project, query_location=location
    )
    note_run(job_id=job_id, source=RunSource.SCHEDULER.value, run_id=key.run_id)
    record = state.ledger.lookup(key.run_id)
    status = execution_status(slot, record, state.clock.now())
    if status == Status.UNKNOWN and not ask.force:
        return SlotRunRefused(
            422,
            "ExecutionUnknown",
            f"no record of this slot is left: the ledger keeps a run {slot.job.retention_seconds:g}s past its "
            f"schedule time, so it may have completed; running it may run the job twice. "
            "Send force=true to run it anyway",
            {
                "execution_status": status,
                "remembered_until": format_utc(slot.remembered_until) if slot.remembered_until else None,
            },
        )
    if ask.seen_attempt is None and record is not None and record.status in REOPENED:
        return SlotRunRefused(
            428,
            "PreconditionRequired",
            f"this slot {record.status} at attempt {record.attempt}; to run it again send attempt={record.attempt}, "
            "so that sending the same request again cannot run it a second time",
            {"execution_status": status, "attempt": record.attempt},
        )
    body = (slot.job.body or "").encode("utf-8")  # what Scheduler sends for this job
    return run_scheduled(job_id, state.jobs[job_id], key, body, reopen_attempt=ask.seen_attempt)
