"""Calling Google Cloud REST APIs with Application Default Credentials.

On App Engine the credentials are the app's service account, fetched from
the metadata server by google-auth; no key files.  Errors are sorted the
way the job kinds need: 429, 5xx, UNAVAILABLE, DEADLINE_EXCEEDED and the
like are retryable; 400, 403, 404, FAILED_PRECONDITION and other client
errors are permanent, with the API's own message.  A create sent without a
request id whose outcome the answer leaves open raises CreateInDoubt (a
retryable error), so that its caller looks for what it may have started.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import threading
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Self

import google.auth
import google.auth.exceptions
import requests
from google.auth.transport.requests import AuthorizedSession
from pydantic import Field, PlainValidator, model_validator

from dedup.errors import PermanentJobError, RetryableJobError
from dedup.keys import format_utc
from dedup.steps import NeedsReview, OnUnknown, Semantic, StepNotTaken, StepState, step_key
from jobs.base import RunContext
from jobs.declared import BaseUrl, JobDeclaration, OmittableSeconds, check, field_problem, non_empty
from jobs.trace_headers import outgoing_trace_headers

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
RETRYABLE_API_STATUSES = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "INTERNAL", "UNKNOWN"}
)
DEFAULT_TIMEOUT_SECONDS = 30

_credentials_lock = threading.Lock()
_credentials = None
_sessions = threading.local()


def _session() -> AuthorizedSession:
    """One AuthorizedSession per thread over one set of process-wide ADC credentials."""
    global _credentials
    with _credentials_lock:
        if _credentials is None:
            _credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
        credentials = _credentials
    session = getattr(_sessions, "session", None)
    if session is None or session.credentials is not credentials:
        session = _sessions.session = AuthorizedSession(credentials)
    return session


def _resource_pattern(collection: str) -> str:
    return (
        rf"projects/(?P<project>[a-z0-9.:-]+)/locations/(?P<location>[a-z0-9-]+)/{collection}/(?P<name>[A-Za-z0-9_-]+)"
    )


def resource_name(collection: str) -> PlainValidator:
    """The check of a ``projects/P/locations/L/<collection>/N`` name."""

    def name(value: Any) -> str:
        if not re.fullmatch(_resource_pattern(collection), non_empty(value)):
            raise ValueError(f"must look like projects/PROJECT/locations/LOCATION/{collection}/NAME, got {value!r}")
        return str(value)

    schema = rf"^projects/[a-z0-9.:-]+/locations/[a-z0-9-]+/{collection}/[A-Za-z0-9_-]+$"
    return check(name, Annotated[str, Field(pattern=schema)])


def resource_parts(name: str, collection: str) -> dict[str, str]:
    """project, location and name of a resource name resource_name accepted."""
    match = re.fullmatch(_resource_pattern(collection), name)
    assert match is not None
    return match.groupdict()


class GoogleApiDeclaration(JobDeclaration):
    """The keys of a job calling a Google Cloud API: where, and how long a call may take."""

    # How many calls an attempt makes in a row: all must end inside the lease.
    calls_per_attempt: ClassVar[int] = 1
    api_base: BaseUrl
    """The API's base URL (production's by default; a stand-in's in tests)."""
    timeout_seconds: OmittableSeconds = None
    """How long a call may take, in seconds: by default 30, or a share of a shorter lease."""

    @property
    def timeout(self) -> float:
        return self.timeout_seconds or min(DEFAULT_TIMEOUT_SECONDS, self.lease_seconds / (self.calls_per_attempt + 1))

    @model_validator(mode="after")
    def calls_end_inside_lease(self) -> Self:
        if self.timeout * self.calls_per_attempt >= self.lease_seconds:
            raise field_problem(
                "timeout_seconds",
                f"{self.calls_per_attempt} call(s) of up to {self.timeout}s must end inside "
                f"lease_seconds ({self.lease_seconds})",
            )
        return self

    def api(self) -> GoogleApi:
        return GoogleApi(self.api_base, self.timeout)


class GoogleApi:
    """One Google Cloud REST API at a base URL (production by default, a fake in tests)."""

    def __init__(self, base_url: str, timeout_seconds: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        creates: bool = False,
    ) -> dict[str, Any]:
        """One API call; raise RetryableJobError / PermanentJobError as the answer says.

        ``creates``: the call starts something and takes no request id (a
        ``jobs.run``), so an answer that leaves open whether it did raises
        CreateInDoubt, for the caller to look for what it may have started.
        """
        url = f"{self.base_url}/{path.lstrip('/')}"
        try:
            # The run's trace goes with the call: Google's APIs read X-Cloud-Trace-Context.
            response = _session().request(
                method, url, json=body, params=params, headers=outgoing_trace_headers(), timeout=self.timeout_seconds
            )
        except google.auth.exceptions.GoogleAuthError as exc:
            # Missing or unreachable credentials get fixed by a deploy; keep retrying until then.
            raise RetryableJobError(f"no Google credentials for {method} {url}: {exc}") from None
        except (requests.ConnectTimeout, requests.exceptions.InvalidURL) as exc:
            raise RetryableJobError(f"{method} {url} failed before sending: {exc}") from None
        except requests.RequestException as exc:
            raise self._uncertain(method, url, f"{type(exc).__name__}: {exc}", creates) from None
        if 200 <= response.status_code < 300:
            try:
                return response.json() if response.content else {}
            except ValueError:
                raise self._uncertain(
                    method, url, f"a {response.status_code} answer whose body is not JSON", creates
                ) from None
        error = api_error(method, url, response)
        if creates and isinstance(error, RetryableJobError):
            raise CreateInDoubt(error.message, details=error.details)
        raise error

    def _uncertain(self, method: str, url: str, what: str, creates: bool) -> RetryableJobError:
        """The error for a request that was sent but whose answer was lost or unreadable."""
        if creates:
            return CreateInDoubt(f"{method} {url}: {what}")
        return RetryableJobError(f"{method} {url}: {what}")


# The create of a job kind's downstream resource, as a step of its run (dedup.steps): "started" is
# recorded before the call, so a later attempt knows an earlier one may have created something.
CREATE_STEP = "create"
# How long after a create in doubt attempts keep searching for what it may have started (it may
# not be listed yet) before the run stops for a person: nothing listed is never taken to mean
# nothing was created.
DOUBT_SETTLE_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class Created:
    """What a kind's create (or what it adopted) came to: the resource's name, and what to add to
    the run's result."""

    name: str
    adopted: bool
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def create_once(
    context: RunContext,
    find: Callable[[], str | None],
    create: Callable[[], Created],
    search_first: bool,
    call_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> Created:
    """The run's downstream resource, created at most once however its creates' answers are lost.

    A resource recorded by an earlier attempt is adopted.  The create itself is an
    ``at_most_once`` step: "started" is recorded before the call.  Before creating, an attempt
    searches by the run's mark (``find``) when ``search_first`` (an attempt after the first, or a
    kind that always looks) or when an earlier create is in doubt (started, nothing recorded), and
    adopts what it finds.  A create whose answer leaves open whether it started anything
    (CreateInDoubt) is searched for at once; if nothing is found, the doubt stays recorded and the
    run is released ("create call in doubt, nothing found"), never assumed either way: the next
    attempt searches again.  Still nothing DOUBT_SETTLE_SECONDS after the doubt, the run stops as
    NeedsReview on its ``create`` step, for a person who looks by the run's key and marks it done
    (``{"name": ...}``) or runs it again.  That time counts from when the doubt was recorded, else
    (an attempt that died in its call) from the call's start plus ``call_seconds``, its timeout:
    the API may act on a request until its caller gave up on it.
    """
    if context.downstream:
        return Created(context.downstream, adopted=True)
    earlier = context.steps().recorded().get(CREATE_STEP)
    in_doubt = earlier is not None and earlier.get("state") == StepState.STARTED
    if search_first or in_doubt:
        found = context.started_before(find)
        if found:
            if in_doubt:  # the create that was in doubt did start it: say so in its record
                context.steps().mark_done(CREATE_STEP, {"name": found, "adopted": True, "extra": {}})
            return Created(found, adopted=True)
    if in_doubt:
        assert earlier is not None
        since = _doubt_began(earlier, call_seconds)
        waited = (context.now() - since).total_seconds()
        if waited < DOUBT_SETTLE_SECONDS:
            raise CreateInDoubt(
                f"the create of attempt {earlier.get('attempt')} is in doubt since {format_utc(since)} and "
                f"nothing carrying this run's mark is listed yet; searched again and retried (a person is "
                f"asked after {DOUBT_SETTLE_SECONDS:g}s with nothing found)"
            )
        raise NeedsReview(
            f"the create of attempt {earlier.get('attempt')} is in doubt since {format_utc(since)}, and "
            f"{DOUBT_SETTLE_SECONDS:g}s on nothing carrying this run's mark is listed: it may have started "
            f"something or not, and neither is assumed. Look for it by the run's key, {context.run_id}; then "
            'mark the step done (with {"name": <what it started>}) or run it again',
            details={
                "step": CREATE_STEP,
                "attempt": int(earlier.get("attempt") or 0),
                "key": step_key(context.run_id, CREATE_STEP),
            },
        )

    def call(key: str) -> dict[str, Any]:
        try:
            made = create()
        except CreateInDoubt as doubt:
            try:
                found = find()
            except (RetryableJobError, PermanentJobError) as failed:
                raise type(failed)(
                    f"create call in doubt, and the search for what it started failed: {failed.message} "
                    f"(the create: {doubt.message})",
                    details=failed.details,
                ) from None
            if not found:
                context.steps().note(CREATE_STEP, doubt="create call in doubt, nothing found", doubt_at=_now(context))
                raise CreateInDoubt(
                    f"create call in doubt, nothing found; recorded and retried: {doubt.message}", details=doubt.details
                ) from None
            made = Created(found, adopted=True)
        except (RetryableJobError, PermanentJobError) as refused:  # refused before it acted: nothing was created
            raise StepNotTaken(refused) from None
        context.record_downstream(made.name)
        return {"name": made.name, "adopted": made.adopted, "extra": made.extra}

    done = context.step(CREATE_STEP, call, semantic=Semantic.AT_MOST_ONCE, on_unknown=OnUnknown.RETRY)
    if not isinstance(done, dict):  # marked done by a person, with a result of their own
        done = {}
    name = done.get("name")
    return Created(
        name if isinstance(name, str) and name else "(marked done by a person, without its name)",
        bool(done.get("adopted", True)),
        dict(done["extra"]) if isinstance(done.get("extra"), dict) else {},
    )


def _now(context: RunContext) -> str:
    return format_utc(context.now())


def _doubt_began(entry: Mapping[str, Any], call_seconds: float) -> datetime.datetime:
    """Since when a create step's outcome has been in doubt (see create_once)."""
    if entry.get("doubt_at"):
        return datetime.datetime.fromisoformat(str(entry["doubt_at"]))
    started = datetime.datetime.fromisoformat(str(entry.get("started")))
    return started + datetime.timedelta(seconds=call_seconds)


class CreateInDoubt(RetryableJobError):
    """A create was sent, and its answer does not say whether it started anything.

    Raised by ``GoogleApi.call(..., creates=True)`` for every failure after the
    request left: a read timeout, a connection dropped, a 2xx whose body is not
    JSON, and every *retryable* error answer (408, 429, 5xx, UNAVAILABLE,
    DEADLINE_EXCEEDED and the other RETRYABLE_API_STATUSES).  An error answer's
    status says which hop gave up, not whether the backend had already acted:
    Google's front end answers 502/503/504 for a backend that may have
    committed, a backend answers DEADLINE_EXCEEDED or INTERNAL after it may
    have, and no API contract promises that a 408, 429 or UNAVAILABLE did
    nothing.  Counting such a refusal as in doubt costs one search; counting a
    create that took effect as refused would leave it to the next attempt's
    search.  A failure before the request was sent (no credentials, a connect
    timeout) and a permanent (4xx) refusal are not in doubt.
    """


def api_error(method: str, url: str, response: requests.Response) -> Exception:
    """The job error for a Google API error response, with the API's own message."""
    code, status, message = response.status_code, "", response.text[:2000]
    try:
        error = response.json().get("error", {})
        status = error.get("status", "") or ""
        message = error.get("message", message) or message
    except (ValueError, AttributeError):
        pass
    details = {"http_status": code, "status": status, "message": message}
    text = f"{method} {url}: {code} {status}: {message}".replace(":  ", ": ")
    # 401 comes after AuthorizedSession has refreshed the token and tried again: permanent.
    if code in (408, 429) or code >= 500 or status in RETRYABLE_API_STATUSES:
        return RetryableJobError(text, details=details)
    return PermanentJobError(text, details=details)
