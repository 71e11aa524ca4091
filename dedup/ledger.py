"""The run ledger: claim, renew, complete, fail, release and replay runs.

Every write is fenced, so a stale attempt (one whose lease ran out and was taken over) can
never change a record it no longer owns.  On the hot path the fence is Datastore's own
(dedup.record_store): a fresh claim is an insert, refused when the record exists, and each
later write of the attempt an update applied only while the record is still the version the
attempt's last write returned.  Anything else (a conflict, a write in doubt, a job's lock) is
a transaction that reads the record first and checks the attempt id.  Answers that change
nothing (a replay, a live lease's 409, a refusal) come from one strongly consistent lookup,
or none for a completed run this process has seen.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any, assert_never

from google.cloud import ndb

from dedup import queries
from dedup.clock import Clock
from dedup.finished_cache import FinishedRuns
from dedup.keys import format_utc
from dedup.outcomes import (
    Attempt,
    Claimed,
    ClaimOutcome,
    Conflict,
    Contended,
    Finished,
    InProgress,
    JobMismatch,
    Overlap,
    Released,
    Renewed,
    Replayed,
    Skipped,
    Stale,
)
from dedup.queries import RunFilter
from dedup.record_store import Aborted, Applied, Doubt, Exists, RecordStore, VersionFence, Write, encode
from dedup.record_store import Conflict as RecordConflict
from dedup.transactions import RETRYABLE_ERRORS, EarlyTransaction, is_contention, run_transaction
from models import RunRecord, RunStatus
from models.job_lock import JobLock

log = logging.getLogger(__name__)

# Transactions on one hot record abort under contention; they are retried
# (dedup/transactions.py).  A claimer that still loses after
# CLAIM_PATIENCE_SECONDS is told to come back (409), never given a 500; the
# owner finishing a run it has already performed keeps trying for
# FINISH_PATIENCE_SECONDS.
CLAIM_PATIENCE_SECONDS = 3.0
FINISH_PATIENCE_SECONDS = 30.0
# A finished record's preview of its result or error, in characters.
PREVIEW_CHARS = 200
# Attempt history kept on each record, and who this process is in it.
MAX_ATTEMPT_HISTORY = 10
INSTANCE = os.environ.get("GAE_INSTANCE") or f"{socket.gethostname()}:{os.getpid()}"


@dataclasses.dataclass(frozen=True)
class RunPolicy:
    """How long a claim is exclusive and how long the record is remembered.

    ``expire_at`` is set to created + ``retention_seconds`` by the claim.  When
    the run finishes it becomes, without ``finished_retention_seconds``,
    max(expire_at, finished + retention_seconds) (scheduled runs: remembered
    for the whole retention after they finish); with it, min(expire_at,
    finished + finished_retention_seconds) (client tokens, the ECS rule:
    min(created + 24 h, finished + 1 h)).
    """

    lease_seconds: float
    retention_seconds: float
    finished_retention_seconds: float | None = None
    # Renew the lease every third of it while the work runs (dedup.heartbeat),
    # for at most max_run_seconds.
    heartbeat: bool = False
    max_run_seconds: float | None = None
    # overlap: forbid: one execution of the job at a time, under the job's lock (models.job_lock).
    exclusive: bool = False


@dataclasses.dataclass(frozen=True)
class RunDescription:
    """What a new record says about its run; never changes after the first claim."""

    source: str
    job_id: str
    scheduler_job_name: str | None = None
    schedule_time: datetime.datetime | None = None
    project: str | None = None
    location: str | None = None
    client_token: str | None = None
    scope: str | None = None
    parameters: dict[str, Any] | None = None
    fingerprint: str | None = None
    requested_by: str | None = None  # the principal whose request made this claim (handlers.access)


class Ledger:
    def __init__(self, clock: Clock, finished: FinishedRuns | None = None) -> None:
        """``finished``: this process's cache of completed runs (default: a new, bounded one)."""
        self.clock = clock
        self.finished = finished if finished is not None else FinishedRuns()
        # Begin the finish's transaction beside the claim (replay_or_claim); turned off for
        # good when one is found not to see the claim it followed (_fenced).
        self.finish_begins_early = True

    # -- reads ---------------------------------------------------------------

    def lookup(self, run_id: str) -> RunRecord | None:
        """One strongly consistent lookup; an expired record counts as absent."""
        record: RunRecord | None = RunRecord.get_by_id(run_id)
        if record is None or record.is_expired(self.clock.now()):
            return None
        return record

    def lookup_many(self, run_ids: list[str]) -> dict[str, RunRecord]:
        """The records of ``run_ids`` that exist and have not expired, in one batch lookup."""
        if not run_ids:
            return {}
        now = self.clock.now()
        records = ndb.get_multi([ndb.Key(RunRecord, run_id) for run_id in run_ids])
        return {r.key.id(): r for r in records if r is not None and not r.is_expired(now)}

    def refusal(
        self, run_id: str, description: RunDescription, reopen_attempt: int | None = None
    ) -> ClaimOutcome | None:
        """What the record answers without a claim (Replayed, Conflict, JobMismatch, InProgress), or None.

        A completed run this process has seen costs no round trip, any other
        one strongly consistent lookup.
        """
        return self._cached_refusal(run_id, description, reopen_attempt) or self._stored_refusal(
            run_id, description, reopen_attempt
        )

    def _cached_refusal(
        self, run_id: str, description: RunDescription, reopen_attempt: int | None
    ) -> ClaimOutcome | None:
        cached = self.finished.get(run_id, self.clock.now())
        return None if cached is None else _refusal(cached, description, self.clock.now(), reopen_attempt)

    def _stored_refusal(
        self, run_id: str, description: RunDescription, reopen_attempt: int | None
    ) -> ClaimOutcome | None:
        record = self.lookup(run_id)
        if record is not None:
            self.finished.remember(record)  # completed records only
        return _refusal(record, description, self.clock.now(), reopen_attempt)

    def replay_or_claim(
        self,
        run_id: str,
        description: RunDescription,
        policy: RunPolicy,
        reopen_attempt: int | None = None,
        skip_reason: str | None = None,
        speculate: bool = True,
    ) -> ClaimOutcome | Skipped:
        """Answer from the record when it refuses a claim, else claim the run (``claim_run``).

        A completed run this process has seen costs no round trip.  With ``speculate`` (a
        delivery) the claim is an insert sent beside the lookup that answers any refusal
        (``_claim_by_version``): a fresh run is claimed in one round trip, and finished in one
        more.  Without it (a waiting call's polls, which expect to find the lease), and for a
        job's lock, the claim is a transaction (``claim_run``) whose BeginTransaction travels
        beside the lookup, and the finish's beside the claim; whichever is not used is rolled
        back without waiting.
        """
        refusal = self._cached_refusal(run_id, description, reopen_attempt)
        if refusal is not None:
            return refusal
        if speculate and not policy.exclusive:
            claimed = self._claim_by_version(run_id, description, policy, reopen_attempt, skip_reason)
            if claimed is not None:
                return claimed
        claim_transaction = EarlyTransaction() if speculate else None
        try:
            refusal = self._stored_refusal(run_id, description, reopen_attempt)  # beside the claim's BeginTransaction
            if refusal is None:
                return self.claim_run(
                    run_id,
                    description,
                    policy,
                    reopen_attempt,
                    skip_reason,
                    early=claim_transaction,
                    prepare_finish=self.finish_begins_early,
                )
            return refusal
        finally:
            if claim_transaction is not None:
                claim_transaction.discard()  # no-op once the claim took it

    def _claim_by_version(
        self,
        run_id: str,
        description: RunDescription,
        policy: RunPolicy,
        reopen_attempt: int | None,
        skip_reason: str | None,
    ) -> ClaimOutcome | Skipped | None:
        """The claim without a transaction (dedup.record_store): None where it must be one.

        The record's lookup and the insert of a fresh claim travel together, so a run nobody
        recorded is claimed in one round trip and a duplicate is answered in one; a record that
        is there but claimable (released, expired, a lost lease, reopened) is replaced by an
        update fenced on the version just read, a second round trip.  A claim in doubt goes to
        ``claim_run`` with its attempt id, which recognises it if it landed; a conflict, to
        ``claim_run`` afresh.
        """
        store = RecordStore.of_context()
        claim_of = ClaimRequest(run_id, uuid.uuid4().hex, description, policy, reopen_attempt, skip_reason)
        now = self.clock.now()
        fresh = claim_of.decide(None, now)
        assert isinstance(fresh, Claimed | Skipped)  # nothing refuses a claim of no record
        found, written = store.lookup_and_insert(fresh.record)
        if not isinstance(written, Exists):
            return self._claim_written(claim_of, fresh, written)
        if found is None:
            return None  # inserted by another between the lookup and the insert: read it in a transaction
        if found.record.attempt_id != claim_of.attempt_id:
            self.finished.remember(found.record)  # completed records only
        decided = claim_of.decide(found.record, now)
        if not isinstance(decided, Claimed | Skipped):
            return decided
        return self._claim_written(claim_of, decided, store.update(encode(decided.record), found.version))

    def _claim_written(
        self, claim_of: ClaimRequest, decided: Claimed | Skipped, written: Write
    ) -> ClaimOutcome | Skipped | None:
        """What a fenced claim's write means: claimed, in doubt (settled by ``claim_run``), or None."""
        match written:
            case Applied(version):
                if isinstance(decided, Skipped):
                    return decided
                fence = VersionFence(encode(decided.record), version)
                claimed = dataclasses.replace(decided, attempt=dataclasses.replace(decided.attempt, fence=fence))
                _log_takeover(claimed)
                return claimed
            case Doubt(error):
                log.info("run %s: claim in doubt (%s); settling it in a transaction", claim_of.run_id, error)
                return self.claim_run(
                    claim_of.run_id,
                    claim_of.description,
                    claim_of.policy,
                    claim_of.reopen_attempt,
                    claim_of.skip_reason,
                    attempt_id=claim_of.attempt_id,
                )
            case Exists() | RecordConflict() | Aborted():
                return None  # another wrote it since: the transactional claim reads what is there
            case _:
                assert_never(written)

    def find_runs(
        self, run_filter: RunFilter, page_size: int, cursor: str | None = None
    ) -> tuple[list[RunRecord], str | None]:
        """Runs newest first, one page at a time (dedup/queries.py)."""
        return queries.find_runs(run_filter, page_size, self.clock.now(), cursor)

    # -- writes (each one transaction) -----------------------------------------

    def claim_run(
        self,
        run_id: str,
        description: RunDescription,
        policy: RunPolicy,
        reopen_attempt: int | None = None,
        skip_reason: str | None = None,
        early: EarlyTransaction | None = None,
        prepare_finish: bool = False,
        attempt_id: str | None = None,
    ) -> ClaimOutcome | Skipped:
        """Take the run for a new attempt, or say why not.

        ``attempt_id``: the id a claim in doubt wrote (``_claim_by_version``), so that a claim
        that landed is recognised as this one's.

        ``early``: a transaction begun beforehand for the claim to use.
        ``prepare_finish``: begin the finish's transaction beside the claim's
        round trips (``Claimed.finish_transaction``; discarded on any other outcome).

        ``reopen_attempt`` (an operator running a slot by hand: the attempt number
        the operator saw, 0 for none): a failed or skipped run that is still that
        attempt counts as absent too, so the claim replaces it, keeping its history
        and attempt count.  Once replaced it no longer matches, so the same request
        again is answered from the reopened attempt (a reopen is one decision);
        a completed run is still replayed, a leased one refused.
        ``skip_reason`` (a delivery later than its job allows): where the claim
        would start the run afresh (no record, a released or expired one that
        started nothing downstream), the run is recorded as skipped instead, in
        the same transaction; an attempt that began is still taken over, since
        what it began must be finished.
        """
        # Chosen once, outside the transaction: if a commit lands but its answer
        # is lost, the retry finds this id in the record and knows the claim is its own.
        attempt_id = attempt_id or uuid.uuid4().hex
        claim_of = ClaimRequest(run_id, attempt_id, description, policy, reopen_attempt, skip_reason)

        lock_key = ndb.Key(JobLock, description.job_id) if policy.exclusive else None

        def claim() -> ClaimOutcome | Skipped:
            now = self.clock.now()
            if lock_key is None:
                current, lock = RunRecord.get_by_id(run_id), None
            else:  # one round trip for both
                current, lock = ndb.get_multi([ndb.Key(RunRecord, run_id), lock_key])
            job_lock = lock_key.id() if lock_key else None
            if current is not None and current.attempt_id == attempt_id:
                return Claimed(
                    current,
                    Attempt(run_id, attempt_id, current.attempt, downstream=current.downstream, job_lock=job_lock),
                )
            decided = claim_of.decide(current, now, lock)
            if not isinstance(decided, Claimed | Skipped):
                return decided  # a refusal: nothing written
            if lock_key is None:
                decided.record.put()
            elif isinstance(decided, Claimed):  # the run and the job's lock, in one commit
                held = JobLock(
                    key=lock_key, run_id=run_id, attempt_id=attempt_id, lease_expires=decided.record.lease_expires
                )
                ndb.put_multi([decided.record, held])
            else:
                decided.record.put()
            return decided

        finish_transaction = EarlyTransaction() if prepare_finish else None
        try:
            outcome = run_transaction(claim, CLAIM_PATIENCE_SECONDS, early=early)
        except RETRYABLE_ERRORS as exc:
            if finish_transaction is not None:
                finish_transaction.discard()
            if not is_contention(exc):
                raise
            log.warning("run %s: claim lost to contention (%s); answering 409", run_id, exc)
            return Contended(run_id)
        except BaseException:
            if finish_transaction is not None:
                finish_transaction.discard()
            raise
        match outcome:
            case Claimed():
                if finish_transaction is not None:
                    outcome = dataclasses.replace(outcome, finish_transaction=finish_transaction)
                _log_takeover(outcome)  # once, after the commit (the callback may have run more than once)
                return outcome
            case Replayed() | Conflict() | JobMismatch() | InProgress() | Contended() | Overlap() | Skipped():
                if finish_transaction is not None:
                    finish_transaction.discard()
                return outcome
            case _:
                assert_never(outcome)

    def renew_lease(
        self, attempt: Attempt, lease_seconds: float, patience_seconds: float | None = None
    ) -> Renewed | Stale:
        """Extend the lease of a running attempt, if it still owns the run.

        ``patience_seconds`` bounds the retries (the heartbeat gives a third of the
        lease: a renewal that cannot land in time is no use).
        """

        def renew(record: RunRecord, now: datetime.datetime) -> Renewed:
            record.lease_expires = now + _seconds(lease_seconds)
            record.expire_at = max(record.expire_at, record.lease_expires)
            record.updated = now
            return Renewed(record)

        return self._fenced(attempt, renew, patience_seconds, keeps_running=True)

    def record_downstream(self, attempt: Attempt, resource_name: str) -> Renewed | Stale:
        """Note what this attempt started downstream, so a takeover can adopt it."""

        def record(record: RunRecord, now: datetime.datetime) -> Renewed:
            record.downstream = resource_name
            record.updated = now
            return Renewed(record)

        return self._fenced(attempt, record, keeps_running=True)

    def complete_run(
        self, attempt: Attempt, result: object, policy: RunPolicy, early: EarlyTransaction | None = None
    ) -> Finished | Stale:
        """Record success; the retention window restarts from the finish.

        ``early`` (here and in ``fail_run``, ``release_run``): the transaction
        the claim began for the finish (``Claimed.finish_transaction``).
        """
        return self._finish(attempt, RunStatus.COMPLETED, result, policy, early)

    def fail_run(
        self, attempt: Attempt, error: dict[str, Any], policy: RunPolicy, early: EarlyTransaction | None = None
    ) -> Finished | Stale:
        """Record a permanent failure, replayed to every later delivery."""
        return self._finish(attempt, RunStatus.FAILED, error, policy, early)

    def release_run(
        self, attempt: Attempt, error: dict[str, Any], early: EarlyTransaction | None = None
    ) -> Released | Stale:
        """Give the run up after a retryable failure: the record stays, ``released``.

        It counts as absent for the next claim, so the retry runs at once (as when
        releasing deleted the record); the attempt number, the history and what the
        attempt started downstream (for the retry to adopt) carry over.
        """

        def release(record: RunRecord, now: datetime.datetime) -> Released:
            _record_end(record, RunStatus.RELEASED, error, now)
            record.lease_expires = now  # nobody holds it
            return Released(attempt.run_id, attempt.number, error, record)

        def landed(record: RunRecord | None) -> Released | None:
            if record is not None and record.attempt_id == attempt.attempt_id and record.status == RunStatus.RELEASED:
                return Released(attempt.run_id, attempt.number, error, record)
            return None

        return self._fenced(attempt, release, landed=landed, early=early)

    def delete_expired(self, batch_size: int = 100, cursor: str | None = None) -> tuple[int, str | None]:
        """Delete one batch of expired records (dedup/queries.py: the fallback where no TTL policy is set)."""
        return queries.delete_expired(self.clock.now(), self.clock.now, batch_size, cursor)

    # -- internals -----------------------------------------------------------

    def _finish(
        self,
        attempt: Attempt,
        status: RunStatus,
        document: object,
        policy: RunPolicy,
        early: EarlyTransaction | None = None,
    ) -> Finished | Stale:
        """Record the outcome (a result, or an error) of the attempt that owns the run."""

        def finish(record: RunRecord, now: datetime.datetime) -> Finished:
            _record_end(record, status, document, now)
            if policy.finished_retention_seconds is None:
                record.expire_at = max(record.expire_at, now + _seconds(policy.retention_seconds))
            else:
                record.expire_at = min(record.expire_at, now + _seconds(policy.finished_retention_seconds))
            return Finished(record)

        outcome = self._fenced(attempt, finish, landed=_finish_landed(attempt, status), early=early)
        match outcome:
            case Finished():
                self.finished.remember(outcome.record)  # after the commit: the next duplicate costs nothing
            case Stale():
                pass
            case _:
                assert_never(outcome)
        return outcome

    def _fenced[T](
        self,
        attempt: Attempt,
        change: Callable[[RunRecord, datetime.datetime], T],
        patience_seconds: float | None = None,
        landed: Callable[[RunRecord | None], T | None] | None = None,
        keeps_running: bool = False,
        early: EarlyTransaction | None = None,
    ) -> T | Stale:
        """Apply ``change`` only while ``attempt`` owns the run: what it returns, or Stale.

        ``change`` edits the record and never writes it: an update fenced on the version of
        this attempt's last write does (``attempt.fence``), else a transaction that reads first.

        Only the owner writes a run, but every duplicate's claim reads it and
        can abort the owner's commit; giving up would leave a performed job
        unrecorded (and run again after the lease), so the owner persists.
        """
        write = FencedWrite(self.clock, attempt, change, landed, keeps_running)
        if attempt.fence is not None and attempt.job_lock is None:
            fast = _write_by_version(attempt.fence, self.clock.now(), change)
            if isinstance(fast, Landed):
                return fast.outcome
            # Not applied, or in doubt: the transaction reads what is there (and, once a write
            # may have landed, recognises it as this attempt's own).
            write.wrote = isinstance(fast, Doubt)
            early = None
        patience = FINISH_PATIENCE_SECONDS if patience_seconds is None else patience_seconds
        outcome = run_transaction(write, patience, early=early)
        if isinstance(outcome, Stale) and early is not None and early.served:
            # The early transaction began before the claim committed.  Where
            # reads are served at the transaction's start (optimistic
            # concurrency), it could miss the claim itself: a stale verdict,
            # which would leave a performed run unrecorded, is checked again.
            outcome = run_transaction(write, patience)
            if not isinstance(outcome, Stale) and self.finish_begins_early:
                # It was: this database serves reads from the start of a transaction, so
                # a finish begun beside the claim would be stale every time.  From now on
                # this process begins the finish's transaction when it finishes.
                self.finish_begins_early = False
                log.warning(
                    "run %s: a transaction begun before the claim did not see it (optimistic concurrency?); "
                    "finishes no longer begin their transactions early in this process",
                    attempt.run_id,
                )
        if isinstance(outcome, Stale):
            current = outcome.current
            log.warning(
                "run %s: attempt %d is stale (record now %s); nothing changed",
                attempt.run_id,
                attempt.number,
                f"attempt {current.attempt} {current.status}" if current else "absent",
            )
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

    def __call__(self) -> T | Stale:
        now = self.clock.now()
        attempt = self.attempt
        record: RunRecord | None
        lock: JobLock | None
        if attempt.job_lock is None:
            record, lock = RunRecord.get_by_id(attempt.run_id), None
        else:  # the run and the job's lock, in one round trip
            record, lock = ndb.get_multi([ndb.Key(RunRecord, attempt.run_id), ndb.Key(JobLock, attempt.job_lock)])
        if self.wrote and self.landed is not None:
            outcome = self.landed(record)
            if outcome is not None:
                return outcome
        if record is None or record.attempt_id != attempt.attempt_id or record.status != RunStatus.IN_PROGRESS:
            return Stale(attempt.run_id, attempt.number, record)
        owned_lock = lock if lock is not None and lock.attempt_id == attempt.attempt_id else None
        if attempt.job_lock is not None and self.keeps_running and owned_lock is None:
            # Its lease ran out and another execution of the job took the lock: it must stop.
            return Stale(attempt.run_id, attempt.number, record)
        self.wrote = True
        outcome = self.change(record, now)
        record.put()
        if owned_lock is not None:
            if record.status == RunStatus.IN_PROGRESS:
                owned_lock.lease_expires = record.lease_expires  # renewed with the run
                owned_lock.put()
            else:
                owned_lock.key.delete()  # finished or released: the next execution may start
        return outcome


@dataclasses.dataclass(frozen=True)
class Landed[T]:
    outcome: T


def _write_by_version[T](
    fence: VersionFence, now: datetime.datetime, change: Callable[[RunRecord, datetime.datetime], T]
) -> Landed[T] | Write | None:
    """``change`` applied to what this attempt last wrote, fenced on that write's version: what
    ``change`` returned when it landed, else the write's answer (None: the fence was dropped)."""
    held = fence.take()
    if held is None:
        return None
    record, version = held
    outcome = change(record, now)
    entity = encode(record)
    written = RecordStore.of_context().update(entity, version)
    if isinstance(written, Applied):
        fence.advance(entity, written.version)
        return Landed(outcome)
    fence.drop()
    return written


def _log_takeover(claimed: Claimed) -> None:
    history = claimed.record.attempts or []
    if len(history) > 1 and history[-2].get("outcome") == "lease_expired":
        log.warning(
            "run %s: lease of attempt %d expired; attempt %d takes over",
            claimed.run_id,
            history[-2]["attempt"],
            claimed.attempt.number,
            extra={"run_id": claimed.run_id, "attempt": claimed.attempt.number, "outcome": "takeover"},
        )


@dataclasses.dataclass(frozen=True)
class ClaimRequest:
    """One claim's inputs, as one value: the run, the attempt id it writes, its description and
    policy, the attempt an operator reopens and the reason a late delivery is skipped."""

    run_id: str
    attempt_id: str
    description: RunDescription
    policy: RunPolicy
    reopen_attempt: int | None = None
    skip_reason: str | None = None

    def decide(
        self, current: RunRecord | None, now: datetime.datetime, lock: JobLock | None = None
    ) -> ClaimOutcome | Skipped:
        """What this claim does to the stored ``current`` (and the job's ``lock``): a refusal, which
        writes nothing, or the record to write (``Claimed``, ``Skipped``)."""
        live = current if current is not None and not current.is_expired(now) else None  # expired: absent
        refusal = _refusal(live, self.description, now, self.reopen_attempt)
        if refusal is not None:
            return refusal
        if self.skip_reason is not None and (
            live is None or (live.status != RunStatus.IN_PROGRESS and not live.downstream)
        ):
            return Skipped(
                _skipped_record(self.run_id, self.description, self.policy, self.skip_reason, live, current, now)
            )
        if lock is not None and lock.run_id != self.run_id and lock.is_held(now):
            return Overlap.until(self.run_id, lock.run_id, lock.lease_expires, now)
        # Absent, released, or an in-progress record whose lease ran out (a takeover).  The
        # attempt number rises with every claim of the run, so it is a usable fencing token.
        attempt = Attempt(
            self.run_id,
            self.attempt_id,
            (current.attempt if current else 0) + 1,
            downstream=live.downstream if live else None,
            job_lock=self.description.job_id if self.policy.exclusive else None,
        )
        return Claimed(_claimed_record(attempt, self.description, self.policy, live, now), attempt)


REOPENED = frozenset({RunStatus.FAILED, RunStatus.SKIPPED})  # what an operator's run replaces


def _refusal(
    current: RunRecord | None,
    description: RunDescription,
    now: datetime.datetime,
    reopen_attempt: int | None = None,
) -> ClaimOutcome | None:
    """Why the live record ``current`` refuses a new claim (another job's, other parameters,
    finished, leased), or None."""
    if current is None:
        return None
    if current.job_id != description.job_id:
        return JobMismatch(current, description.job_id)
    if current.status == RunStatus.RELEASED or (current.status in REOPENED and current.attempt == reopen_attempt):
        return None  # absent for a claim, which replaces it (its parameters too)
    if current.fingerprint != description.fingerprint:
        return Conflict(current)
    if current.status != RunStatus.IN_PROGRESS:
        return Replayed(current)
    if current.lease_is_live(now):
        return InProgress.until(current, now)
    return None


def _claimed_record(
    attempt: Attempt,
    description: RunDescription,
    policy: RunPolicy,
    current: RunRecord | None,
    now: datetime.datetime,
) -> RunRecord:
    """The record of a new attempt: the description as given, the attempt's fence and lease, the history."""
    history = list(current.attempts or []) if current else []
    if history and history[-1].get("outcome") is None:
        history[-1] = {**history[-1], "outcome": "lease_expired"}  # taken over
    history.append(
        {
            "attempt": attempt.number,
            "attempt_id": attempt.attempt_id,
            "started": format_utc(now),
            "finished": None,
            "outcome": None,
            "instance": INSTANCE,
            **({"requested_by": description.requested_by} if description.requested_by else {}),
        }
    )
    created = current.created if current else now
    return RunRecord(
        id=attempt.run_id,
        # RunDescription's fields are the record's (copied as they are: asdict would deep-copy).
        **{field.name: getattr(description, field.name) for field in dataclasses.fields(description)},
        downstream=attempt.downstream,
        attempts=history[-MAX_ATTEMPT_HISTORY:],
        status=RunStatus.IN_PROGRESS,
        attempt_id=attempt.attempt_id,
        attempt=attempt.number,
        lease_expires=now + _seconds(policy.lease_seconds),
        # Never expire (count as absent) while a lease is live, and a slot's run never before
        # its schedule time plus the retention (schedules.slots: what the ledger can still know).
        expire_at=max(
            max(created, description.schedule_time or created) + _seconds(policy.retention_seconds),
            now + _seconds(policy.lease_seconds),
        ),
        created=created,
        updated=now,
        started=now,
    )


def json_preview(value: Any, chars: int = PREVIEW_CHARS) -> str:
    """The first ``chars`` characters of ``value`` as compact JSON, "…" marking a cut."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _record_end(record: RunRecord, status: RunStatus, document: object, now: datetime.datetime) -> None:
    """Write how the owning attempt ended: its status, its result or error, its history entry."""
    record.status = status.value
    if status == RunStatus.COMPLETED:
        record.result = document
    else:
        record.error = document
    record.preview = json_preview(document)
    record.finished = now
    record.updated = now
    record.attempts = [
        {**entry, "finished": format_utc(now), "outcome": record.status}
        if entry.get("attempt_id") == record.attempt_id
        else entry
        for entry in record.attempts or []
    ]


def _skipped_record(
    run_id: str,
    description: RunDescription,
    policy: RunPolicy,
    reason: str,
    live: RunRecord | None,
    current: RunRecord | None,
    now: datetime.datetime,
) -> RunRecord:
    """A late slot, recorded as skipped: no attempt ran (its attempt id is one nothing holds)."""
    error = {"type": "LateDelivery", "message": reason}
    return RunRecord(
        id=run_id,
        **{field.name: getattr(description, field.name) for field in dataclasses.fields(description)},
        attempts=list(live.attempts or []) if live else [],
        status=RunStatus.SKIPPED,
        attempt_id=uuid.uuid4().hex,
        attempt=current.attempt if current else 0,  # attempt numbers never go back
        lease_expires=now,
        expire_at=now + _seconds(policy.retention_seconds),
        created=live.created if live else now,
        updated=now,
        finished=now,
        error=error,
        preview=json_preview(error),
    )


def _finish_landed(attempt: Attempt, status: RunStatus) -> Callable[[RunRecord | None], Finished | None]:
    """This attempt's own finish, found already recorded."""

    def landed(record: RunRecord | None) -> Finished | None:
        if record is not None and record.attempt_id == attempt.attempt_id and record.status == status:
            return Finished(record)
        return None

    return landed


def _seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)
