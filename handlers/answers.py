"""The answers table: every outcome of a run and every refusal of the service, as an answer.

``answer_of`` is the one place a status is decided for them: the run's record itself
(``completed`` and ``skipped`` 200, ``failed`` 422) or a problem type (``handlers.problems``:
its status and title), with the Retry-After rule of each busy outcome.  It matches the union
with ``assert_never``, so an outcome or a refusal added to it fails the type check here until
the table answers it, and every surface with it.  Three renderings read the table:

- ``run_answer``: the JSON answer (a run's document, or ``application/problem+json``), as a
  Scheduler delivery, a slot run, the task endpoints and the guard get it;
- ``page_status``: the status of the dashboard's page saying why there is no run to see;
- ``task_answer``: a dispatched task's answer, settled (200) unless a retry may cure it;
- ``kept_answer``: a guarded call's kept HTTP response, replayed (its record's row, for the guard).

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

import dataclasses
import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, assert_never

from flask import Response, jsonify

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
from handlers.logs import note_run
from handlers.problems import TYPES_BY_ERROR, ProblemType, problem
from handlers.replayed_response import StoredResponse
from models import DELIVERED_SOURCES, RunRecord, RunStatus
from service.errors import Declined, Invalid, NotFound

log = logging.getLogger(__name__)

# What the table answers: every outcome of a run, and every refusal of the service.
Answerable = RunOutcome | NotFound | Invalid | Declined

INVALID = "InvalidParameterException"
NOT_FOUND = "NotFound"  # an HTTP error of no type of its own: about:blank, titled with its phrase
# A client polling a run under its token is told a short wait, not the whole lease.
MAX_CLIENT_RETRY_AFTER_SECONDS = 30


@dataclasses.dataclass(frozen=True)
class AnswerRule:
    """One row of the table: the status, the problem type (None: the run's record answers), and
    how many seconds to wait before sending the same request again (None: no Retry-After)."""

    status: int
    error: str | None = None
    retry_after: int | None = None

    @property
    def kind(self) -> ProblemType | None:
        """The problem type's declaration (title, retryable, its page); None for a record or NotFound."""
        return TYPES_BY_ERROR.get(self.error) if self.error else None

    @property
    def title(self) -> str:
        """What the problem's ``title`` says: its type's, else the status phrase (about:blank's)."""
        return self.kind.title if self.kind else HTTPStatus(self.status).phrase


def record_status(record: RunRecord) -> int:
    """A finished run's own answer: done with (completed, or skipped, so Scheduler stops retrying a
    late delivery: never a 5xx) is 200; failed for good is 422."""
    return 200 if record.status in (RunStatus.COMPLETED, RunStatus.SKIPPED) else 422


def typed(error: str, retry_after: int | None = None) -> AnswerRule:
    """A row answered with the problem type ``error``, at its status."""
    return AnswerRule(TYPES_BY_ERROR[error].status, error, retry_after)


def answer_of(said: Answerable, client: bool = False) -> AnswerRule:
    """The table: what ``said`` is answered, whichever surface asked.  ``client``: asked by a
    client under its own token (a manual run, a guarded call), not by Scheduler or a queue."""
    match said:
        case Finished() if client and record_status(said.record) == 200:
            return AnswerRule(201)  # the run this request made: created
        case Finished() | Replayed() | Skipped():
            return AnswerRule(record_status(said.record))
        case Released():
            return typed("RetryableFailure")
        case Conflict():
            return typed("ConflictException")
        case JobMismatch():
            return typed("JobMismatch")
        case InProgress() if client:
            return typed("RunInProgress", min(said.retry_after_seconds, MAX_CLIENT_RETRY_AFTER_SECONDS))
        case InProgress():
            return typed("RunInProgress", said.retry_after_seconds)
        case Contended():
            return typed("RunContended", said.retry_after_seconds)
        case Overlap():
            return typed("ExecutionOverlap", said.retry_after_seconds)
        case Stale():
            return typed("StaleAttempt", 1)  # the next delivery sees what the new owner did
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


def answer_body(record: RunRecord, duplicate: bool) -> dict[str, Any]:
    """A run's answer, whichever surface asked for it: a surface that needs more (the run API's
    ``clientToken``) adds to it."""
    document: dict[str, Any] = {
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


def run_answer(outcome: RunOutcome, client: bool = False, **added: Any) -> Response:
    """The JSON answer: the run's document for a record the table answers with (and what a surface
    ``added`` to it), else its problem, with Retry-After as the table says; ``Idempotent-Replayed``
    on a duplicate.  ``client``: as ``answer_of``."""
    answer = answer_of(outcome, client)
    if answer.error is None:
        assert isinstance(outcome, Finished | Replayed | Skipped)  # the table's record rows
        response = jsonify({**answer_body(outcome.record, duplicate=isinstance(outcome, Replayed)), **added})
        response.status_code = answer.status
        _mark_replayed(response, outcome)
    else:
        detail, members = _problem_of(outcome)
        response = problem(answer.status, answer.error, detail, **members)
    if answer.retry_after is not None:
        response.headers["Retry-After"] = str(answer.retry_after)
    return response


def _mark_replayed(response: Response, outcome: RunOutcome) -> None:
    if isinstance(outcome, Replayed):
        response.headers["Idempotent-Replayed"] = "true"


def kept_answer(outcome: Finished | Replayed, replayed_status: Mapping[int, int]) -> Response:
    """A guarded call's record row: the HTTP response it kept, rebuilt; a replay's status as the
    guard's ``replayed_status`` maps it (``{201: 200}``: a retry of a create is told 200)."""
    stored = outcome.record.kept
    if not StoredResponse.is_document(stored):  # not written by a guard: never expected
        return problem(500, "InternalError", "this key's record holds no response")
    kept = StoredResponse.from_document(stored)
    status = replayed_status.get(kept.status, kept.status) if isinstance(outcome, Replayed) else kept.status
    response = Response(kept.body_bytes(), status=status, headers=dict(kept.headers))
    _mark_replayed(response, outcome)
    return response


def outcome_response(outcome: RunOutcome) -> Response:
    """``run_answer``, named on the request's log line and carrying the run id (X-Dedup-Run-Id)."""
    note_outcome(outcome)
    response = run_answer(outcome)
    response.headers["X-Dedup-Run-Id"] = outcome.run_id
    return response


def _problem_of(outcome: RunOutcome) -> tuple[str, dict[str, Any]]:
    """An outcome's problem: its detail and the members it adds."""
    match outcome:
        case Released():
            return (
                f"attempt {outcome.attempt} failed and released the run for a retry"
                + (f": {message}" if (message := outcome.error.get("message")) else ""),
                {
                    "run_id": outcome.run_id,
                    "attempt": outcome.attempt,
                    "run_status": "released",
                    "cause": outcome.error,
                },
            )
        case Conflict():  # only client-token runs carry fingerprints
            return "this key belongs to a run with other parameters", {"run_id": outcome.record.run_id}
        case JobMismatch():
            return _job_mismatch(outcome)
        case InProgress():
            record = outcome.record
            return (
                f"attempt {record.attempt} of this run holds its lease until "
                f"{format_utc(record.lease_expires)}; retry after it",
                {
                    "run_id": record.run_id,
                    "run_status": record.status,
                    "attempt": record.attempt,
                    "lease_expires": format_utc(record.lease_expires),
                },
            )
        case Contended():
            return (
                "other deliveries of this run are claiming it at this moment; retry shortly",
                {"run_id": outcome.run_id},
            )
        case Overlap():
            return (
                f"the job forbids overlap and another execution (run {outcome.holder_run_id}) holds it; "
                "this one did not run: retry after it",
                {"run_id": outcome.run_id, "holder_run_id": outcome.holder_run_id},
            )
        case Stale():
            current = outcome.current
            return (
                f"attempt {outcome.attempt} lost its lease and another attempt took the run over; "
                "its outcome was not recorded",
                {
                    "run_id": outcome.run_id,
                    "attempt": outcome.attempt,
                    "current_attempt": current.attempt if current else None,
                    "current_status": current.status if current else None,
                },
            )
        case Finished() | Replayed() | Skipped():
            raise TypeError("the run's record answers it, not a problem")
        case _ as unreachable:
            assert_never(unreachable)


def _job_mismatch(outcome: JobMismatch) -> tuple[str, dict[str, Any]]:
    """A key that names another job's run: a configuration error, logged at ERROR.  Nothing ran
    and nothing was replayed."""
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
    return message, {"run_id": record.run_id, "job_id": outcome.job_id, "recorded_job_id": record.job_id}


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
