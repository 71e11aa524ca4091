"""``http`` jobs: forward the run to a URL, carrying the run's key downstream.

The downstream gets ``Idempotency-Key: <run_id>`` plus the schedule time and
attempt in headers and in a JSON body, so it can deduplicate on its own
(the most downstream service is the last line of defence).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

import requests
import urllib3

from dedup.errors import PermanentJobError, RetryableJobError
from dedup.keys import format_utc
from jobs.base import JobKind, RunContext, http_url, positive_number
from jobs.errors import JobsConfigError
from jobs.http_status import is_retryable_status

DEFAULT_TIMEOUT_SECONDS = 30
MAX_STORED_BODY_BYTES = 4096
METHODS = ("POST", "PUT", "PATCH", "GET", "DELETE")
# Set by this kind; a job's configured headers may not replace them.
RESERVED_HEADERS = frozenset(
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


class HttpJob(JobKind):
    name = "http"
    required_keys = frozenset({"url"})
    optional_keys = frozenset({"method", "timeout_seconds", "headers"})

    def __init__(self, url: str, method: str, timeout_seconds: float, headers: dict[str, str]) -> None:
        self.url = url
        self.method = method
        self.timeout_seconds = timeout_seconds
        self.headers = headers

    def calls(self) -> str:
        # Without the query or any user:password: a token may ride in either, and the page is not the place.
        parts = urllib.parse.urlsplit(self.url)
        shown = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path or '/'}"
        return f"{self.method} {shown}" + (" (with its query)" if parts.query else "")

    @classmethod
    def from_config(cls, job_id: str, options: Mapping[str, Any], lease_seconds: float) -> HttpJob:
        url = http_url(job_id, "url", options["url"])
        method = options.get("method", "POST")
        if not isinstance(method, str) or method.upper() not in METHODS:
            raise JobsConfigError(job_id, "method", f"must be one of {', '.join(METHODS)}, got {method!r}")
        # The whole call must end inside the lease: the default follows a short lease.
        timeout = positive_number(
            job_id,
            "timeout_seconds",
            options.get("timeout_seconds", min(DEFAULT_TIMEOUT_SECONDS, lease_seconds / 2)),
        )
        if timeout >= lease_seconds:
            raise JobsConfigError(
                job_id,
                "timeout_seconds",
                f"must be shorter than lease_seconds ({lease_seconds}): a call still waiting "
                "when the lease ends would overlap the attempt that takes over",
            )
        headers = options.get("headers", {})
        if not isinstance(headers, dict):
            raise JobsConfigError(job_id, "headers", "must be a mapping of header names to values")
        for name, value in headers.items():
            if not isinstance(name, str) or not name or not all(33 <= ord(c) <= 126 and c != ":" for c in name):
                raise JobsConfigError(job_id, "headers", f"{name!r} is not a valid header name")
            if name.lower() in RESERVED_HEADERS:
                raise JobsConfigError(job_id, "headers", f"{name!r} is set by the app and cannot be configured")
            if not isinstance(value, str):
                raise JobsConfigError(job_id, "headers", f"the value of {name!r} must be a string")
            try:
                value.encode("latin-1")
                requests.utils.check_header_validity((name, value))
            except (UnicodeEncodeError, requests.exceptions.InvalidHeader):
                raise JobsConfigError(
                    job_id,
                    "headers",
                    f"the value of {name!r} must be Latin-1 text without control characters "
                    "or leading/trailing whitespace",
                ) from None
        return cls(url, method.upper(), timeout, dict(headers))

    def run(self, context: RunContext) -> Any:
        schedule_time = format_utc(context.schedule_time) if context.schedule_time else None
        headers = {
            **self.headers,
            "Idempotency-Key": context.downstream_key,
            "X-Dedup-Run-Id": context.run_id,
            "X-Dedup-Job-Id": context.job_id,
            "X-Dedup-Attempt": str(context.attempt),
            "X-Dedup-Attempt-Id": context.attempt_id,
        }
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
        deadline = time.monotonic() + self.timeout_seconds
        try:
            response = requests.request(
                self.method,
                url,
                headers=headers,
                data=body,
                # total: connecting and waiting for the headers share one budget.
                # types-requests takes only a float or a pair; requests' adapter takes a urllib3.Timeout too.
                timeout=urllib3.Timeout(total=self.timeout_seconds),  # type: ignore[arg-type]
                allow_redirects=False,
                stream=True,
            )
        except requests.Timeout as exc:
            raise RetryableJobError(
                f"{self.method} {self.url} timed out after {self.timeout_seconds}s: {exc}"
            ) from None
        except requests.RequestException as exc:
            raise RetryableJobError(f"{self.method} {self.url} failed: {exc}") from None
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
