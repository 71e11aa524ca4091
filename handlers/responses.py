"""A manual run's answer (``manual_run_response``), on the guard's (``guarded_response``, the
library's: dedup.adapters.flask_guard, which replays kept responses).

Every status is the answers table's (``handlers.answers``: a client's rows, and a kept
response's for a guarded call's record); what is the guard's own is the key's expiry on every
answer about a record, the differing names of a conflict, and the members a manual run's answer
adds to a run's (``clientToken``, ``requested_by``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, assert_never

from flask import Response

from dedup.adapters.flask_guard import guarded_response, run_answer, with_expiry
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
from dedup.stored_response import StoredResponse
from handlers.answers import answer_of, note_outcome
from handlers.problems import problem


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
            response = with_expiry(run_answer(outcome, client=True, **added), outcome.record)
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
