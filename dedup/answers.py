"""The answers table for a run's outcomes: the one place a status is decided for them, and what
each answer says, for every handler that runs work through the protocol.

``outcome_rule`` matches the outcome union with ``assert_never``, so an outcome added to it
fails the type check here until the table answers it.  ``answer`` renders a row, framework
free: a status, headers and a JSON document (the run's, or an RFC 9457 problem).  A host app
adds rows of its own (the exactly-once app: its service's refusals, handlers/answers.py) and
renders the answer with its framework.

| outcome                                        | status           | problem type     | Retry-After          |
|------------------------------------------------|------------------|------------------|----------------------|
| finished, replayed (a duplicate), skipped      | 200 (422 failed) | (the run's record) |                    |
| finished, the run a client's request made      | 201 (422 failed) | (the run's record) |                    |
| released (a retryable failure)                 | 500              | RetryableFailure |                      |
| conflict (the key with other parameters)       | 422              | ConflictException |                     |
| job mismatch (the key names another job's run) | 422              | JobMismatch (ERROR) |                   |
| in progress (a live lease)                     | 409              | RunInProgress    | until the lease ends |
| in progress, asked by a client (it polls)      | 409              | RunInProgress    | that, at most 30     |
| contended                                      | 409              | RunContended     | the protocol's hint  |
| overlap (the job's lock is held)               | 409              | ExecutionOverlap | until its lease ends |
| stale (the lease was lost)                     | 409              | StaleAttempt     | 1                    |
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, assert_never

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
from dedup.problems import MEDIA_TYPE, RUN_TYPES_BY_ERROR, ProblemType, phrase, problem_document
from dedup.run_record import DELIVERED_SOURCES, RunRecord, RunStatus

log = logging.getLogger(__name__)

# A client polling a run under its token is told a short wait, not the whole lease.
MAX_CLIENT_RETRY_AFTER_SECONDS = 30
JSON = "application/json"


@dataclasses.dataclass(frozen=True)
class AnswerRule:
    """One row of the table: the status, the problem type (None: the run's record answers), and
    how many seconds to wait before sending the same request again (None: no Retry-After)."""

    status: int
    error: str | None = None
    retry_after: int | None = None
    # The problem type's declaration (title, retryable, its page); None for a record or a plain HTTP error.
    kind: ProblemType | None = dataclasses.field(default=None, compare=False)

    @property
    def title(self) -> str:
        """What the problem's ``title`` says: its type's, else the status phrase (about:blank's)."""
        return self.kind.title if self.kind else phrase(self.status)


def record_status(record: RunRecord) -> int:
    """A finished run's own answer: done with (completed, or skipped, so Scheduler stops retrying a
    late delivery: never a 5xx) is 200; failed for good is 422."""
    return 200 if record.status in (RunStatus.COMPLETED, RunStatus.SKIPPED) else 422


def typed(kind: ProblemType, retry_after: int | None = None) -> AnswerRule:
    """A row answered with the problem type ``kind``, at its status."""
    return AnswerRule(kind.status, kind.error, retry_after, kind)


def outcome_rule(outcome: RunOutcome, client: bool = False) -> AnswerRule:
    """The table's row for ``outcome``.  ``client``: asked by a client under its own token (a
    manual run, a guarded call), not by Scheduler or a queue."""
    run = RUN_TYPES_BY_ERROR
    match outcome:
        case Finished() if client and record_status(outcome.record) == 200:
            return AnswerRule(201)  # the run this request made: created
        case Finished() | Replayed() | Skipped():
            return AnswerRule(record_status(outcome.record))
        case Released():
            return typed(run["RetryableFailure"])
        case Conflict():
            return typed(run["ConflictException"])
        case JobMismatch():
            return typed(run["JobMismatch"])
        case InProgress() if client:
            return typed(run["RunInProgress"], min(outcome.retry_after_seconds, MAX_CLIENT_RETRY_AFTER_SECONDS))
        case InProgress():
            return typed(run["RunInProgress"], outcome.retry_after_seconds)
        case Contended():
            return typed(run["RunContended"], outcome.retry_after_seconds)
        case Overlap():
            return typed(run["ExecutionOverlap"], outcome.retry_after_seconds)
        case Stale():
            return typed(run["StaleAttempt"], 1)  # the next delivery sees what the new owner did
        case _ as unreachable:
            assert_never(unreachable)


@dataclasses.dataclass(frozen=True)
class Answer:
    """What to send: a status, headers (Retry-After, Idempotent-Replayed) and a JSON document of
    ``media_type`` (the run's, or a problem)."""

    status: int
    headers: dict[str, str]
    document: dict[str, Any]
    media_type: str

    def body(self) -> bytes:
        """The document as JSON, its members in the order they were built (a problem's: the RFC's)."""
        return json.dumps(self.document).encode()

    def wsgi(self) -> tuple[str, list[tuple[str, str]], bytes]:
        """The status line, headers and body a WSGI server sends (``start_response``'s arguments and the body)."""
        body = self.body()
        headers = [("Content-Type", self.media_type), ("Content-Length", str(len(body))), *self.headers.items()]
        return f"{self.status} {phrase(self.status)}", headers, body


def replayed_headers(outcome: RunOutcome) -> dict[str, str]:
    """``Idempotent-Replayed: true`` on a duplicate's answer, whatever renders it."""
    return {"Idempotent-Replayed": "true"} if isinstance(outcome, Replayed) else {}


def answer(outcome: RunOutcome, client: bool = False, at: str | None = None, **added: Any) -> Answer:
    """The answer to ``outcome`` as the table says: the run's document for a record row (with
    what a surface ``added`` to it), else its problem (``at``: its instance, the request's path);
    Retry-After as the row says, and ``Idempotent-Replayed`` on a duplicate."""
    rule = outcome_rule(outcome, client)
    headers = replayed_headers(outcome)
    if rule.error is None:
        assert isinstance(outcome, Finished | Replayed | Skipped)  # the table's record rows
        document = {**answer_body(outcome.record, duplicate=isinstance(outcome, Replayed)), **added}
        media_type = JSON
    else:
        detail, members = problem_of(outcome)
        document = problem_document(rule.status, rule.error, detail, at=at, **members)
        media_type = MEDIA_TYPE
    if rule.retry_after is not None:
        headers["Retry-After"] = str(rule.retry_after)
    return Answer(rule.status, headers, document, media_type)


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
    if record.compacted_into:
        document["compacted_into"] = record.compacted_into  # a compacted catch-up's run stands for it
    if record.covers:
        document["covered_slots"] = len(record.covers)  # the slots this run stands for beside its own
    if record.status == RunStatus.COMPLETED:
        document["result"] = record.result
    elif record.status == RunStatus.SKIPPED:
        document["reason"] = (record.error or {}).get("message")
    else:
        document["error"] = record.error
    return document


def problem_of(outcome: RunOutcome) -> tuple[str, dict[str, Any]]:
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
