"""Every error the app sends is an RFC 9457 problem (``application/problem+json``), built here.

A problem carries the RFC's members (``type``, ``title``, ``status``, ``detail``,
``instance``), ``retryable`` (may the same request, sent again, succeed?), and the
members clients read before problems existed: ``error`` (the code) and ``message``
(the detail), then whatever the occurrence adds (``run_id``, ``differing``, ...).

``type`` is a relative URI, ``/problems/<slug>``: the app serves each type's
documentation there (``handlers.problem_pages``; ``docs/problems.md`` holds the same text), and a relative
reference stays the same string whatever host name the app is reached by.  An
HTTP error the app has no type of its own for (404, 405, 413, ...) is
``about:blank``, titled with the status phrase, as RFC 9457 §4.2.1 says.

None is ever a 503: for App Engine targets Cloud Scheduler retries 503 without
counting it against retryCount, so an outage would be retried without bound.
"""

from __future__ import annotations

import dataclasses
import json
import re
from http import HTTPStatus
from typing import Any

from flask import Response, has_request_context, request

MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "/problems/"
# A status the same request may meet again and then succeed (RFC 9110 §15; 425 and 429 wait).
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 504})


@dataclasses.dataclass(frozen=True)
class ProblemType:
    """One kind of error: the code clients match on, its title, and what to do about it."""

    error: str  # the code, also the ``error`` member ("RunInProgress")
    status: int  # the HTTP status every occurrence has
    title: str  # the same for every occurrence (RFC 9457 §3.1.3)
    retryable: bool  # whether the same request, sent again later, can succeed
    explanation: str  # what happened and what to do: the documentation page

    @property
    def slug(self) -> str:
        return re.sub(r"(?<!^)(?=[A-Z])", "-", self.error).lower()

    @property
    def uri(self) -> str:
        return TYPE_PREFIX + self.slug


PROBLEM_TYPES: tuple[ProblemType, ...] = (
    ProblemType(
        "InvalidRequest",
        400,
        "Not a Cloud Scheduler delivery",
        False,
        "The delivery's X-CloudScheduler-JobName or X-CloudScheduler-ScheduleTime header, or its "
        "project and location scope, is missing or malformed (`field` names which). Nothing was "
        "recorded. Fix the Scheduler job's target; sending the same delivery again cannot succeed.",
    ),
    ProblemType(
        "InvalidParameterException",
        400,
        "Invalid parameters",
        False,
        "A parameter of the run API (a client token, a time, a query parameter, the JSON body) "
        "breaks the rule the detail names. Nothing ran and nothing was recorded: fix the request.",
    ),
    ProblemType(
        "InvalidIdempotencyRequest",
        400,
        "Invalid idempotency key or body",
        False,
        "A guarded endpoint was sent no Idempotency-Key where one is required, a key that is not a "
        "Structured Field String of 1 to 255 printable characters, the field twice, or a body that "
        "is not strict JSON. Nothing ran and nothing was recorded: fix the request.",
    ),
    ProblemType(
        "ConflictException",
        422,
        "Idempotency key reused with other parameters",
        False,
        "The key (or client token) was first used with other parameters; `differing` names them. "
        "Nothing ran and the first request's answer was not replayed. Use a new key for a "
        "different request; send the first request's parameters to get its answer.",
    ),
    ProblemType(
        "JobMismatch",
        422,
        "Run key of another job",
        False,
        "The request's run key names a run of another job (two Scheduler jobs with one id and no "
        "scope, or a key reused across jobs). Nothing ran and the other job's result was not "
        "replayed; the error is logged at ERROR. Scope the deliveries or give the jobs distinct ids.",
    ),
    ProblemType(
        "RunInProgress",
        409,
        "Run in progress",
        True,
        "Another attempt of this run holds a live lease (`lease_expires`). Send the same request "
        "again after Retry-After: it is answered from the run's record once the run finishes.",
    ),
    ProblemType(
        "RunContended",
        409,
        "Run being claimed",
        True,
        "Other deliveries of this run were claiming it at the same moment. Send the same request "
        "again after Retry-After.",
    ),
    ProblemType(
        "ExecutionOverlap",
        409,
        "Another execution holds the job",
        True,
        "The job forbids overlap and another execution (`holder_run_id`) holds it. This one did "
        "not run; send it again after Retry-After.",
    ),
    ProblemType(
        "StaleAttempt",
        409,
        "Attempt lost its lease",
        True,
        "This attempt's lease ran out and another attempt took the run over, so its outcome was not "
        "recorded. Send the same request again: it is answered with what the new owner did.",
    ),
    ProblemType(
        "RetryableFailure",
        500,
        "Run failed and was released",
        True,
        "The job failed with a retryable error (`cause`) and its run was released. Send the same "
        "request again, with the same key: it runs as the next attempt.",
    ),
    ProblemType(
        "ExecutionUnknown",
        422,
        "The slot's record is forgotten",
        False,
        "No record of this slot is left: the ledger keeps a run only its job's retention past its "
        "schedule time, so it may have completed. Send force=true to run it anyway.",
    ),
    ProblemType(
        "CloudSchedulerError",
        502,
        "Cloud Scheduler did not do its part",
        True,
        "The app recorded the pause or resume, but Cloud Scheduler's job was not paused or resumed "
        "(`detail` says why and gives the gcloud command). Send the same request again, or run the command.",
    ),
    ProblemType(
        "DispatchFailed",
        502,
        "The queue did not take the work",
        True,
        "The change was recorded, but the queue (Cloud Tasks) did not take the work it asks for. "
        "Send the same request again: work it took already is refused by the queue, not done twice.",
    ),
    ProblemType(
        "SlotNotDue",
        422,
        "The slot has not come",
        False,
        "The slot's schedule time is still ahead: Cloud Scheduler delivers it then, and running it "
        "now would answer that delivery as a duplicate. To run the job now, start a manual run.",
    ),
    ProblemType(
        "PreconditionRequired",
        428,
        "Attempt required to reopen",
        False,
        "The slot failed or was skipped; running it again needs the attempt you saw "
        "(`attempt`), so that sending the same request twice cannot run it twice.",
    ),
    ProblemType(
        "RunNotRetryable",
        409,
        "Run not retryable",
        False,
        "Only a failed manual run of a job still declared is retried (with its parameters, under a "
        "token of its own); this run is another (`run_status`, `source`), or its job (`job_id`) is "
        "gone from the jobs file. Nothing was queued.",
    ),
    ProblemType(
        "Unauthenticated",
        401,
        "Unauthenticated",
        False,
        "The request carried no credentials, or credentials that do not verify. Nothing was read or "
        "written. See WWW-Authenticate and docs/access.md, 'Who may call'.",
    ),
    ProblemType(
        "Forbidden",
        403,
        "Forbidden",
        False,
        "The caller is verified but lacks the role the endpoint needs, or a browser sent a "
        "state-changing request from another site. Nothing was read or written.",
    ),
    ProblemType(
        "ForbiddenEvidence",
        403,
        "Evidence the caller may not send",
        False,
        "The request carries App Engine's internal markers (X-Appengine-Cron, X-AppEngine-QueueName, "
        "X-AppEngine-TaskName, X-Appengine-User-Ip 0.1.0.2 or 0.1.0.1) beside a signed-in user "
        "(X-Appengine-User-Email); the detail names which. App Engine lets a signed-in admin set its headers, "
        "to test, so they mark its own requests only when no one is signed in. Nothing was read or written: "
        "send the request without them.",
    ),
    ProblemType(
        "InternalError",
        500,
        "Internal error",
        True,
        "Datastore (or the signing keys of ID tokens) could not be reached, or the app failed. No "
        "job ran without a committed claim. Send the same request again, with the same key.",
    ),
)
TYPES_BY_ERROR: dict[str, ProblemType] = {kind.error: kind for kind in PROBLEM_TYPES}
TYPES_BY_SLUG: dict[str, ProblemType] = {kind.slug: kind for kind in PROBLEM_TYPES}
# The RFC's members and ours: an occurrence's extras never overwrite them.
RESERVED_MEMBERS = frozenset({"type", "title", "status", "detail", "instance", "retryable", "error", "message"})


def problem(http_status: int, error: str, detail: str, /, *, retryable: bool | None = None, **extra: Any) -> Response:
    """The answer for one error: ``error`` is its code, ``detail`` says what happened this time.

    ``retryable`` defaults to the type's (or, for a plain HTTP error, to its status's).
    """
    if http_status == 503:
        raise ValueError("the app never answers 503: Cloud Scheduler retries it without bound")
    clash = RESERVED_MEMBERS & extra.keys()
    if clash:
        raise ValueError(f"{', '.join(sorted(clash))}: reserved problem members")
    kind = TYPES_BY_ERROR.get(error)
    if kind is not None and kind.status != http_status:
        raise ValueError(f"{error} is a {kind.status}, not a {http_status}")
    document: dict[str, Any] = {
        "type": kind.uri if kind else "about:blank",
        "title": kind.title if kind else _phrase(http_status),
        "status": http_status,
        "detail": detail,
    }
    if has_request_context():
        document["instance"] = request.path  # where it happened; the query may hold secrets
    document["retryable"] = (
        retryable if retryable is not None else kind.retryable if kind else http_status in RETRYABLE_STATUSES
    )
    document.update(error=error, message=detail, **extra)
    # The standard library's JSON: members in the RFC's order, whatever the host app's provider sorts.
    return Response(json.dumps(document), status=http_status, mimetype=MEDIA_TYPE)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
