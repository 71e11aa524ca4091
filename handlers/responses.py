"""The guard's answers: a guarded view's (``guarded_response``, which replays kept responses)
and a manual run's (``manual_run_response``).

Their statuses are the answers table's (``handlers.answers``); what is the guard's own is how
a kept response is replayed, the key's expiry on every answer about a record, the short
Retry-After a polling client gets, and the members a manual run's answer adds to a run's
(``clientToken``, ``requested_by``, 201 for the run this request made).
"""

from __future__ import annotations

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
from handlers.answers import answer_of, note_outcome, run_answer, run_document
from handlers.problems import problem
from handlers.replayed_response import StoredResponse
from models import RunRecord, RunStatus

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
            answer = answer_of(outcome)
            response = problem(
                answer.status,
                "ConflictException",
                "this idempotency key was already used with different parameters"
                + (f": {', '.join(differing)}" if differing else "")
                + "; use a new key for a different request",
                run_id=record.run_id,
                differing=differing,
            )
            return _with_expiry(response, record)
        case JobMismatch():
            return run_answer(outcome)
        case Released() if live:
            return live[0]  # a retryable answer, not kept: the key is free again
        case Released():
            return problem(500, "InternalError", "the guarded call failed and was not kept; retry it")
        case InProgress():
            response = run_answer(outcome)
            # A client polls a manual run: suggest a short wait, not the whole lease.
            response.headers["Retry-After"] = str(min(outcome.retry_after_seconds, MAX_RETRY_AFTER_SECONDS))
            return _with_expiry(response, outcome.record)
        case Contended() | Overlap() | Stale():
            response = run_answer(outcome)
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
            # The run's answer, as every surface gives it, and what the run API adds: the token, who
            # asked, and 201 for the run this request made and completed.
            record = outcome.record
            replayed = isinstance(outcome, Replayed)
            document = run_document(record, duplicate=replayed)
            response = jsonify({**document, "clientToken": client_token, "requested_by": record.requested_by})
            status = answer_of(outcome).status
            response.status_code = 201 if status == 200 and not replayed else status
            if replayed:
                response.headers["Idempotent-Replayed"] = "true"
            response = _with_expiry(response, record)
        case Released():
            answer = answer_of(outcome)
            response = problem(
                answer.status,
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
