"""An attempt's fenced writes: an update fenced on the version of its last write, else a
transaction that reads the record first.

Either way the write lands only while the attempt still owns the run (its attempt id, in
progress, and for a job with ``overlap: forbid`` its lock), so a stale attempt never changes a
record it no longer owns; and a write whose answer was lost is recognised, when tried again,
as the attempt's own (``landed``), never applied twice.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable

from google.cloud import ndb

from dedup.clock import Clock
from dedup.job_lock import JobLock
from dedup.outcomes import Attempt, Stale
from dedup.record_store import RecordStore
from dedup.run_record import RunRecord, RunStatus
from dedup.store import Applied, Doubt, Refused, Store, Transaction, Write
from dedup.transactions import transact


def fenced_write[T](
    clock: Clock,
    attempt: Attempt,
    change: Callable[[RunRecord, datetime.datetime], T],
    patience_seconds: float,
    landed: Callable[[RunRecord | None], T | None] | None = None,
    keeps_running: bool = False,
    store: Store | None = None,
) -> T | Stale:
    """Apply ``change`` (which edits the record and never writes it) while ``attempt`` owns the run:
    what it returns, or Stale.  ``store``: where the record is (default: Datastore's, in context)."""
    store = store if store is not None else RecordStore.of_context()
    write = FencedWrite(clock, attempt, change, landed, keeps_running)
    # A job's lock must still be this attempt's for it to go on running, and a version fences one
    # entity, not a commit: a renewal under a lock reads both in the transaction.  A finish need
    # not: it lands whoever holds the lock now, and frees the lock only if still its own.
    # The fast path only where this process verified that the database refuses a stale version
    # (dedup/fence_check.py): elsewhere a stale write could land, so the transaction decides.
    if attempt.fence is not None and (attempt.job_lock is None or not keeps_running) and store.fenced:
        fast = write_by_version(attempt, clock.now(), change, store)
        if isinstance(fast, Landed):
            return fast.outcome
        # Not applied, or in doubt: the transaction reads what is there and, where the write may
        # have landed (in doubt, or an error read either way), recognises it as this attempt's own.
        write.wrote = isinstance(fast, Doubt | Refused)
    outcome, transaction = transact(write, patience_seconds, store)
    if not isinstance(outcome, Stale) and attempt.fence is not None and write.written is not None:
        version = transaction.versions.get(write.written.key)
        lock_version = transaction.versions.get(ndb.Key(JobLock, attempt.job_lock)) if attempt.job_lock else None
        if version is not None:
            attempt.fence.advance(write.written, version, lock_version)  # the next write is fenced again
    return outcome


class FencedWrite[T]:
    """The body of a fenced transaction, which may run several times.

    It remembers whether a try got as far as writing: only then can an
    earlier commit have landed although it reported an error, and ``landed``
    (when given) recognises that commit in the record instead of calling the
    attempt stale.
    """

    def __init__(
        self,
        clock: Clock,
        attempt: Attempt,
        change: Callable[[RunRecord, datetime.datetime], T],
        landed: Callable[[RunRecord | None], T | None] | None,
        keeps_running: bool = False,
    ) -> None:
        self.clock, self.attempt, self.change, self.landed = clock, attempt, change, landed
        # A renewal or a downstream note: the attempt goes on running, so it must still hold the job's lock.
        self.keeps_running = keeps_running
        self.wrote = False
        self.written: RunRecord | None = None  # the record the last try put

    def __call__(self, transaction: Transaction) -> T | Stale:
        attempt = self.attempt
        keys = [ndb.Key(RunRecord, attempt.run_id)] + ([ndb.Key(JobLock, attempt.job_lock)] if attempt.job_lock else [])
        found = transaction.get(keys)
        record = found[0].record if found[0] else None
        lock = found[1].record if attempt.job_lock and found[1] else None
        owned_lock = lock if lock is not None and lock.attempt_id == attempt.attempt_id else None
        if self.wrote and self.landed is not None:
            outcome = self.landed(record)
            if outcome is not None:
                if owned_lock is not None:  # the finish landed, its lock's delete perhaps not
                    transaction.delete(owned_lock.key)
                return outcome
        if record is None or record.attempt_id != attempt.attempt_id or record.status != RunStatus.IN_PROGRESS:
            return Stale(attempt.run_id, attempt.number, record)
        if attempt.job_lock is not None and self.keeps_running and owned_lock is None:
            # Its lease ran out and another execution of the job took the lock: it must stop.
            return Stale(attempt.run_id, attempt.number, record)
        self.wrote = True
        outcome = self.change(record, self.clock.now())
        transaction.put(record)
        self.written = record
        if owned_lock is not None:
            if record.status == RunStatus.IN_PROGRESS:
                owned_lock.lease_expires = record.lease_expires  # renewed with the run
                transaction.put(owned_lock)
            else:
                transaction.delete(owned_lock.key)  # finished or released: the next execution may start
        return outcome


@dataclasses.dataclass(frozen=True)
class Landed[T]:
    outcome: T


def write_by_version[T](
    attempt: Attempt, now: datetime.datetime, change: Callable[[RunRecord, datetime.datetime], T], store: Store
) -> Landed[T] | Write | None:
    """``change`` applied to what this attempt last wrote, fenced on that write's version: what
    ``change`` returned when it landed, else the write's answer (None: nothing to fence on).

    Under a job's lock (a finish), the lock is deleted in the same commit, fenced on the version
    the attempt last wrote it.  Each of the two may land alone, and each case is what the
    transaction would do: the record lands and the lock does not (another execution took it
    after this one's lease: the finish stands, that lock stays); the lock goes and the record
    does not (rewritten by someone else, so the transaction decides; the lock was this attempt's
    and it is finishing, so freeing it early runs nothing twice).
    """
    fence = attempt.fence
    held = fence.take() if fence is not None else None
    if fence is None or held is None:
        return None
    record, version = held
    if record.status != RunStatus.IN_PROGRESS or record.attempt_id != attempt.attempt_id:
        fence.drop()  # its last write ended the attempt: it owns nothing now (the transaction says Stale)
        return None
    lock = None
    if attempt.job_lock is not None:
        if fence.lock_version is None:  # no version of the lock to fence on
            fence.advance(record, version)
            return None
        lock = (ndb.Key(JobLock, attempt.job_lock), fence.lock_version)
    try:
        outcome = change(record, now)  # under a lock, only a finish comes here (fenced_write)
        written = store.update(record, version, delete=lock)
    except BaseException:
        fence.drop()  # it cannot vouch for what happened
        raise
    if isinstance(written, Applied):
        fence.advance(record, written.version)
        return Landed(outcome)
    fence.drop()
    return written
