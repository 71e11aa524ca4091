"""Problems (RFC 9457, ``application/problem+json``): what every refusal of a run is answered with.

A problem carries the RFC's members (``type``, ``title``, ``status``, ``detail``,
``instance``), ``retryable`` (may the same request, sent again, succeed?), and the
members clients read before problems existed: ``error`` (the code) and ``message``
(the detail), then whatever the occurrence adds (``run_id``, ``differing``, ...).

``type`` is a relative URI, ``/problems/<slug>``: the exactly-once app serves each type's
documentation there, and a relative reference stays the same string whatever host name it is
reached by.  An HTTP error with no type of its own is ``about:blank``, titled with the status
phrase, as RFC 9457 §4.2.1 says.

None is ever a 503: for App Engine targets Cloud Scheduler retries 503 without counting it
against retryCount, so an outage would be retried without bound.

The types of a run's outcomes are declared here (RUN_PROBLEM_TYPES), for every handler that
answers deliveries through the protocol; a host app adds its own (``problem_document``'s
``types``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "/problems/"
# A status the same request may meet again and then succeed (RFC 9110 §15; 425 and 429 wait).
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 504})
# The RFC's members and ours: an occurrence's extras never overwrite them.
RESERVED_MEMBERS = frozenset({"type", "title", "status", "detail", "instance", "retryable", "error", "message"})


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


# The problems a delivery, a manual run or a guarded call is answered with by the protocol, and
# those of a caller refused or a store out of reach.
RUN_PROBLEM_TYPES: tuple[ProblemType, ...] = (
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
        "InvalidRequest",
        400,
        "Not a Cloud Scheduler delivery",
        False,
        "The delivery's X-CloudScheduler-JobName or X-CloudScheduler-ScheduleTime header, or its "
        "project and location scope, is missing or malformed (`field` names which). Nothing was "
        "recorded. Fix the Scheduler job's target; sending the same delivery again cannot succeed.",
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
        "InternalError",
        500,
        "Internal error",
        True,
        "Datastore (or the signing keys of ID tokens) could not be reached, or the app failed. No "
        "job ran without a committed claim. Send the same request again, with the same key.",
    ),
)
RUN_TYPES_BY_ERROR: dict[str, ProblemType] = {kind.error: kind for kind in RUN_PROBLEM_TYPES}


def problem_document(
    http_status: int,
    error: str,
    detail: str,
    /,
    *,
    types: Mapping[str, ProblemType] = RUN_TYPES_BY_ERROR,
    retryable: bool | None = None,
    at: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The problem for one error, its members in the RFC's order: ``error`` is its code (a type
    of ``types``, else about:blank), ``detail`` says what happened this time, ``at`` where (its
    ``instance``: the request's path, since its query may hold secrets).  ``retryable`` defaults to the type's (or,
    for a plain HTTP error, to its status's)."""
    if http_status == 503:
        raise ValueError("a problem is never a 503: Cloud Scheduler retries it without bound")
    clash = RESERVED_MEMBERS & extra.keys()
    if clash:
        raise ValueError(f"{', '.join(sorted(clash))}: reserved problem members")
    kind = types.get(error)
    if kind is not None and kind.status != http_status:
        raise ValueError(f"{error} is a {kind.status}, not a {http_status}")
    document: dict[str, Any] = {
        "type": kind.uri if kind else "about:blank",
        "title": kind.title if kind else phrase(http_status),
        "status": http_status,
        "detail": detail,
    }
    if at is not None:
        document["instance"] = at
    document["retryable"] = (
        retryable if retryable is not None else kind.retryable if kind else http_status in RETRYABLE_STATUSES
    )
    document.update(error=error, message=detail, **extra)
    return document


def phrase(status: int) -> str:
    """The status's reason phrase (about:blank's title)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
