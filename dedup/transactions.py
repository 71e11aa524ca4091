"""The one retry loop: every transaction the app runs, on any store (dedup/store.py), is tried
here, and these are the errors it tries again.

The run records' claims and fenced writes, the cleanup's deletes, the pauses, the audit's
marks, the duplicate tallies and the schedule histories all go through ``transact``: one
place says what is retried (contention, a deadline, an outage, a commit in doubt), for how
long (a patience the caller chooses), and how it waits (short, jittered, doubling up to a
second: NDB's own backoff starts at a second, and an answer is due within seconds).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from google.api_core import exceptions as api_exceptions
from google.cloud import ndb

from dedup.store import Store, Transaction

log = logging.getLogger(__name__)

# A commit that failed with one of these may still have been applied (only Aborted says for sure
# it was not): every body recognises its own landed commit when it reads again, so trying again
# is always safe.
RETRYABLE_ERRORS = (
    api_exceptions.Aborted,
    api_exceptions.ServiceUnavailable,
    api_exceptions.InternalServerError,
    api_exceptions.Unknown,
    api_exceptions.DeadlineExceeded,
    api_exceptions.ResourceExhausted,
    api_exceptions.RetryError,
)
# These say nothing was applied, and a retry reads and decides afresh (a record deleted since, a
# transaction a pessimistic database expired).  One that may be deterministic is tried again only
# REFUSALS_TRIED times, not for the whole patience: a request that cannot succeed is answered, not held.
REFUSALS = (api_exceptions.NotFound, api_exceptions.FailedPrecondition, api_exceptions.InvalidArgument)
REFUSALS_TRIED = 2
TRIED_AGAIN = (*RETRYABLE_ERRORS, *REFUSALS)
ABORTS = (api_exceptions.Aborted,)  # what says for sure that a transaction left nothing behind
FIRST_DELAY_SECONDS = 0.02
LONGEST_DELAY_SECONDS = 1.0
# A read that fences nothing, tried about as long as NDB's three retries of a lookup took.
READ_PATIENCE_SECONDS = 5.0
# The entities one commit writes: NDB's put_multi splits there, as Datastore once required, and a
# batch of a fleet's writes (the schedules' histories, the audit's marks) is one commit of at most this.
COMMIT_BATCH = 500


def is_contention(exc: Exception) -> bool:
    """Aborted transactions, also when a client gave up retrying them (RetryError wraps the cause).

    Datastore being unavailable is not contention: that stays an error (500).
    """
    if isinstance(exc, api_exceptions.RetryError):
        return isinstance(exc.cause, api_exceptions.Aborted)
    return isinstance(exc, api_exceptions.Aborted)


def transact[T](
    body: Callable[[Transaction], T], patience_seconds: float, store: Store, *, settles_doubt: bool = True
) -> tuple[T, Transaction]:
    """``body`` in a transaction of ``store``, committed: what it returned, and the transaction
    (its ``versions``).  Tried again in a new transaction as ``retried`` says.  A commit in doubt
    may have landed: a body that recognises its own landed write when it reads again (a claim,
    a fenced write, a mark, a pause) settles the doubt by being tried again.  One that cannot
    (a counter) passes ``settles_doubt=False``: then only an abort, which says for sure nothing
    landed, is tried again, and any other error is raised.  Each try after an abort names the one
    that aborted (``previous_transaction``), so a pessimistic database keeps its place in line."""
    previous: bytes | None = None

    def attempt() -> tuple[T, Transaction]:
        nonlocal previous
        transaction = store.transaction(previous)
        try:
            result = body(transaction)
            transaction.commit()
            return result, transaction
        except BaseException as exc:
            transaction.rollback()
            # Only an abort says for sure the transaction ended unapplied: a try in doubt may have
            # committed, and naming a committed transaction is a question nobody documents.
            previous = transaction.began if isinstance(exc, api_exceptions.Aborted) else None
            raise

    return retried(attempt, patience_seconds, "transaction", TRIED_AGAIN if settles_doubt else ABORTS)


def get_many(store: Store, keys: list[ndb.Key]) -> list[Any | None]:
    """The entities of ``keys`` (any model's; in order, None where absent) without their versions,
    retried as NDB's reads were: what a read that fences nothing needs (the audit's marks, the
    tallies, the schedule histories)."""
    if not keys:
        return []
    found = retried(lambda: store.lookup_many(keys), READ_PATIENCE_SECONDS, "lookup")
    return [each.record if each else None for each in found]


def retried[T](
    call: Callable[[], T], patience_seconds: float, what: str, tried_again: tuple[type[Exception], ...] = TRIED_AGAIN
) -> T:
    """The one retry loop: ``call`` tried again on ``tried_again`` until patience runs out (then that
    error is raised), a refusal only REFUSALS_TRIED times; between tries a short jittered wait,
    doubling up to a second."""
    deadline = time.monotonic() + patience_seconds
    delay = FIRST_DELAY_SECONDS
    refusals = 0
    while True:
        try:
            return call()
        except tried_again as exc:
            refusals += isinstance(exc, REFUSALS)
            if time.monotonic() + delay > deadline or refusals > REFUSALS_TRIED:
                raise
            log.info("%s failed (%s); trying again", what, type(exc).__name__)
            time.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, LONGEST_DELAY_SECONDS)
