"""``POST /api/v1/jobs/<job_id>/runs``: run a job now, idempotently under a client token.

The client-token model of Amazon ECS RunTask: a caller who cannot tell
whether a run started retries with the same token and gets the original
run's answer instead of a second run.  The idempotency guard does the work;
this module only says what a manual run is.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable

from flask import Blueprint, g, jsonify, request
from google.api_core import exceptions as google_exceptions
from werkzeug.exceptions import NotFound

from dedup.errors import InvalidRunRequest, PermanentJobError
from dedup.idempotency import FINISHED_TOKEN_LIFETIME_SECONDS, TOKEN_LIFETIME_SECONDS
from dedup.keys import is_run_id, parse_rfc3339
from dedup.ledger import RunPolicy
from dedup.queries import RunFilter
from dedup.runner import error_document, storable_json_problem
from handlers import app_state
from handlers.auth import read_only
from handlers.errors import json_error
from handlers.idempotent import Fingerprint, GuardedCall, GuardRejected, KeyFrom, idempotent
from handlers.logs import note_run
from handlers.run_documents import run_document, run_summaries
from handlers.strict_json import json_payload
from jobs.base import RunContext
from jobs.config import JobSpec
from models import RunSource, RunStatus

log = logging.getLogger(__name__)

blueprint = Blueprint("runs_api", __name__, url_prefix="/api/v1")

MAX_TOKEN_LENGTH = 64
BODY_KEYS = frozenset({"clientToken", "parameters"})
INVALID = "InvalidParameterException"


def client_token_problem(token: str) -> str | None:
    """ECS's rule: case-sensitive, 1 to 64 characters, each ASCII 33 to 126."""
    if not 1 <= len(token) <= MAX_TOKEN_LENGTH:
        return f"clientToken must be 1 to {MAX_TOKEN_LENGTH} characters long; it has {len(token)}"
    for position, char in enumerate(token):
        if not 33 <= ord(char) <= 126:
            return (
                "clientToken may contain only ASCII characters 33 to 126 (no spaces, control "
                f"or non-ASCII characters); character {position + 1} is {char!r}"
            )
    return None


def manual_run_parameters() -> dict[str, Any]:
    payload = json_payload()
    if payload is None:
        return {}
    if not isinstance(payload, dict):
        raise GuardRejected('the request body must be a JSON object: {"clientToken", "parameters"}')
    unknown = sorted(set(payload) - BODY_KEYS)
    if unknown:
        raise GuardRejected(f"unknown field(s) {', '.join(unknown)}; allowed: clientToken, parameters")
    parameters = payload.get("parameters", {})
    if not isinstance(parameters, dict):
        raise GuardRejected("parameters must be a JSON object")
    return parameters


def current_job() -> JobSpec:
    return app_state().jobs[request.view_args["job_id"]]


def require_job(view: Callable[..., Any]) -> Callable[..., Any]:
    """404 for an unknown job before the guard writes anything."""

    @functools.wraps(view)
    def checked(job_id: str, **kwargs: Any):
        if job_id not in app_state().jobs:
            raise NotFound(f"no job {job_id!r} is declared in the jobs file")
        note_run(job_id=job_id, source=RunSource.API.value)
        return view(job_id, **kwargs)

    return checked


def manual_run_policy() -> RunPolicy:
    job_policy = current_job().policy
    return dataclasses.replace(
        job_policy,
        retention_seconds=TOKEN_LIFETIME_SECONDS,
        finished_retention_seconds=FINISHED_TOKEN_LIFETIME_SECONDS,
    )


@blueprint.post("/jobs/<job_id>/runs", provide_automatic_options=False)
@require_job
@idempotent(
    "manual-run",
    source=RunSource.API.value,
    job_id=lambda: current_job().job_id,
    key=KeyFrom.field(
        "clientToken", header="Idempotency-Key", required=False, generate=True, validate=client_token_problem
    ),
    fingerprint=Fingerprint.of(manual_run_parameters, exclude=lambda: current_job().fingerprint_exclude),
    bad_request_error=INVALID,
    scope=lambda: current_job().job_id,
    policy=manual_run_policy,
    replayed_status={201: 200},
)
def start_manual_run(job_id: str):
    job = current_job()
    call: GuardedCall = g.idempotency
    parameters = manual_run_parameters()
    context = RunContext.for_attempt(
        call.claim,
        job_id,
        source=RunSource.API.value,
        parameters=parameters,
        client_token=call.key,
        clock=app_state().clock,
    )
    answer = {"run_id": call.run_id, "job_id": job_id, "clientToken": call.key, "attempt": call.attempt}
    try:
        result = job.runner.run(context)
    except PermanentJobError as exc:
        return jsonify({**answer, "status": "failed", "error": error_document(exc, exc.details)}), 422
    except Exception as exc:  # noqa: BLE001 - retryable by contract: not kept, a retry runs again
        log.warning("manual run %s attempt %d failed, releasing: %r", call.run_id, call.attempt, exc, exc_info=True)
        return json_error(
            500,
            "RetryableFailure",
            f"the run failed and was released; retry with the same clientToken: {exc}",
            **answer,
            status="released",
            cause=error_document(exc, getattr(exc, "details", None)),
        )
    problem = storable_json_problem(result)
    if problem:
        error = {"type": "InvalidResult", "message": problem}
        return jsonify({**answer, "status": "failed", "error": error}), 422
    return jsonify({**answer, "status": "completed", "result": result}), 201


MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 50
SOURCES = tuple(s.value for s in RunSource)


def _bad(message: str):
    return json_error(400, "InvalidParameterException", message)


@blueprint.get("/runs", provide_automatic_options=False)
@read_only
def list_runs():
    """Runs newest first, a summary each: filters job, status, source, since, until; cursor pagination."""
    args = request.args
    try:
        limit = int(args.get("limit", DEFAULT_PAGE_SIZE))
    except ValueError:
        return _bad("limit must be an integer")
    if not 1 <= limit <= MAX_PAGE_SIZE:
        return _bad(f"limit must be from 1 to {MAX_PAGE_SIZE}")
    status = args.get("status")
    if status and status not in [s.value for s in RunStatus]:
        return _bad(f"status must be one of {', '.join(s.value for s in RunStatus)}")
    source = args.get("source")
    if source and source not in SOURCES:
        return _bad(f"source must be one of {', '.join(SOURCES)}")
    bounds = {}
    for name in ("since", "until"):
        if args.get(name):
            try:
                bounds[name] = parse_rfc3339(args[name], name)
            except InvalidRunRequest:
                return _bad(f"{name} must be an RFC 3339 timestamp such as 2026-11-29T00:00:00Z")
    try:
        run_filter = RunFilter(job_id=args.get("job") or None, status=status or None, source=source or None, **bounds)
    except ValueError as exc:
        return _bad(str(exc).replace("job_id", "job"))
    state = app_state()
    try:
        records, next_cursor = state.ledger.find_runs(run_filter, limit, args.get("cursor") or None)
    except (ValueError, TypeError, google_exceptions.BadRequest):
        return _bad("cursor is not one this API returned")
    now = state.clock.now()
    return jsonify({"runs": run_summaries(records, now), "next_cursor": next_cursor})


@blueprint.get("/runs/<run_id>", provide_automatic_options=False)
@read_only
def get_run(run_id: str):
    state = app_state()
    record = state.ledger.lookup(run_id) if is_run_id(run_id) else None
    if record is None:
        raise NotFound(f"no run {run_id!r} (or it has expired)")
    return jsonify(run_document(record, state.clock.now()))
