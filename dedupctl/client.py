"""The retry loop of a manual run, apart from the command line and the network.

The rules: one client token for the whole loop; after 409 wait ``Retry-After``;
after an answer a retry may cure (500, 502, 503, 504, a connection error, a
timeout) back off exponentially with full jitter; stop on an answer that
says what happened, or when attempts or the deadline run out.
"""

from __future__ import annotations

import dataclasses
import enum
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import requests


class Exit(enum.IntEnum):
    """dedupctl's exit codes (docs/dedupctl.md, "Exit codes")."""

    OK = 0  # 200 or 201: the run's answer is on stdout
    REFUSED = 2  # 400, 401, 403, 404, 415: the request itself is wrong; retrying cannot help
    FAILED = 3  # 422, the run failed for good (its error is on stdout)
    CONFLICT = 4  # 422 ConflictException: this token was used with other parameters
    GAVE_UP = 5  # attempts or the deadline ran out; resume with the same token


# Answers a retry of the same request may cure.  408 and 429 (a front end's) wait Retry-After when given.
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# A failure on the way, after which the same request is sent again: the connection, a
# timeout, a body cut short or undecodable (the server may have done the work: the token
# makes the next answer the same run's).
TRANSIENT_ERRORS = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.ContentDecodingError,
)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 10
    deadline_seconds: float = 600.0
    backoff_base_seconds: float = 0.5
    backoff_cap_seconds: float = 30.0
    timeout_seconds: float = 70.0  # one request: above the server's Prefer: wait cap (60 s)


@dataclasses.dataclass
class Outcome:
    exit: Exit
    status: int | None  # the last HTTP status, None when no answer came
    body: Any  # the last answer's JSON (or text), None when none
    attempts: int


def run_with_retries(
    send: Callable[[float], requests.Response],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
    on_retry: Callable[[int, str, float], None] = lambda attempt, why, delay: None,
    is_answer: Callable[[Any], bool] = lambda body: isinstance(body, Mapping) and "run_id" in body,
) -> Outcome:
    """Send the same request (``send(timeout)``) until its answer settles the run, or give up.

    A 409 (the run is in progress) waits within the deadline without using up an
    attempt: a long run is waited for, not abandoned after ``max_attempts`` polls.
    ``is_answer`` tells the app's own 2xx answer (a run's, by default) from anything else
    a 2xx might carry, such as a sign-in page.
    """
    if policy.max_attempts < 1 or policy.deadline_seconds <= 0:
        raise ValueError("max_attempts must be at least 1 and the deadline positive")
    rng = rng or random.Random()
    deadline = monotonic() + policy.deadline_seconds
    status: int | None = None
    body: Any = None
    attempts = sends = 0
    while True:
        sends += 1
        try:
            response = send(max(1.0, min(policy.timeout_seconds, deadline - monotonic())))
        except TRANSIENT_ERRORS as exc:
            attempts += 1
            status, body, why = None, None, type(exc).__name__
            delay = _backoff(policy, attempts, rng)
        else:
            status, body = response.status_code, _json_or_text(response)
            settled = _settled(status, body, is_answer)
            if settled is not None:
                return Outcome(settled, status, body, sends)
            if status == 409:
                why, delay = "409 in progress", _retry_after(response.headers, policy)
            else:
                attempts += 1
                why = str(status)
                delay = (
                    _retry_after(response.headers, policy)
                    if "Retry-After" in response.headers
                    else _backoff(policy, attempts, rng)
                )
        if attempts >= policy.max_attempts or monotonic() + delay > deadline:
            return Outcome(Exit.GAVE_UP, status, body, sends)
        on_retry(sends, why, delay)
        sleep(delay)


def _settled(status: int, body: Any, is_answer: Callable[[Any], bool]) -> Exit | None:
    """The exit an answer settles on, or None when the same request should be sent again."""
    if status in (200, 201, 202):
        # Only the app's own answer counts: a sign-in page is not a run.  202: an external job's
        # slot, queued for its own handler (the executions API), is as settled as a run.
        return Exit.OK if is_answer(body) else Exit.REFUSED
    if status == 422:
        error = body.get("error") if isinstance(body, Mapping) else None
        if error == "ConflictException":
            return Exit.CONFLICT
        return Exit.FAILED if isinstance(body, Mapping) and body.get("status") == "failed" else Exit.REFUSED
    if status == 409 or status in RETRYABLE_STATUSES:
        return None
    return Exit.REFUSED  # 3xx, 400, 401, 403, 404, 405, 413, 415: the same request cannot succeed


def _retry_after(headers: Mapping[str, str], policy: RetryPolicy) -> float:
    """As the server says (the deadline bounds it); a missing or odd value: the first backoff."""
    try:
        seconds = float(headers.get("Retry-After", "").strip())
    except ValueError:  # absent, or an HTTP date (this app never sends one)
        return policy.backoff_base_seconds
    return seconds if 0 <= seconds < float("inf") else policy.backoff_base_seconds


def _backoff(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """Full jitter (AWS Architecture Blog, "Exponential Backoff and Jitter")."""
    return rng.uniform(0, min(policy.backoff_cap_seconds, policy.backoff_base_seconds * 2 ** (attempt - 1)))


def _json_or_text(response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text
