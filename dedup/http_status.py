"""Which HTTP answers a retry may cure: one rule for http jobs and the idempotency guard.

An http job raises RetryableJobError for them (the run is released and runs
again); the guard keeps none of them, so the retry runs the view again.
"""

from __future__ import annotations

# Request Timeout, Conflict, Too Early, Too Many Requests; and every 5xx.
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500
