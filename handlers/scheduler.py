"""``/jobs/<job_id>``: the target Cloud Scheduler calls.  A thin adapter to dedup."""

from __future__ import annotations

import functools
import logging

from flask import Blueprint, request
from google.cloud import ndb
from werkzeug.exceptions import NotFound

from dedup.claims import INSTANCE
from dedup.errors import InvalidRunRequest
from dedup.keys import format_utc, scheduled_run_key
from dedup.outcomes import InProgress, Replayed
from handlers.access import Role, requires
from handlers.logs import note_run
from handlers.problems import problem
from handlers.responses import outcome_response
from handlers.state import app_state, current_principal
from models import RunSource
from schedules.config import history_id
from schedules.pauses import pause_at
from schedules.tallies import DuplicateDelivery, tally_after_answer
from service.runs import delivered_key, late_delivery, run_scheduled

blueprint = Blueprint("scheduler", __name__)
log = logging.getLogger(__name__)


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
    now = state.clock.now()
    delivered = delivered_key(state, job_id, key, now)
    key, force_run, declared = delivered.key, delivered.force_run, delivered.declared
    note_run(
        job_id=job_id,
        source=RunSource.FORCE_RUN if force_run else RunSource.SCHEDULER,
        run_id=key.run_id,
        # What the run is keyed on, as delivered: `python -m deploy smoke` reads it in Cloud Logging.
        scheduler_job=key.scheduler_job_name,
        schedule_time=key.schedule_time_text,
    )
    if force_run:
        log.info("a Force run of %s: %s", key.scheduler_job_name, force_run)
    body = request.get_data(cache=False)
    skip_reason = late_delivery(job, key, now, force_run=bool(force_run))
    outcome = run_scheduled(
        state, current_principal(), job_id, job, key, body, skip_reason=skip_reason, force_run=bool(force_run)
    )
    response = outcome_response(outcome)
    if declared is not None and not force_run and isinstance(outcome, Replayed | InProgress):
        # A duplicate, absorbed: counted once its answer has gone, never on its path.
        delivery = DuplicateDelivery(now, INSTANCE, response.status_code)
        count = functools.partial(
            tally_after_answer, ndb.get_context().client, history_id(declared), key.schedule_time, delivery
        )
        response.call_on_close(count)
    # A delivery during a pause (a tick racing it, a Force run) runs as usual, and says so.  A
    # Force run is asked for now; a slot's delivery belongs to its time.
    pause = pause_at(delivered.pauses, now if force_run else key.schedule_time)
    if pause is not None:
        response.headers["X-Dedup-Schedule-Paused"] = format_utc(pause.since)
        log.info(
            "%s delivered while %s is paused (since %s, by %s): run as usual",
            "a Force run" if force_run else f"the slot {key.schedule_time_text}",
            key.scheduler_job_name,
            format_utc(pause.since),
            pause.paused_by,
            extra={"scheduler_job": key.scheduler_job_name, "schedule_paused": format_utc(pause.since)},
        )
    return response
