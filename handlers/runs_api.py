"""``POST /api/v1/jobs/<job_id>/runs``: run a job now, idempotently under a client token.

The client-token model of Amazon ECS RunTask: a caller who cannot tell
whether a run started retries with the same token and gets the original
run's answer instead of a second run.  A manual run is run as a scheduled
run is (run_once over the one ledger, the job's exceptions mapped by the
runner) under a key made of the client token, and answered from its record.
"""

from __future__ import annotations

import logging
import pathlib

from flask import Blueprint, Response, jsonify, request
from google.api_core import exceptions as google_exceptions

from dedup.adapters.flask_guard import GuardRejected, preferred_wait
from dedup.adapters.flask_json import InvalidJson, strict_json
from dedup.keys import is_run_id
from dedup.queries import RunFilter
from dedup.record_store import RecordStore
from dedup.runner import Waiting
from handlers.access import Role, requires
from handlers.answers import outcome_response, refusal_problem
from handlers.client_tokens import read_manual_run_request
from handlers.cross_site import json_body
from handlers.logs import note_run
from handlers.request_times import BadTime, request_time, time_problem
from handlers.responses import manual_run_response
from handlers.run_documents import run_document, run_summaries
from handlers.state import app_state, current_principal
from jobs.config import JobSpec
from models import RunSource, RunStatus
from service.errors import Declined, Invalid, NotFound  # answered by the answers table, as every refusal
from service.runs import Queued, manually_runnable, run_manually
from service.steps import StepReview, settle_step

log = logging.getLogger(__name__)

blueprint = Blueprint("runs_api", __name__, url_prefix="/api/v1")

# This API's OpenAPI 3.1 description, read once: a missing file stops the app at start-up.
OPENAPI_DESCRIPTION = pathlib.Path(__file__).with_name("openapi.yaml").read_bytes()


def known_job(job_id: str) -> JobSpec:
    """The job (NotFound before anything is written; RunsElsewhere for an external job), named on
    the request's log line."""
    job = manually_runnable(app_state(), job_id)
    note_run(job_id=job_id, source=RunSource.API)
    return job


@blueprint.post("/jobs/<job_id>/runs", provide_automatic_options=False)
@json_body
@requires(Role.OPERATE)
def start_manual_run(job_id: str):
    """A run now, once per client token: run like a scheduled run, answered from its record."""
    job = known_job(job_id)
    try:
        ask = read_manual_run_request()
    except (GuardRejected, InvalidJson) as exc:
        raise Invalid(exc.message) from None  # a request the API cannot read breaks its rules: the table's 400
    state = app_state()
    wait = Waiting(preferred_wait(), state.wait_slots)
    outcome = run_manually(state, current_principal(), job_id, job, ask, wait)
    return manual_run_response(outcome, job_id, ask.client_token, ask.parameters, job.fingerprint_exclude, wait)


STEP_REVIEW_FIELDS = frozenset({"decision", "attempt", "result"})


@blueprint.post("/runs/<run_id>/steps/<step>", provide_automatic_options=False)
@json_body
@requires(Role.OPERATE)
def settle_run_step(run_id: str, step: str):
    """An operator's decision on the step a run waits on (needs review): done, with the result the
    step would have returned, or run it again; then the slot's run is reopened at that attempt and
    answered as a delivery is.  409 StepNotWaiting when the run no longer waits on that step."""
    try:
        body = strict_json(request.get_data(), "the body")
    except InvalidJson as exc:
        raise Invalid(exc.message) from None
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object: decision, attempt and, for done, result")
    unknown = sorted(set(body) - STEP_REVIEW_FIELDS)
    if unknown:
        raise Invalid(f"unknown field(s) {', '.join(unknown)}")
    review = StepReview(step, body.get("decision"), body.get("attempt"), body.get("result"))
    note_run(run_id=run_id)
    outcome = settle_step(app_state(), current_principal(), run_id, review)
    if isinstance(outcome, Declined):
        return refusal_problem(outcome)
    assert not isinstance(outcome, Queued)  # run now: never queued
    return outcome_response(outcome)


MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 50
SOURCES = tuple(s.value for s in RunSource)


@blueprint.get("/runs", provide_automatic_options=False)
@requires(Role.VIEW)
def list_runs():
    """Runs newest first, a summary each: filters job, status, source, since, until; cursor pagination.

    A query parameter that breaks its rule is the service's Invalid, answered by the table (400);
    a bad time names its field too (``time_problem``)."""
    args = request.args
    try:
        limit = int(args.get("limit", DEFAULT_PAGE_SIZE))
    except ValueError:
        raise Invalid("limit must be an integer") from None
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise Invalid(f"limit must be from 1 to {MAX_PAGE_SIZE}")
    status = args.get("status")
    if status and status not in [s.value for s in RunStatus]:
        raise Invalid(f"status must be one of {', '.join(s.value for s in RunStatus)}")
    source = args.get("source")
    if source and source not in SOURCES:
        raise Invalid(f"source must be one of {', '.join(SOURCES)}")
    bounds = {}
    for name in ("since", "until"):
        if args.get(name):
            try:
                bounds[name] = request_time(name, args[name])
            except BadTime as bad:
                return time_problem(bad)
    try:
        run_filter = RunFilter(job_id=args.get("job") or None, status=status or None, source=source or None, **bounds)
    except ValueError as exc:
        raise Invalid(str(exc).replace("job_id", "job")) from None
    state = app_state()
    try:
        records, next_cursor = state.ledger.find_runs(run_filter, limit, args.get("cursor") or None)
    except (ValueError, TypeError, google_exceptions.BadRequest):
        raise Invalid("cursor is not one this API returned") from None
    now = state.clock.now()
    return jsonify({"runs": run_summaries(records, now), "next_cursor": next_cursor})


@blueprint.get("/runs/<run_id>", provide_automatic_options=False)
@requires(Role.VIEW)
def get_run(run_id: str):
    state = app_state()
    record = state.ledger.lookup(run_id) if is_run_id(run_id) else None
    if record is None:
        raise NotFound(f"no run {run_id!r} (or it has expired)")
    return jsonify(run_document(record, state.clock.now()))


@blueprint.get("/status", provide_automatic_options=False)
@requires(Role.VIEW)
def status():
    """What this process runs on: the database, and which write path its fence check chose."""
    store = RecordStore.of_context()
    check = store.fence
    return jsonify(
        {
            "datastore": {
                "database": store.database or "(default)",
                "fence": str(check.mode),
                "reason": check.reason,
                "round_trips_per_fresh_run": check.round_trips_per_fresh_run,
            }
        }
    )


@blueprint.get("/openapi.yaml", provide_automatic_options=False)
@requires(Role.VIEW)
def openapi_description():
    """This API's OpenAPI 3.1 description (handlers/openapi.yaml; RFC 9512's media type)."""
    return Response(OPENAPI_DESCRIPTION, mimetype="application/yaml")
