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
from dedup.keys import format_utc, parse_rfc3339
from dedup.queries import RunFilter
from handlers import app_state
from handlers.access import Role, requires
from handlers.errors import json_error
from handlers.run_documents import run_summaries
from schedules.config import SchedulerJob
from schedules.slots import MAX_SLOTS, execution_document, slots_between

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
