"""The answers table: every outcome of a run and every refusal of the service, as an answer.

A run's outcomes are the library's rows (``dedup.answers``: the same for every handler that runs
work through the protocol); the service's refusals are the app's, here.  ``answer_of`` is the
one place a status is decided for them: the run's record itself
(``completed`` and ``skipped`` 200, ``failed`` 422) or a problem type (``handlers.problems``:
its status and title), with the Retry-After rule of each busy outcome.  It matches the union
with ``assert_never``, so an outcome or a refusal added to it fails the type check here until
the table answers it, and every surface with it.  Four renderings read the table:

- ``run_answer``: the JSON answer (a run's document, or ``application/problem+json``), as a
  Scheduler delivery, a slot run, the task endpoints and the guard get it;
- ``page_status``: the status of the dashboard's page saying why there is no run to see;
- ``task_answer``: a dispatched task's answer, settled (200) unless a retry may cure it;
- the guard's ``kept_answer`` (dedup.adapters.flask_guard): a guarded call's kept HTTP response, replayed.

A client asking under its own token (a manual run, a guarded call: ``client=True``) gets two
rows of its own, both documented (docs/manual-runs.md): the run its request made is 201, and a
run in progress says to poll again within 30 s, not after the whole lease as a delivery is told.

| outcome or refusal                                 | status | problem type          | Retry-After          |
|----------------------------------------------------|--------|-----------------------|----------------------|
| finished, replayed (a duplicate), skipped          | 200 (422 failed) | (the run's record) |                   |
| finished, the run a client's request made          | 201 (422 failed) | (the run's record) |                   |
| finished, replayed, of a guarded call              | its kept response's (``replayed_status`` maps a replay's)    |
| released (a retryable failure)                     | 500    | RetryableFailure      |                      |
| conflict (the key with other parameters)           | 422    | ConflictException     |                      |
| job mismatch (the key names another job's run)     | 422    | JobMismatch (ERROR)   |                      |
| in progress (a live lease)                         | 409    | RunInProgress         | until the lease ends |
| in progress, asked by a client (it polls)          | 409    | RunInProgress         | that, at most 30     |
| contended                                          | 409    | RunContended          | the protocol's hint  |
| overlap (the job's lock is held)                   | 409    | ExecutionOverlap      | until its lease ends |
| stale (the lease was lost)                         | 409    | StaleAttempt          | 1                    |
| not found, invalid                                 | 404, 400 | NotFound, InvalidParameterException |       |
| declined (a slot not due, unknown, a reopen without its attempt) | 422, 428 | its kind      |                      |
"""

from __future__ import annotations

from typing import Any, assert_never

from flask import Response, jsonify

from dedup.adapters.flask_guard import run_answer
from dedup.answers import AnswerRule, outcome_rule
from dedup.answers import typed as library_typed
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
from handlers.logs import note_run
from handlers.problems import TYPES_BY_ERROR, problem
from service.errors import Declined, Invalid, NotFound

# What the table answers: every outcome of a run, and every refusal of the service.
Answerable = RunOutcome | NotFound | Invalid | Declined

INVALID = "InvalidParameterException"
NOT_FOUND = "NotFound"  # an HTTP error of no type of its own: about:blank, titled with its phrase


def typed(error: str, retry_after: int | None = None) -> AnswerRule:
    """A row answered with the app's problem type ``error``, at its status."""
    return library_typed(TYPES_BY_ERROR[error], retry_after)


def answer_of(said: Answerable, client: bool = False) -> AnswerRule:
    """The table: what ``said`` is answered, whichever surface asked.  ``client``: asked by a
    client under its own token (a manual run, a guarded call), not by Scheduler or a queue."""
    if isinstance(said, NotFound | Invalid | Declined):
        return _refusal_rule(said)
    return outcome_rule(said, client)


def _refusal_rule(said: NotFound | Invalid | Declined) -> AnswerRule:
    """The app's own rows: its service's refusals."""
    match said:
        case NotFound():
            return AnswerRule(404, NOT_FOUND)
        case Invalid():
            return typed(INVALID)
        case Declined():
            return typed(said.kind)
        case _ as unreachable:
            assert_never(unreachable)


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


def outcome_response(outcome: RunOutcome) -> Response:
    """``run_answer``, named on the request's log line and carrying the run id (X-Dedup-Run-Id)."""
    note_outcome(outcome)
    response = run_answer(outcome)
    response.headers["X-Dedup-Run-Id"] = outcome.run_id
    return response


def refusal_problem(refusal: NotFound | Invalid | Declined) -> Response:
    """A service refusal as its problem: the table's status and type, the refusal's words and details."""
    answer = answer_of(refusal)
    assert answer.error is not None  # every refusal is a problem
    details = refusal.details if isinstance(refusal, Declined) else {}
    return problem(answer.status, answer.error, refusal.message, **details)


def page_status(said: Answerable) -> int:
    """The status of the dashboard's page that says why there is no run to see (the page's words
    are its own, for people; the status is the table's)."""
    return answer_of(said).status


# What a dispatched task may cure by being delivered again: an attempt holds the run, or it
# was released.  Every other answer settles the task (2xx), or Cloud Tasks would retry it.
TASK_RETRIES = (409, 500)


def task_answer(said: RunOutcome | NotFound | Invalid | Declined) -> Response:
    """A dispatched task's answer: as itself where a retry may cure it (or it succeeded), else
    settled: 200, with the status it would have had and the answer inside."""
    if isinstance(said, NotFound | Invalid | Declined):
        answer = answer_of(said)
        inside: dict[str, Any] = {"detail": said.message}
        if isinstance(said, Declined):
            inside = {"error": said.kind, **inside}
        return settled(answer.status, inside)
    response = outcome_response(said)
    if response.status_code in TASK_RETRIES or response.status_code < 300:
        return response
    return settled(response.status_code, response.get_json(silent=True))


def settled(status: int, answer: object) -> Response:
    """200 for a task whose answer a retry cannot change, with the answer it got."""
    return jsonify({"settled": True, "status": status, "answer": answer})
