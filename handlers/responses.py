"""The guard's answers: a guarded view's (``guarded_response``, which replays kept responses)
and a manual run's (``manual_run_response``).

Every status is the answers table's (``handlers.answers``: a client's rows, and a kept
response's for a guarded call's record); what is the guard's own is the key's expiry on every
answer about a record, the differing names of a conflict, and the members a manual run's answer
adds to a run's (``clientToken``, ``requested_by``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, assert_never

from flask import Response

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
from handlers.answers import answer_of, kept_answer, note_outcome, run_answer
from handlers.problems import problem
from handlers.replayed_response import StoredResponse
from models import RunRecord

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
            return _with_expiry(kept_answer(outcome, replayed_status), outcome.record)
        case Conflict():
            record = outcome.record
            differing = differing_names(record.parameters, given, exclude)
            answer = answer_of(outcome, client=True)
            assert answer.error is not None  # a conflict is a problem
            response = problem(
                answer.status,
                answer.error,
                "this idempotency key was already used with different parameters"
                + (f": {', '.join(differing)}" if differing else "")
                + "; use a new key for a different request",
                run_id=record.run_id,
                differing=differing,
            )
            return _with_expiry(response, record)
        case JobMismatch():
            return run_answer(outcome, client=True)
        case Released() if live:
            return live[0]  # a retryable answer, not kept: the key is free again
        case Released():  # the guard's own work failed before the view answered: never expected
            return run_answer(outcome, client=True)
        case InProgress() | Contended() | Overlap() | Stale():
            response = run_answer(outcome, client=True)
            return _with_expiry(response, outcome.record) if outcome.record is not None else response
        case Skipped():
            raise TypeError("a guarded call is never skipped: only a late scheduled delivery is")
        case _ as unreachable:
            assert_never(unreachable)


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
        case Finished() | Replayed() if StoredResponse.is_document(outcome.record.kept):
            # Written before manual runs kept their results: the kept HTTP response, replayed.
            response = guarded_response(outcome, [], given, exclude, {201: 200})
        case Finished() | Replayed():
            # The run's answer, as every surface gives it, and what the run API adds: the token and
            # who asked (the table's client rows: 201 for the run this request made).
            added = {"clientToken": client_token, "requested_by": outcome.record.requested_by}
            response = _with_expiry(run_answer(outcome, client=True, **added), outcome.record)
        case Released():
            answer = answer_of(outcome, client=True)
            assert answer.error is not None  # a released run is a problem
            response = problem(
                answer.status,
                answer.error,
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
