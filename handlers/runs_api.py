"""``POST /api/v1/jobs/<job_id>/runs``: run a job now, idempotently under a client token.

The client-token model of Amazon ECS RunTask: a caller who cannot tell
whether a run started retries with the same token and gets the original
run's answer instead of a second run.  A manual run is run as a scheduled
run is (run_once over the one ledger, the job's exceptions mapped by the
runner) under a key made of the client token, and answered from its record.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import uuid
from typing import Any

from flask import Blueprint, Response, jsonify, request
from google.api_core import exceptions as google_exceptions
from werkzeug.exceptions import NotFound

from dedup.errors import InvalidRunRequest
from dedup.idempotency import FINISHED_TOKEN_LIFETIME_SECONDS, TOKEN_LIFETIME_SECONDS, IdempotencyGuard
from dedup.keys import is_run_id, parse_rfc3339
from dedup.ledger import RunPolicy
from dedup.outcomes import Attempt, RunOutcome
from dedup.queries import RunFilter
from dedup.runner import Waiting
from handlers import app_state, current_principal
from handlers.access import Role, requires
from handlers.cross_site import json_body
from handlers.idempotent import Fingerprint, GuardRejected, KeyFrom, guard_registry, preferred_wait
from handlers.logs import note_run
from handlers.problems import problem
from handlers.responses import manual_run_response, note_outcome
from handlers.run_documents import run_document, run_summaries
from handlers.strict_json import InvalidJson, json_payload
from jobs.base import RunContext
from jobs.config import JobSpec
from models import RunSource, RunStatus

log = logging.getLogger(__name__)

blueprint = Blueprint("runs_api", __name__, url_prefix="/api/v1")

# This API's OpenAPI 3.1 description, read once: a missing file stops the app at start-up.
OPENAPI_DESCRIPTION = pathlib.Path(__file__).with_name("openapi.yaml").read_bytes()

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


def known_job(job_id: str) -> JobSpec:
    """The job, or 404 before anything is written."""
    job = app_state().jobs.get(job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r} is declared in the jobs file")
    note_run(job_id=job_id, source=RunSource.API.value)
    return job


def manual_run_policy(job: JobSpec) -> RunPolicy:
    """The job's lease, heartbeat and run limit, with the client-token lifetime (ECS)."""
    return dataclasses.replace(
        job.policy,
        retention_seconds=TOKEN_LIFETIME_SECONDS,
        finished_retention_seconds=FINISHED_TOKEN_LIFETIME_SECONDS,
    )


# The token: the body's clientToken or the Idempotency-Key header (a fresh one when neither).
# ECS's clientToken is a string: a number in its place is refused, as ECS refuses it.
MANUAL_RUN_KEY = KeyFrom.field(
    "clientToken",
    header="Idempotency-Key",
    required=False,
    generate=True,
    validate=client_token_problem,
    integers=False,
)
MANUAL_RUN_NAMESPACE = "manual-run"


@dataclasses.dataclass(frozen=True)
class ManualRunRequest:
    """A manual run as asked: its client token (given or generated) and its parameters."""

    token: str
    parameters: dict[str, Any]

    @classmethod
    def from_request(cls) -> ManualRunRequest:
        """GuardRejected or InvalidJson (a 400) for a bad token, body or parameters."""
        token = MANUAL_RUN_KEY.read() or str(uuid.uuid4())
        return cls(token, Fingerprint.of(manual_run_parameters).parameters())

    def context(self, attempt: Attempt, job_id: str) -> RunContext:
        return RunContext.for_attempt(
            attempt,
            job_id,
            source=RunSource.API.value,
            parameters=self.parameters,
            client_token=self.token,
            clock=app_state().clock,
        )


def run_manually(job_id: str, job: JobSpec, ask: ManualRunRequest, wait: Waiting | None = None) -> RunOutcome:
    """Run ``job`` once per client token, as the current principal: the API's and the dashboard's one path."""
    registry = guard_registry()
    guard = IdempotencyGuard(registry.ledger, MANUAL_RUN_NAMESPACE, manual_run_policy(job), RunSource.API.value)
    outcome = guard.run(
        ask.token,
        lambda attempt: job.runner.run(ask.context(attempt, job_id)),
        scope=job_id,
        parameters=ask.parameters,
        exclude=job.fingerprint_exclude,
        wait=wait,
        job_id=job_id,
        requested_by=current_principal().name,
    )
    note_outcome(outcome)
    return outcome


@blueprint.post("/jobs/<job_id>/runs", provide_automatic_options=False)
@json_body
@requires(Role.OPERATE)
def start_manual_run(job_id: str):
    """A run now, once per client token: run like a scheduled run, answered from its record."""
    job = known_job(job_id)
    try:
        ask = ManualRunRequest.from_request()
    except (GuardRejected, InvalidJson) as exc:
        return problem(400, INVALID, exc.message)
    wait = Waiting(preferred_wait(), guard_registry().wait_slots)
    outcome = run_manually(job_id, job, ask, wait)
    return manual_run_response(outcome, job_id, ask.token, ask.parameters, job.fingerprint_exclude, wait)


MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 50
SOURCES = tuple(s.value for s in RunSource)


def _bad(message: str):
    return problem(400, "InvalidParameterException", message)


@blueprint.get("/runs", provide_automatic_options=False)
@requires(Role.VIEW)
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
@requires(Role.VIEW)
def get_run(run_id: str):
    state = app_state()
    record = state.ledger.lookup(run_id) if is_run_id(run_id) else None
    if record is None:
        raise NotFound(f"no run {run_id!r} (or it has expired)")
    return jsonify(run_document(record, state.clock.now()))


@blueprint.get("/openapi.yaml", provide_automatic_options=False)
@requires(Role.VIEW)
def openapi_description():
    """This API's OpenAPI 3.1 description (handlers/openapi.yaml; RFC 9512's media type)."""
    return Response(OPENAPI_DESCRIPTION, mimetype="application/yaml")
