"""``/api/v1/jobs/<job_id>/executions``: every expected execution of a job, and what became of it.

The app holds its schedules (scheduler.yaml, validated at start-up), so it
lists the slots in a range with the run id each delivery would have, looks
their records up in one batch, and says of each whether it completed,
failed, is running, was released, skipped, is still due, was missed, or is
still to come.  Runs of the job in the range that match no slot (manual
runs, a changed schedule) are listed apart.
"""

from __future__ import annotations

import datetime

from flask import Blueprint, jsonify, request
from werkzeug.exceptions import NotFound

from dedup.errors import InvalidRunRequest
from dedup.keys import format_utc, parse_rfc3339, scheduled_run_key
from dedup.outcomes import RunOutcome
from dedup.queries import RunFilter
from handlers import app_state
from handlers.access import Role, requires
from handlers.errors import json_error
from handlers.logs import note_run
from handlers.responses import outcome_response
from handlers.run_documents import run_summaries
from handlers.scheduler import run_scheduled
from models import RunSource
from schedules.config import SchedulerJob
from schedules.slots import MAX_SLOTS, Slot, delivery_scope, execution_document, is_slot, nearest_slots, slots_between

blueprint = Blueprint("executions", __name__, url_prefix="/api/v1")

DEFAULT_RANGE = datetime.timedelta(hours=24)
MAX_UNSCHEDULED = 100


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
                bounds[name] = parse_rfc3339(request.args[name], name)
            except InvalidRunRequest:
                return json_error(
                    400,
                    "InvalidParameterException",
                    f"{name} must be an RFC 3339 timestamp such as 2026-11-29T00:00:00Z",
                )
    until = bounds.get("until", now)
    since = bounds.get("since", until - DEFAULT_RANGE)
    if since >= until:
        return json_error(400, "InvalidParameterException", "since must be before until")
    slots = slots_between(scheduler_jobs, since, until, MAX_SLOTS + 1)
    next_since = format_utc(slots[MAX_SLOTS].schedule_time) if len(slots) > MAX_SLOTS else None
    slots = slots[:MAX_SLOTS]
    records = state.ledger.lookup_many([slot.run_id for slot in slots])
    expected = {slot.run_id for slot in slots}
    listed, _ = state.ledger.find_runs(RunFilter(job_id=job_id, since=since, until=until), MAX_UNSCHEDULED)
    unscheduled = [record for record in listed if record.run_id not in expected]
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
    failed, released, skipped or missed slot is reopened (run again, its
    history kept); a completed one is answered as a duplicate, and one in
    progress gets 409.  The answer is a delivery's.
    """
    scheduler_jobs = schedules_of(job_id)
    try:
        instant = parse_rfc3339(schedule_time, "schedule_time")
    except InvalidRunRequest:
        message = "the schedule time must be an RFC 3339 timestamp such as 2026-11-29T00:00:00Z"
        return json_error(400, "InvalidParameterException", message)
    found = find_slot(job_id, scheduler_jobs, instant, request.args.get("scheduler_job"))
    if isinstance(found, str):
        return json_error(400, "InvalidParameterException", found)
    return outcome_response(run_slot_now(job_id, found))


def find_slot(job_id: str, scheduler_jobs: list[SchedulerJob], instant: datetime.datetime, named: str | None):
    """The slot of ``job_id`` at ``instant``; NotFound naming the nearest slots, or a 400 message."""
    if named is not None:
        scheduler_jobs = [job for job in scheduler_jobs if job.name == named]
        if not scheduler_jobs:
            raise NotFound(f"no Scheduler job {named!r} targets job {job_id!r}")
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
        names = ", ".join(sorted(job.name for job in matching))
        return f"several Scheduler jobs have this slot ({names}): name one with ?scheduler_job="
    return Slot(matching[0], instant)


def run_slot_now(job_id: str, slot: Slot) -> RunOutcome:
    """Run ``slot`` under its Scheduler key, reopening it if it failed, was released, skipped or missed."""
    project, location = delivery_scope(slot.job)
    key = scheduled_run_key(
        slot.job.name, format_utc(slot.schedule_time), query_project=project, query_location=location
    )
    note_run(job_id=job_id, source=RunSource.SCHEDULER.value, run_id=key.run_id)
    body = (slot.job.body or "").encode("utf-8")  # what Scheduler sends for this job
    return run_scheduled(job_id, app_state().jobs[job_id], key, body, reopen=True)
