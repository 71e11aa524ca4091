"""``/jobs/<job_id>``: the target Cloud Scheduler calls.  A thin adapter to dedup."""

from __future__ import annotations

import datetime

from flask import Blueprint, request
from werkzeug.exceptions import NotFound

from dedup.errors import InvalidRunRequest
from dedup.keys import ScheduledRunKey, scheduled_run_key
from dedup.ledger import RunDescription
from dedup.outcomes import Attempt, RunOutcome
from dedup.runner import run_once
from handlers import app_state, current_principal
from handlers.access import Role, requires
from handlers.logs import note_run
from handlers.problems import problem
from handlers.responses import outcome_response
from jobs.base import RunContext
from jobs.config import JobSpec
from models import RunSource

blueprint = Blueprint("scheduler", __name__)


@blueprint.route("/jobs/<job_id>", methods=["GET", "POST"], provide_automatic_options=False)
@requires(Role.DELIVER)
def deliver(job_id: str):
    state = app_state()
    job = state.jobs.get(job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r} is declared in the jobs file")
    try:
        key = scheduled_run_key(
            request.headers.get("X-CloudScheduler-JobName"),
            request.headers.get("X-CloudScheduler-ScheduleTime"),
            # A query parameter given twice never gets here (handlers.request_limits).
            query_project=request.args.get("project"),
            query_location=request.args.get("location"),
            header_project=request.headers.get("X-Scheduler-Project"),
            header_location=request.headers.get("X-Scheduler-Location"),
        )
    except InvalidRunRequest as exc:
        return problem(400, "InvalidRequest", exc.message, field=exc.field)
    note_run(job_id=job_id, source=RunSource.SCHEDULER.value, run_id=key.run_id)
    body = request.get_data(cache=False)
    outcome = run_scheduled(job_id, job, key, body, skip_reason=late_delivery(job, key, state.clock.now()))
    return outcome_response(outcome)


def run_scheduled(
    job_id: str,
    job: JobSpec,
    key: ScheduledRunKey,
    body: bytes,
    *,
    skip_reason: str | None = None,
    reopen_attempt: int | None = None,
) -> RunOutcome:
    """Run a scheduled execution once under its key: a delivery's path, and an operator's run of a slot."""
    state = app_state()
    description = RunDescription(
        source=RunSource.SCHEDULER.value,
        job_id=job_id,
        scheduler_job_name=key.job_name,
        schedule_time=key.schedule_time,
        project=key.project,
        location=key.location,
        requested_by=current_principal().name,
    )

    def work(attempt: Attempt):
        return job.runner.run(
            RunContext.for_attempt(
                attempt,
                job_id,
                scheduler_job_name=key.job_name,
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


def late_delivery(job: JobSpec, key: ScheduledRunKey, now: datetime.datetime) -> str | None:
    """Why this delivery is too late to run (its job's max_delay_seconds), or None."""
    if job.max_delay_seconds is None:
        return None
    delay = (now - key.schedule_time).total_seconds()
    if delay <= job.max_delay_seconds:
        return None
    return (
        f"delivered {delay:.0f}s after its schedule time, later than the job's max_delay_seconds "
        f"({job.max_delay_seconds:g}s): not run; an operator can run the slot by hand"
    )
