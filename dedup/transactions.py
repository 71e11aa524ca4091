"""Transactions on a hot record: which errors to retry, and the loop that retries them.

Apart from the protocol (dedup/ledger.py) as google-cloud-ndb keeps its retries
in ``_retry.py``.  NDB's own backoff starts at a second and doubles; a claim
must answer within seconds, so the retries here are short and jittered, and
bounded by a patience the caller chooses.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from google.api_core import exceptions as api_exceptions
from google.cloud import ndb
from google.cloud.datastore_v1.types import datastore as datastore_pb2
from google.cloud.ndb import _datastore_api

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


def run_transaction[T](callback: Callable[[], T], patience_seconds: float, early: EarlyTransaction | None = None) -> T:
    """One NDB transaction, tried again on contention and transient errors until patience runs out.

    ``early``: the first try runs in that transaction, begun beforehand; when
    it is unusable or its try fails, the tries go on in new ones.
    """
    deadline = time.monotonic() + patience_seconds
    delay = 0.02
    transaction_id = early.take() if early is not None else None
    if early is not None and transaction_id is not None:
        try:
            result = in_transaction(transaction_id, callback)
        except api_exceptions.GoogleAPIError as exc:  # RetryError too: NDB's own retries of a read gave up
            # Every write of the ledger recognises its own landed commit, so a
            # try in a new transaction is as safe here as in the loop below.
            log.info("early transaction failed (%s); trying again in a new one", type(exc).__name__)
        else:
            early.served = True
            return result
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


# An early transaction older than this is not used: Datastore ends a
# transaction left idle for a minute, and one begun long before its read
# only widens the window in which it can conflict.
EARLY_TRANSACTION_MAX_AGE_SECONDS = 30.0
# Rollbacks of early transactions nobody used, still in flight (a gRPC call
# whose future is dropped is cancelled).
_ROLLBACKS_IN_FLIGHT: set[object] = set()  # grpc futures
ROLLBACK_TIMEOUT_SECONDS = 30.0
_ROLLBACKS_LOCK = threading.Lock()


class EarlyTransaction:
    """A read-write transaction begun before it is known to be needed.

    Its BeginTransaction travels beside another round trip (the fast-path
    lookup, the claim), so using it saves one round trip; a transaction begun
    and never read holds no lock, and one nobody uses is rolled back without
    waiting for the answer.  Used at most once.
    """

    def __init__(self) -> None:
        context = ndb.get_context()
        self._client = context.client
        self._eventloop = context.eventloop  # the loop its BeginTransaction's answer arrives on
        self._begun_at = time.monotonic()
        self._begin = _datastore_api.begin_transaction(False, retries=0)  # in flight from here
        self._spent = False
        self.served = False  # set by run_transaction when a try in it returned

    def take(self) -> bytes | None:
        """The transaction's id, once; None when it is too old or could not begin (begin a new one)."""
        if self._spent:
            return None
        if time.monotonic() - self._begun_at > EARLY_TRANSACTION_MAX_AGE_SECONDS:
            self.discard()
            return None
        if ndb.get_context().eventloop is not self._eventloop:
            self.discard()  # another context (thread) could not wait for its answer
            return None
        self._spent = True
        try:
            transaction_id: bytes = self._begin.result()
            return transaction_id
        except Exception as exc:  # it never began: a new transaction will
            log.info("early transaction did not begin (%s); beginning another", type(exc).__name__)
            return None

    def discard(self) -> None:
        """Roll it back unless it was taken, without waiting (no-op when spent)."""
        if self._spent:
            return
        self._spent = True
        self._begin.add_done_callback(self._roll_back)

    def _roll_back(self, begin: ndb.Future) -> None:
        # A callback of an NDB future: an exception here would surface in whatever
        # NDB call next runs the event loop, so none may escape.
        try:
            if begin.exception() is not None:
                return  # never began: nothing to end
            request = datastore_pb2.RollbackRequest(
                project_id=self._client.project, database_id=self._client.database, transaction=begin.result()
            )
            metadata = _datastore_api._add_routing_info((), request)
            # Straight to the stub, beside NDB's event loop, so the request's NDB
            # context does not wait for the answer on its way out.
            call = self._client.stub.rollback.future(request, timeout=ROLLBACK_TIMEOUT_SECONDS, metadata=metadata)
            with _ROLLBACKS_LOCK:
                _ROLLBACKS_IN_FLIGHT.add(call)
            call.add_done_callback(_rollback_done)
        except Exception as exc:  # a transaction that read nothing ends by itself
            log.info("rollback of an unused early transaction not sent (%r)", exc)


def _rollback_done(call: object) -> None:
    with _ROLLBACKS_LOCK:
        _ROLLBACKS_IN_FLIGHT.discard(call)
    # A rollback that failed leaves a transaction that read nothing: it ends by itself.


def in_transaction[T](transaction_id: bytes, callback: Callable[[], T]) -> T:
    """Run ``callback`` in the begun transaction ``transaction_id`` and commit it.

    The body of NDB's own ``_transaction_async`` (google-cloud-ndb 2.7, pinned)
    for a transaction begun beforehand: the same fresh context, cache and
    batches, the same prepare-then-commit, the rollback on any error, the
    same commit and completion callbacks.  ``callback`` is synchronous, as
    every callback of the ledger is.
    """
    context = ndb.get_context()
    if context.transaction:
        raise RuntimeError("transactions may not be nested")
    on_commit: list[Callable[[], None]] = []
    on_complete: list[Callable[[], None]] = []
    tx_context = context.new(
        transaction=transaction_id,
        on_commit_callbacks=on_commit,
        transaction_complete_callbacks=on_complete,
        batches=None,
        commit_batches=None,
        cache=None,
        eventloop=type(context.eventloop)(),
        retry=context.get_retry_state(),
    )
    with tx_context.use():
        try:
            try:
                result = callback()
                if isinstance(result, ndb.Future):
                    raise TypeError("in_transaction takes a synchronous callback")
                _datastore_api.prepare_to_commit(transaction_id)
                tx_context.eventloop.run()
                _datastore_api.commit(transaction_id, retries=0).result()
            except Exception:
                tx_context.cache.clear()
                try:
                    _datastore_api.rollback(transaction_id).result()
                except Exception as rollback_error:  # the error that matters made us roll back
                    log.info("rollback after a failed try failed too (%r)", rollback_error)
                raise
            for run_on_commit in on_commit:
                run_on_commit()
        finally:
            for run_on_complete in on_complete:
                run_on_complete()
    return result
