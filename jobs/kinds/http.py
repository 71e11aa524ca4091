"""``http`` jobs: forward the run to a URL, carrying the run's key downstream.

The downstream gets ``Idempotency-Key: <run_id>`` plus the schedule time and
attempt in headers and in a JSON body, so it can deduplicate on its own
(the most downstream service is the last line of defence).  Every call carries the run's
trace (``traceparent``, ``X-Cloud-Trace-Context``) and, with ``auth``, an ID token of the
app's service account: what a Cloud Run service or an app behind Identity-Aware Proxy asks
of its callers.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
from typing import Annotated, Any, Literal, Self

import requests
import urllib3
from pydantic import model_validator

from dedup.errors import PermanentJobError, RetryableJobError
from dedup.http_status import is_retryable_status
from dedup.keys import format_utc
from jobs.base import JobKind, RunContext, is_loopback_url, origin_of
from jobs.declared import (
    Declaration,
    HttpUrl,
    JobDeclaration,
    OmittableSeconds,
    OmittableText,
    check,
    field_problem,
    mapping_of,
)
from jobs.id_tokens import ID_TOKENS, IdTokens
from jobs.trace_headers import TRACE_HEADERS, traced

DEFAULT_TIMEOUT_SECONDS = 30
MAX_STORED_BODY_BYTES = 4096
METHODS = ("POST", "PUT", "PATCH", "GET", "DELETE")
# Set by this kind; a job's configured headers may not replace them.
RESERVED_HEADERS = (
    frozenset(
        name.lower()
        for name in (
            "Idempotency-Key",
            "X-Dedup-Run-Id",
            "X-Dedup-Job-Id",
            "X-Dedup-Schedule-Time",
            "X-Dedup-Attempt",
            "X-Dedup-Attempt-Id",
            "Content-Type",
            "Content-Length",
            "Host",
        )
    )
    | TRACE_HEADERS
)
# Set by ``auth`` when it is oidc or iap.
AUTH_HEADER = "authorization"


def _method(value: Any) -> str:
    if not isinstance(value, str) or value.upper() not in METHODS:
        raise ValueError(f"must be one of {', '.join(METHODS)}, got {value!r}")
    return value.upper()


def header_problem(name: Any, value: Any) -> str | None:
    """What is wrong with a header an http job is configured to send, or None."""
    if not isinstance(name, str) or not name or not all(33 <= ord(c) <= 126 and c != ":" for c in name):
        return f"{name!r} is not a valid header name"
    if name.lower() in RESERVED_HEADERS:
        return f"{name!r} is set by the app and cannot be configured"
    if not isinstance(value, str):
        return f"the value of {name!r} must be a string"
    try:
        value.encode("latin-1")
        requests.utils.check_header_validity((name, value))
    except (UnicodeEncodeError, requests.exceptions.InvalidHeader):
        return f"the value of {name!r} must be Latin-1 text without control characters or leading/trailing whitespace"
    return None


class HttpAuth(Declaration):
    """How an http job's calls prove who sends them: an ID token of the app's service account."""

    kind: Literal["oidc", "iap", "none"]
    """oidc: an ID token for ``audience`` (a Cloud Run service or function, any service that checks
    Google ID tokens); iap: an ID token for the IAP OAuth client id ``audience``; none: no token."""
    audience: OmittableText = None
    """oidc: the token's audience, by default the URL's origin (scheme, host, a port not the
    scheme's own: a Cloud Run service's URL; a 1st-gen Cloud Function wants its whole URL, so give
    it); iap: the OAuth client id IAP protects the target with (required)."""

    @model_validator(mode="after")
    def audience_fits_kind(self) -> Self:
        if self.kind == "iap" and self.audience is None:
            raise field_problem("audience", "an iap token needs the OAuth client id IAP protects the target with")
        if self.kind == "none" and self.audience is not None:
            raise field_problem("audience", "none sends no token: leave audience out, or use oidc")
        return self


class HttpDeclaration(JobDeclaration):
    """An http job: forward each run to a URL, with its key (Idempotency-Key) and its times."""

    kind: Literal["http"]
    url: HttpUrl
    """The absolute http(s) URL each run is sent to."""
    method: Annotated[str, check(_method)] = "POST"
    """POST, PUT, PATCH, GET or DELETE."""
    timeout_seconds: OmittableSeconds = None
    """How long a call may take, in seconds: by default 30, or half a shorter lease."""
    headers: Annotated[
        dict[str, str], check(mapping_of(header_problem, "must be a mapping of header names to values"), dict[str, str])
    ] = {}
    """Headers sent with every call, besides the ones the app sets."""
    auth: HttpAuth | None = None
    """An ID token on every call (oidc or iap), or none (the default)."""

    @property
    def timeout(self) -> float:
        # The whole call must end inside the lease: the default follows a short lease.
        return self.timeout_seconds or min(DEFAULT_TIMEOUT_SECONDS, self.lease_seconds / 2)

    @property
    def audience(self) -> str | None:
        """The audience of the token each call carries, or None for no token."""
        if self.auth is None or self.auth.kind == "none":
            return None
        return self.auth.audience if self.auth.audience is not None else origin_of(self.url)

    @model_validator(mode="after")
    def one_authorization(self) -> Self:
        if self.audience is not None and any(name.lower() == AUTH_HEADER for name in self.headers):
            raise field_problem("headers", "'Authorization' is set by auth (an ID token): leave it out, or auth out")
        if (
            self.audience is not None
            and urllib.parse.urlsplit(self.url).scheme != "https"
            and not is_loopback_url(self.url)
        ):
            raise field_problem(
                "url", "must be https with auth: an ID token is a bearer credential (http only to loopback, to test)"
            )
        return self

    @model_validator(mode="after")
    def call_ends_inside_lease(self) -> Self:
        if self.timeout >= self.lease_seconds:
            raise field_problem(
                "timeout_seconds",
                f"must be shorter than lease_seconds ({self.lease_seconds}): a call still waiting "
                "when the lease ends would overlap the attempt that takes over",
            )
        return self

    def build(self, job_id: str) -> HttpJob:
        return HttpJob(self.url, self.method, self.timeout, dict(self.headers), audience=self.audience)


class HttpJob(JobKind):
    name = "http"
    declaration = HttpDeclaration

    def __init__(
        self,
        url: str,
        method: str,
        timeout_seconds: float,
        headers: dict[str, str],
        audience: str | None = None,
        id_tokens: IdTokens = ID_TOKENS,
    ) -> None:
        self.url = url
        self.method = method
        self.timeout_seconds = timeout_seconds
        self.headers = headers
        self.audience = audience
        self.id_tokens = id_tokens

    def calls(self) -> str:
        # Without the query or any user:password: a token may ride in either, and the page is not the place.
        parts = urllib.parse.urlsplit(self.url)
        shown = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path or '/'}"
        return f"{self.method} {shown}" + (" (with its query)" if parts.query else "")

    def run(self, context: RunContext) -> Any:
        deadline = time.monotonic() + self.timeout_seconds  # the token's fetch, if any, spends it too
        schedule_time = format_utc(context.schedule_time) if context.schedule_time else None
        headers = traced(
            {
                **self.headers,
                "Idempotency-Key": context.downstream_key,
                "X-Dedup-Run-Id": context.run_id,
                "X-Dedup-Job-Id": context.job_id,
                "X-Dedup-Attempt": str(context.attempt),
                "X-Dedup-Attempt-Id": context.attempt_id,
            }
        )
        if schedule_time:
            headers["X-Dedup-Schedule-Time"] = schedule_time
        body = None
        url = self.url
        if self.method == "GET" and context.parameters:
            # No body on a GET: manual-run parameters travel in the query string.
            extra = urllib.parse.urlencode(
                {
                    name: value if isinstance(value, str) else json.dumps(value)
                    for name, value in context.parameters.items()
                }
            )
            url = f"{url}{'&' if urllib.parse.urlsplit(url).query else '?'}{extra}"
        if self.method != "GET":
            headers["Content-Type"] = "application/json"
            body = json.dumps(self.downstream_body(context, schedule_time)).encode("utf-8")
        response = self._send(url, headers, body, deadline)
        with response:
            raw = self._read_head(response, deadline)
        outcome = {
            "status": response.status_code,
            "body": raw[:MAX_STORED_BODY_BYTES].decode("utf-8", errors="replace"),
            "truncated": len(raw) > MAX_STORED_BODY_BYTES,
        }
        status = response.status_code
        if 200 <= status < 300:
            return outcome
        message = f"{self.method} {self.url} answered {status}"
        if is_retryable_status(status):
            raise RetryableJobError(message, details=outcome)
        raise PermanentJobError(message, details=outcome)

    def _send(self, url: str, headers: dict[str, str], body: bytes | None, deadline: float) -> requests.Response:
        """The call, with an ID token when ``auth`` asks for one.  A kept token refused (401: a
        rotated key, a clock apart) is dropped and the call made once more with a new one: a 401
        means the service did nothing.  A token fetched just now and refused is the answer."""
        while True:
            sent, fresh = dict(headers), True
            if self.audience is not None:
                token, fresh = self.id_tokens.token(self.audience, deadline)
                sent["Authorization"] = f"Bearer {token}"
            left = deadline - time.monotonic()
            if left <= 0:
                raise RetryableJobError(f"{self.method} {self.url}: no time left after fetching its ID token")
            try:
                response = requests.request(
                    self.method,
                    url,
                    headers=sent,
                    data=body,
                    # total: connecting and waiting for the headers share one budget.
                    # types-requests takes only a float or a pair; requests' adapter takes a urllib3.Timeout too.
                    timeout=urllib3.Timeout(total=left),  # type: ignore[arg-type]
                    allow_redirects=False,
                    stream=True,
                )
            except requests.Timeout as exc:
                raise RetryableJobError(
                    f"{self.method} {self.url} timed out after {self.timeout_seconds}s: {exc}"
                ) from None
            except requests.RequestException as exc:
                raise RetryableJobError(f"{self.method} {self.url} failed: {exc}") from None
            if response.status_code != 401 or self.audience is None:
                return response
            self.id_tokens.forget(self.audience)
            if fresh:
                return response
            response.close()

    def _read_head(self, response: requests.Response, deadline: float) -> bytes:
        """At most MAX_STORED_BODY_BYTES + 1 bytes, before the deadline: a huge or
        trickling body never keeps the call going past its timeout."""
        head = b""
        try:
            for chunk in response.iter_content(chunk_size=1024):
                head += chunk
                if len(head) > MAX_STORED_BODY_BYTES:
                    break
                if time.monotonic() > deadline:
                    raise RetryableJobError(
                        f"{self.method} {self.url}: the response took longer than {self.timeout_seconds}s"
                    )
        except requests.RequestException as exc:
            raise RetryableJobError(f"reading the response of {self.url} failed: {exc}") from None
        return head

    @staticmethod
    def downstream_body(context: RunContext, schedule_time: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "idempotency_key": context.downstream_key,
            "run_id": context.run_id,
            "job_id": context.job_id,
            "scheduler_job_name": context.scheduler_job_name,
            "schedule_time": schedule_time,
            "attempt": context.attempt,
            "attempt_id": context.attempt_id,
            "project": context.project,
            "location": context.location,
            "source": context.source,
            "parameters": dict(context.parameters),
        }
        text = context.body_text()
        if text is None:
            body["body_base64"] = base64.b64encode(context.body).decode("ascii")
        else:
            body["body"] = text
        return body
