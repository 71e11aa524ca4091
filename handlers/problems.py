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

from typing import Any

from flask import Response

from dedup.adapters.flask_guard import problem as problem_response
from dedup.problems import (
    MEDIA_TYPE,
    RETRYABLE_STATUSES,
    RUN_TYPES_BY_ERROR,
    TYPE_PREFIX,
    ProblemType,
)

__all__ = [
    "MEDIA_TYPE",
    "PROBLEM_TYPES",
    "RETRYABLE_STATUSES",
    "TYPES_BY_ERROR",
    "TYPES_BY_SLUG",
    "TYPE_PREFIX",
    "ProblemType",
    "problem",
]

# The run outcomes' types are the library's (dedup.problems); the app adds its own, in the order
# docs/problems.md lists them.
_RUN = RUN_TYPES_BY_ERROR


PROBLEM_TYPES: tuple[ProblemType, ...] = (
    _RUN["InvalidRequest"],
    ProblemType(
        "InvalidParameterException",
        400,
        "Invalid parameters",
        False,
        "A parameter of the run API (a client token, a time, a query parameter, the JSON body) "
        "breaks the rule the detail names. Nothing ran and nothing was recorded: fix the request.",
    ),
    _RUN["InvalidIdempotencyRequest"],
    _RUN["ConflictException"],
    _RUN["JobMismatch"],
    _RUN["RunInProgress"],
    _RUN["RunContended"],
    _RUN["ExecutionOverlap"],
    _RUN["StaleAttempt"],
    _RUN["RetryableFailure"],
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
        "StepNotWaiting",
        409,
        "Run not waiting on that step",
        False,
        "A step decision (done, or run it again) applies only while the run waits for a review of that "
        "step at the attempt you saw; it no longer does (another decision, a reopen, or another step). "
        "Nothing was written: look at the run again.",
    ),
    ProblemType(
        "RunsElsewhere",
        422,
        "Run by its own handler",
        False,
        "The job is an external target: a handler served elsewhere with the library runs it, and this "
        "app never claims its runs. A slot of it is run through the dashboard's run this slot (a Cloud "
        "Tasks task to the handler, under the slot's key); a failed one is run again from the handler's "
        "side. Nothing was recorded.",
    ),
    _RUN["Unauthenticated"],
    _RUN["Forbidden"],
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
    _RUN["InternalError"],
)
TYPES_BY_ERROR: dict[str, ProblemType] = {kind.error: kind for kind in PROBLEM_TYPES}
TYPES_BY_SLUG: dict[str, ProblemType] = {kind.slug: kind for kind in PROBLEM_TYPES}


def problem(http_status: int, error: str, detail: str, /, *, retryable: bool | None = None, **extra: Any) -> Response:
    """The answer for one error, of the app's types (the library's rendering: one for both).

    ``retryable`` defaults to the type's (or, for a plain HTTP error, to its status's).
    """
    return problem_response(http_status, error, detail, types=TYPES_BY_ERROR, retryable=retryable, **extra)
