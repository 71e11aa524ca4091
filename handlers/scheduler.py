"""``/jobs/<job_id>``: the target Cloud Scheduler calls.  An adapter: the delivery's key from its
headers, one service call (``service.runs.run_delivery``), its answer and what it says after."""

from __future__ import annotations

import functools

from flask import Blueprint, request

from dedup.errors import InvalidRunRequest
from dedup.keys import format_utc, scheduled_run_key
from handlers.access import Role, requires
from handlers.answers import outcome_response
from handlers.logs import note_run
from handlers.problems import problem
from handlers.state import app_state, current_principal
from models import RunSource
from service.runs import Delivery, job_named, run_delivery  # its NotFound answered by the answers table

blueprint = Blueprint("scheduler", __name__)


@blueprint.route("/jobs/<job_id>", methods=["GET", "POST"], provide_automatic_options=False)
@requires(Role.DELIVER)
def deliver(job_id: str):
    state = app_state()
    job = job_named(state, job_id)
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
    body = request.get_data(cache=False)
    keyed = functools.partial(_note_delivery, job_id)
    delivered = run_delivery(state, current_principal(), job_id, job, key, body, keyed=keyed)
    response = outcome_response(delivered.outcome)
    if delivered.duplicate is not None:
        # Counted once the answer has gone, with the status it went with.
        response.call_on_close(functools.partial(delivered.duplicate.count, response.status_code))
    if delivered.note is not None:
        response.call_on_close(delivered.note.write)  # the day's summary, once the answer has gone
    if delivered.paused is not None:
        response.headers["X-Dedup-Schedule-Paused"] = format_utc(delivered.paused.since)
    return response


def _note_delivery(job_id: str, delivery: Delivery) -> None:
    """The key the delivery runs under, for the request's log line, before it runs."""
    key = delivery.key
    note_run(
        job_id=job_id,
        source=RunSource.FORCE_RUN if delivery.force_run else RunSource.SCHEDULER,
        run_id=key.run_id,
        # What the run is keyed on, as delivered: `python -m deploy smoke` reads it in Cloud Logging.
        scheduler_job=key.scheduler_job_name,
        schedule_time=key.schedule_time_text,
    )
