"""The one place where protocol outcomes become HTTP status codes.

Scheduled runs (``outcome_response``), and guarded views and manual runs
(``guarded_response``, which replays kept responses):

| outcome                          | status |
|----------------------------------|--------|
| finished: completed              | 200    |
| replayed: completed (duplicate)  | 200    |
| finished / replayed: failed      | 422    |
| key belongs to another job       | 422 (logged at ERROR) |
| in progress (live lease)         | 409 + Retry-After |
| another execution holds the job (overlap: forbid) | 409 ExecutionOverlap + Retry-After |
| contended / stale attempt        | 409 + Retry-After / 409 |
| released (retryable failure)     | 500    |
| skipped (later than max_delay_seconds), and its replays | 200 |
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any, assert_never

from flask import Response, jsonify

from dedup.idempotency import differing_names
from dedup.keys import format_utc
from dedup.outcomes import (
    Conflict,
    Contended,
    Finished,
    InProgress,
    JobMismatch,
    Overlap,
    Released,
    Replayed,
    RunOutcome,
    Skipped,
    Stale,
)
from dedup.runner import Waiting
from handlers.logs import note_run
from handlers.problems import TYPES_BY_ERROR, problem
from handlers.replayed_response import StoredResponse
from models import DELIVERED_SOURCES, RunRecord, RunStatus
from service.errors import Declined, Invalid, NotFound, Refusal

log = logging.getLogger(__name__)


def outcome_response(outcome: RunOutcome) -> Response:
    note_outcome(outcome)
    response = _outcome_response(outcome)
    response.headers["X-Dedup-Run-Id"] = outcome.run_id
    return response


def outcome_name(outcome: RunOutcome) -> str:
    """The outcome's name on the request's log line (log-based metrics count them)."""
    match outcome:
        case Finished():
            return str(outcome.record.status)  # completed or failed
        case Replayed():
            return "duplicate"
        case InProgress():
            return "in_progress"
        case Contended():
            return "contended"
        case Stale():
            return "stale"
        case Released():
            return "released"
        case Conflict():
            return "conflict"
        case JobMismatch():
            return "job_mismatch"
        case Skipped():
            return "skipped"
        case Overlap():
            return "overlap"
        case _ as unreachable:
            assert_never(unreachable)


def note_outcome(outcome: RunOutcome) -> None:
    """Name the outcome, and the run it is about, for the request's log line."""
    fields: dict[str, Any] = {"outcome": outcome_name(outcome), "run_id": outcome.run_id}
    record = outcome.record
    if record is not None and not isinstance(outcome, Stale):
        fields.update(job_id=record.job_id, source=record.source, attempt=record.attempt)
    if isinstance(outcome, (Stale, Released)):
        fields["attempt"] = outcome.attempt
    if isinstance(outcome, JobMismatch):
        fields.update(job_id=outcome.job_id, attempt=None)  # the job asked for, not the record's
    note_run(**fields)


def _outcome_response(outcome: RunOutcome) -> Response:
    match outcome:
        case Finished() | Skipped():
            return _record_response(outcome.record, duplicate=False)
        case Replayed():
            return _record_response(outcome.record, duplicate=True)
        case Released():
            return problem(
                500,
                "RetryableFailure",
                f"attempt {outcome.attempt} failed and released the run for a retry: {outcome.error.get('message')}",
                run_id=outcome.run_id,
                attempt=outcome.attempt,
                run_status="released",
                cause=outcome.error,
            )
        case Conflict():  # only client-token runs carry fingerprints
            return problem(
                422,
                "ConflictException",
                "this key belongs to a run with other parameters",
                run_id=outcome.record.run_id,
            )
        case JobMismatch():
            return job_mismatch_response(outcome)
        case InProgress() | Contended() | Overlap() | Stale():
            return busy_response(outcome)
        case _ as unreachable:
            assert_never(unreachable)


INVALID = "InvalidParameterException"


def refusal_problem(refusal: Refusal) -> Response:
    """A service refusal as a problem: 404 for what is not there, 400 for a broken rule, and a
    refused request with its kind's own status (``handlers.problems``) and details."""
    match refusal:
        case NotFound():
            return problem(404, "NotFound", refusal.message)
        case Invalid():
            return problem(400, INVALID, refusal.message)
        case Declined():
            return problem(TYPES_BY_ERROR[refusal.kind].status, refusal.kind, refusal.message, **refusal.details)
    raise TypeError(f"not a refusal the app answers: {refusal!r}")


def job_mismatch_response(outcome: JobMismatch) -> Response:
    """422 for a key that names another job's run: a configuration error, logged at ERROR.

    Shared with the guard.  Nothing ran and nothing was replayed.
    """
    record = outcome.record
    if record.source in DELIVERED_SOURCES:
        what = (
            f"the delivery of Scheduler job {record.scheduler_job_name!r} for {format_utc(record.schedule_time)}"
            if record.schedule_time
            else "this delivery"
        )
        fix = (
            "give each Scheduler job its own job id, or scope the deliveries (?project=P&location=L "
            "on the target URI, or the X-Scheduler-Project and X-Scheduler-Location headers) so their "
            "keys differ"
        )
    else:
        what = "this idempotency key"
        fix = "use a new key, or a scope that tells the jobs apart"
    message = (
        f"{what} has the run key of a run of job {record.job_id!r}, not of job {outcome.job_id!r}; "
        f"it was neither run nor answered from that run: {fix}"
    )
    log.error(
        "run %s: %s",
        record.run_id,
        message,
        extra={"run_id": record.run_id, "job_id": outcome.job_id, "outcome": "job_mismatch"},
    )
    return problem(
        422, "JobMismatch", message, run_id=record.run_id, job_id=outcome.job_id, recorded_job_id=record.job_id
    )


Busy = InProgress | Contended | Overlap | Stale


def busy_response(outcome: Busy) -> Response:
    """409 for a run someone else is working on (shared with the guard)."""
    match outcome:
        case InProgress():
            record = outcome.record
            response = problem(
                409,
                "RunInProgress",
                f"attempt {record.attempt} of this run holds its lease until "
                f"{format_utc(record.lease_expires)}; retry after it",
                run_id=record.run_id,
                run_status=record.status,
                attempt=record.attempt,
                lease_expires=format_utc(record.lease_expires),
            )
            response.headers["Retry-After"] = str(outcome.retry_after_seconds)
        case Contended():
            response = problem(
                409,
                "RunContended",
                "other deliveries of this run are claiming it at this moment; retry shortly",
                run_id=outcome.run_id,
            )
            response.headers["Retry-After"] = str(outcome.retry_after_seconds)
        case Overlap():
            response = problem(
                409,
                "ExecutionOverlap",
                f"the job forbids overlap and another execution (run {outcome.holder_run_id}) holds it; "
                "this one did not run: retry after it",
                run_id=outcome.run_id,
                holder_run_id=outcome.holder_run_id,
            )
            response.headers["Retry-After"] = str(outcome.retry_after_seconds)
        case Stale():
            current = outcome.current
            response = problem(
                409,
                "StaleAttempt",
                f"attempt {outcome.attempt} lost its lease and another attempt took the run over; "
                "its outcome was not recorded",
                run_id=outcome.run_id,
                attempt=outcome.attempt,
                current_attempt=current.attempt if current else None,
                current_status=current.status if current else None,
            )
            response.headers["Retry-After"] = "1"  # the next delivery sees what the new owner did
        case _ as unreachable:
            assert_never(unreachable)
    return response


def record_document(record: RunRecord, duplicate: bool) -> dict:
    document = {
        "run_id": record.run_id,
        "job_id": record.job_id,
        "status": record.status,
        "attempt": record.attempt,
        "duplicate": duplicate,
    }
    if record.schedule_time is not None:
        document["schedule_time"] = format_utc(record.schedule_time)
    if record.downstream:
        document["downstream"] = record.downstream
    if record.status == RunStatus.COMPLETED:
        document["result"] = record.result
    elif record.status == RunStatus.SKIPPED:
        document["reason"] = (record.error or {}).get("message")
    else:
        document["error"] = record.error
    return document


def _record_response(record: RunRecord, duplicate: bool) -> Response:
    response = jsonify(record_document(record, duplicate))
    # A skipped slot is done with: never a 5xx for a late delivery, so Scheduler stops retrying.
    response.status_code = 200 if record.status in (RunStatus.COMPLETED, RunStatus.SKIPPED) else 422
    if duplicate:
        response.headers["Idempotent-Replayed"] = "true"
    return response


# Guarded views (manual runs, @idempotent): a client polls, so Retry-After is a short
# hint, not the whole lease; every answer says when the key is free again.
MAX_RETRY_AFTER_SECONDS = 30
EXPIRES_HEADER = "Idempotency-Expires"


def guarded_response(
    outcome: RunOutcome,
    live: list[Response],
    given: Mapping[str, Any],
    exclude: Collection[str],
    replayed_status: Mapping[int, int],
) -> Response:
    """A guarded view's answer: its own response (``live``) when this request ran it, else
    the kept one replayed, or why not (422 other parameters, 409 in progress, ...).

    Every answer about an existing record carries its expiry (``Idempotency-Expires``).
    """
    match outcome:
        case Finished() if live:
            return _with_expiry(live[0], outcome.record)  # the view's own response, untouched
        case Finished() | Replayed():
            record = outcome.record
            stored = _kept(record)
            if not StoredResponse.is_document(stored):  # not written by a guard: never expected
                return problem(500, "InternalError", "this key's record holds no response")
            response = _rebuild(StoredResponse.from_document(stored))
            if isinstance(outcome, Replayed):
                response.status_code = replayed_status.get(response.status_code, response.status_code)
                response.headers["Idempotent-Replayed"] = "true"
            return _with_expiry(response, record)
        case Conflict():
            record = outcome.record
            differing = differing_names(record.parameters, given, exclude)
            response = problem(
                422,
                "ConflictException",
                "this idempotency key was already used with different parameters"
                + (f": {', '.join(differing)}" if differing else "")
                + "; use a new key for a different request",
                run_id=record.run_id,
                differing=differing,
            )
            return _with_expiry(response, record)
        case JobMismatch():
            return job_mismatch_response(outcome)
        case Released() if live:
            return live[0]  # a retryable answer, not kept: the key is free again
        case Released():
            return problem(500, "InternalError", "the guarded call failed and was not kept; retry it")
        case InProgress():
            response = busy_response(outcome)
            # A client polls a manual run: suggest a short wait, not the whole lease.
            response.headers["Retry-After"] = str(min(outcome.retry_after_seconds, MAX_RETRY_AFTER_SECONDS))
            return _with_expiry(response, outcome.record)
        case Contended() | Overlap() | Stale():
            response = busy_response(outcome)
            return _with_expiry(response, outcome.record) if outcome.record is not None else response
        case Skipped():
            raise TypeError("a guarded call is never skipped: only a late scheduled delivery is")
        case _ as unreachable:
            assert_never(unreachable)


def _rebuild(stored: StoredResponse) -> Response:
    return Response(stored.body_bytes(), status=stored.status, headers=dict(stored.headers))


def _with_expiry(response: Response, record: RunRecord) -> Response:
    response.headers[EXPIRES_HEADER] = format_utc(record.expire_at)
    return response


def manual_run_response(
    outcome: RunOutcome,
    job_id: str,
    client_token: str,
    given: Mapping[str, Any],
    exclude: Collection[str],
    wait: Waiting,
) -> Response:
    """A manual run's answer, built from its record as a scheduled run's is.

    201 for the run this request made, 200 with ``Idempotent-Replayed`` for the
    same token and parameters again, 422 for a failure (kept) or other
    parameters, 500 for a released run, 409 while one is in progress.
    """
    note_outcome(outcome)
    ran_here = isinstance(outcome, (Finished, Released, Stale))
    match outcome:
        case Finished() | Replayed() if StoredResponse.is_document(_kept(outcome.record)):
            # Written before manual runs kept their results: the kept HTTP response, replayed.
            response = guarded_response(outcome, [], given, exclude, {201: 200})
        case Finished() | Replayed():
            record = outcome.record
            response = _manual_run_document(record, client_token)
            if isinstance(outcome, Replayed):
                response.status_code = 200 if record.status == RunStatus.COMPLETED else 422
                response.headers["Idempotent-Replayed"] = "true"
            response = _with_expiry(response, record)
        case Released():
            response = problem(
                500,
                "RetryableFailure",
                f"the run failed and was released; retry with the same clientToken: {outcome.error.get('message')}",
                run_id=outcome.run_id,
                job_id=job_id,
                clientToken=client_token,
                attempt=outcome.attempt,
                run_status="released",
                cause=outcome.error,
            )
        case Conflict() | JobMismatch() | InProgress() | Contended() | Stale() | Overlap() | Skipped():
            response = guarded_response(outcome, [], given, exclude, {})
        case _ as unreachable:
            assert_never(unreachable)
    response.headers["Idempotency-Key"] = client_token
    if wait.waited and not ran_here:
        # Only when it did wait: beyond the bound the answer is the immediate 409.
        response.headers["Preference-Applied"] = f"wait={wait.seconds}"
    return response


def _kept(record: RunRecord) -> Any:
    """What a finished record keeps: its result when completed, else its error."""
    return record.result if record.status == RunStatus.COMPLETED else record.error


def _manual_run_document(record: RunRecord, client_token: str) -> Response:
    document = {
        "run_id": record.run_id,
        "job_id": record.job_id,
        "clientToken": client_token,
        "attempt": record.attempt,
        "requested_by": record.requested_by,
    }
    if record.status == RunStatus.COMPLETED:
        response = jsonify({**document, "status": "completed", "result": record.result})
        response.status_code = 201
    else:
        response = jsonify({**document, "status": "failed", "error": record.error})
        response.status_code = 422
    return response
