"""NDB transactions off the hot path (pauses, the audit's marks, the cleanup): which errors to
retry, and the loop that retries them.

NDB's own backoff starts at a second and doubles; an answer is due within seconds, so the
retries here are short and jittered, and bounded by a patience the caller chooses.  The run
records' own transactions are dedup.record_store's, on the same errors.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from google.api_core import exceptions as api_exceptions
from google.cloud import ndb

log = logging.getLogger(__name__)

# A commit that failed with one of these may still have been applied (only
# Aborted says for sure it was not): every write of the ledger recognises its
# own landed commit when it tries again, so trying again is always safe.
RETRYABLE_ERRORS = (
    api_exceptions.Aborted,
    api_exceptions.ServiceUnavailable,
    api_exceptions.InternalServerError,
    api_exceptions.Unknown,
    api_exceptions.DeadlineExceeded,
    api_exceptions.ResourceExhausted,
    api_exceptions.RetryError,
)


def is_contention(exc: Exception) -> bool:
    """Aborted transactions, also when NDB gave up retrying them (RetryError wraps the cause).

    Datastore being unavailable is not contention: that stays an error (500).
    """
    if isinstance(exc, api_exceptions.RetryError):
        return isinstance(exc.cause, api_exceptions.Aborted)
    return isinstance(exc, api_exceptions.Aborted)


def run_transaction[T](callback: Callable[[], T], patience_seconds: float) -> T:
    """One NDB transaction, tried again on contention and transient errors until patience runs out."""
    deadline = time.monotonic() + patience_seconds
    delay = 0.02
    while True:
        try:
            try:
                committed: T = ndb.transaction(callback, retries=0)  # what callback returned
                return committed
            except api_exceptions.GoogleAPICallError as exc:
                # NDB rolls back after a failed commit.  When the commit was in
                # fact applied, the rollback fails too ("transaction has expired
                # or is invalid") and its error hides the commit's: the commit's
                # error is the one that says what happened.
                if not isinstance(exc, RETRYABLE_ERRORS) and isinstance(exc.__context__, RETRYABLE_ERRORS):
                    commit_error, exc.__context__ = exc.__context__, None  # no cycle in the chain
                    raise commit_error from exc
                raise
        except RETRYABLE_ERRORS as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.info("transaction failed (%s); trying again", type(exc).__name__)
            time.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, 1.0)
