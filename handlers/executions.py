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

from dedup.keys import EARLIEST_SCHEDULE_TIME, format_utc
from dispatch import DispatchError
from handlers.access import Role, requires
from handlers.answers import outcome_response, refusal_problem
from handlers.logs import note_run
from handlers.problems import problem
from handlers.request_times import BadTime, request_time, time_problem
from handlers.run_documents import run_summaries
from handlers.state import app_state, current_principal
from models import RunSource
from service.errors import Declined, Invalid
from service.runs import Queued
from service.slots import (
    SlotRunRequest,
    executions_between,
    external_of,
    find_slot,
    run_slot_later,
    run_slot_now,
    schedules_of,
)

blueprint = Blueprint("executions", __name__, url_prefix="/api/v1")

DEFAULT_RANGE = datetime.timedelta(hours=24)


@blueprint.get("/jobs/<job_id>/executions", provide_automatic_options=False)
@requires(Role.VIEW)
def list_executions(job_id: str):
    """The expected executions in [since, until), oldest first; ``next_since`` when the cap cut the range."""
    scheduler_jobs = schedules_of(app_state(), job_id)
    state = app_state()
    now = state.clock.now()
    bounds = {}
    for name in ("since", "until"):
        if request.args.get(name):
            try:
                bounds[name] = request_time(name, request.args[name])
            except BadTime as bad:
                return time_problem(bad)
    until = bounds.get("until", now)
    since = bounds.get("since", max(until - DEFAULT_RANGE, EARLIEST_SCHEDULE_TIME))
    if since >= until:
        raise Invalid("since must be before until")  # a refusal: the answers table's 400
    page = executions_between(state, scheduler_jobs, job_id, since, until)
    return jsonify(
        {
            "job_id": job_id,
            "since": format_utc(since),
            "until": format_utc(until),
            "scheduler_jobs": sorted({job.declared.name for job in scheduler_jobs}),
            "executions": page.executions,
            "unscheduled": run_summaries(page.unscheduled, now),
            "next_since": format_utc(page.next_since) if page.next_since else None,
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
    ``force=true``.  The answer is a delivery's; an external job's slot that would start a run
    is queued for its own handler instead (202).
    """
    scheduler_jobs = schedules_of(app_state(), job_id)  # NotFound (an unknown job, no schedule) first
    try:
        instant = request_time("schedule_time", schedule_time)
    except BadTime as bad:
        return time_problem(bad)
    chosen = {name: request.args.get(name) for name in ("scheduler_job", "project", "location")}
    found = find_slot(job_id, scheduler_jobs, instant, **chosen)  # NotFound, Invalid: the service's refusals
    ask = SlotRunRequest.parse(request.args.get("attempt"), request.args.get("force"))
    note_run(job_id=job_id, source=RunSource.SCHEDULER, run_id=found.run_id)
    state = app_state()
    if external_of(state, job_id) is not None:  # its own handler runs it: a task to it, answered 202
        try:
            later = run_slot_later(state, current_principal(), job_id, found, ask)
        except DispatchError as exc:
            return problem(502, "DispatchFailed", f"the task queue did not take the slot's run: {exc}")
        if isinstance(later, Queued):
            document = {"run_id": later.run_id, "queued": True, "already": later.dispatched.already}
            return jsonify({**document, "task_id": later.dispatched.task_id, "attempt": later.seen_attempt}), 202
        outcome = later
    else:
        outcome = run_slot_now(state, current_principal(), job_id, found, ask)
    if isinstance(outcome, Declined):
        return refusal_problem(outcome)
    return outcome_response(outcome)
