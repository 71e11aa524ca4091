"""The run ledger: claim, renew, complete, fail, release and replay runs.

Every write is fenced, so a stale attempt (one whose lease ran out and was taken over) can
never change a record it no longer owns.  On the hot path the fence is Datastore's own
(dedup.record_store): a fresh claim is an insert, refused when the record exists, and each
later write of the attempt an update applied only while the record is still the version the
attempt's last write returned.  Anything else (a conflict, a write in doubt, a job's lock) is
a transaction that reads the record first and checks the attempt id.  What each does is
decided in one place (dedup.claims).  Answers that change nothing (a replay, a live lease's
409, a refusal) come from one strongly consistent lookup, or none for a completed run this
process has seen.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any, assert_never

from google.cloud import ndb

from dedup import queries
from dedup.claims import ClaimRequest, RunDescription, RunPolicy, finish_landed, record_end, refusal, seconds
from dedup.clock import Clock
from dedup.fences import fenced_write
from dedup.finished_cache import FinishedRuns
from dedup.job_lock import JobLock
from dedup.keys import format_utc
from dedup.metrics import CountedStore, count_round_trips, count_stale, count_takeover
from dedup.outcomes import Attempt, Claimed, ClaimOutcome, Contended, Finished, Released, Renewed, Skipped, Stale
from dedup.queries import RunFilter
from dedup.record_store import RecordStore, VersionFence, encode
from dedup.run_record import RunRecord, RunStatus
from dedup.steps import StepDecision, StepState, review_problem
from dedup.store import Aborted, Applied, Doubt, Exists, Refused, StaleVersion, Store, Transaction
from dedup.transactions import COMMIT_BATCH, TRIED_AGAIN, is_contention, transact

__all__ = ["CLAIM_PATIENCE_SECONDS", "FINISH_PATIENCE_SECONDS", "Ledger", "RunDescription", "RunPolicy"]
log = logging.getLogger(__name__)

# Transactions on one hot record abort under contention; they are retried
# (dedup.transactions.transact).  A claimer that still loses after
# CLAIM_PATIENCE_SECONDS is told to come back (409), never given a 500; the
# owner finishing a run it has already performed keeps trying for
# FINISH_PATIENCE_SECONDS: longer than a pessimistic database holds the lock of a
# transaction a killed process left open (it expires after 60 s idle), and well inside
# the request's deadline (10 minutes on App Engine standard).
CLAIM_PATIENCE_SECONDS = 3.0
# A claim that gives up after a write that may have landed releases it (``_withdraw``) this long.
WITHDRAW_PATIENCE_SECONDS = 10.0
FINISH_PATIENCE_SECONDS = 75.0


def done_by_hand(decision: StepDecision, now: datetime.datetime) -> dict[str, Any]:
    """What a step marked done by an operator keeps: the result they gave, and when."""
    return {"result": decision.result, "finished": format_utc(now)}


class Ledger:
    def __init__(
        self, clock: Clock, finished: FinishedRuns | None = None, store: Callable[[], Store] | None = None
    ) -> None:
        """``finished``: this process's cache of completed runs (default: a new, bounded one).
        ``store``: where the records are, asked at each call (default: Datastore, through the
        current NDB context's client; ``dedup.memory_store`` for tests of the decisions)."""
        self.clock = clock
        self.finished = finished if finished is not None else FinishedRuns()
        self.store: Callable[[], Store] = store or RecordStore.of_context

    # -- reads ---------------------------------------------------------------

    def lookup(self, run_id: str, store: Store | None = None) -> RunRecord | None:
        """One strongly consistent lookup; an expired record counts as absent."""
        found = (store or self.store()).lookup(run_id)
        if found is None or found.record.is_expired(self.clock.now()):
            return None
        record: RunRecord = found.record
        return record

    def lookup_many(self, run_ids: list[str]) -> dict[str, RunRecord]:
        """The records of ``run_ids`` that exist and have not expired, in one batch lookup."""
        if not run_ids:
            return {}
        now = self.clock.now()
        found = self.store().lookup_many([ndb.Key(RunRecord, run_id) for run_id in run_ids])
        return {f.record.key.id(): f.record for f in found if f is not None and not f.record.is_expired(now)}

    def refusal(
        self, run_id: str, description: RunDescription, reopen_attempt: int | None = None
    ) -> ClaimOutcome | None:
        """What the record answers without a claim (Replayed, Conflict, JobMismatch, InProgress), or None.

        A completed run this process has seen costs no round trip, any other one lookup.
        """
        return self._cached_refusal(run_id, description, reopen_attempt) or self._stored_refusal(
            run_id, description, reopen_attempt
        )

    def _cached_refusal(
        self, run_id: str, description: RunDescription, reopen_attempt: int | None
    ) -> ClaimOutcome | None:
        cached = self.finished.get(run_id, self.clock.now())
        return None if cached is None else refusal(cached, description, self.clock.now(), reopen_attempt)

    def _stored_refusal(
        self, run_id: str, description: RunDescription, reopen_attempt: int | None, store: Store | None = None
    ) -> ClaimOutcome | None:
        record = self.lookup(run_id, store)
        if record is not None:
            self.finished.remember(record)  # completed records only
        return refusal(record, description, self.clock.now(), reopen_attempt)

    def find_runs(
        self, run_filter: RunFilter, page_size: int, cursor: str | None = None
    ) -> tuple[list[RunRecord], str | None]:
        """Runs newest first, one page at a time (dedup/queries.py)."""
        return queries.find_runs(run_filter, page_size, self.clock.now(), cursor)

    def runs_starting(self, prefix: str, limit: int) -> list[RunRecord]:
        """The live runs whose id starts with ``prefix`` (lowercase hex), ``limit`` at most, by id."""
        found = self.lookup_many(queries.run_ids_starting(prefix, limit))
        return [found[run_id] for run_id in sorted(found)]

    def find_runs_together(self, run_filters: Sequence[RunFilter], page_size: int) -> list[list[RunRecord]]:
        """The first page of each filter's runs, the queries sent at once (dedup/queries.py)."""
        return queries.find_runs_together(run_filters, page_size, self.clock.now())

    # -- claims ----------------------------------------------------------------

    def replay_or_claim(
        self,
        run_id: str,
        description: RunDescription,
        policy: RunPolicy,
        reopen_attempt: int | None = None,
        skip_reason: str | None = None,
        speculate: bool = True,
    ) -> ClaimOutcome | Skipped:
        """Answer from the record when it refuses a claim, else claim the run.

        A completed run this process has seen costs no round trip.  With ``speculate`` (a
        delivery) the claim is an insert sent beside the lookup that answers any refusal
        (``_claim_by_version``): a fresh run is claimed in one round trip, and finished in one
        more.  Without it (a waiting call's polls, which expect to find the lease) a lookup
        answers first.  A job's lock needs the transaction, whose read answers refusals too.

        ``reopen_attempt`` (an operator running a slot by hand: the attempt number the operator
        saw, 0 for none): a failed or skipped run that is still that attempt counts as absent,
        so the claim replaces it, keeping its history and attempt count; the same request again
        is answered from the reopened attempt.  ``skip_reason`` (a delivery later than its job
        allows): where the claim would start the run afresh (no record, a released or expired
        one that started nothing downstream), the run is recorded as skipped instead; an
        attempt that began is still taken over, since what it began must be finished.
        """
        cached = self._cached_refusal(run_id, description, reopen_attempt)
        if cached is not None:
            return cached
        claim = ClaimRequest(run_id, description, policy, reopen_attempt, skip_reason)
        store = CountedStore(self.store())  # the claim's round trips, counted (dedup.metrics)
        try:
            if policy.exclusive:
                return self._claim_in_transaction(claim, store=store)
            if speculate:
                return self._claim_by_version(claim, store)
            refused = self._stored_refusal(run_id, description, reopen_attempt, store)
            return refused or self._claim_in_transaction(claim, store=store)
        finally:
            count_round_trips(description.job_id, description.scheduler_job_name, description.source, store.calls)

    def claim_run(
        self,
        run_id: str,
        description: RunDescription,
        policy: RunPolicy,
        reopen_attempt: int | None = None,
        skip_reason: str | None = None,
    ) -> ClaimOutcome | Skipped:
        """Take the run for a new attempt, or say why not, in a transaction that reads it first
        (``replay_or_claim`` for what the arguments mean)."""
        return self._claim_in_transaction(ClaimRequest(run_id, description, policy, reopen_attempt, skip_reason))

    def stand_for(self, run_id: str, description: RunDescription, policy: RunPolicy, covers: Sequence[str]) -> bool:
        """Set the run ``run_id`` to stand for the runs at ``covers`` (slot times: a compacted
        catch-up), before any of them is skipped into it: a record released with no attempt (so
        any claim takes it, and keeps the list) lists them, with those it listed before.  False
        when the run has begun or ended since (then nothing may be covered into it)."""

        def body(transaction: Transaction) -> bool:
            (found,) = transaction.get([ndb.Key(RunRecord, run_id)])
            now = self.clock.now()
            current = found.record if found and not found.record.is_expired(now) else None
            if current is not None:
                if current.status != RunStatus.RELEASED or current.job_id != description.job_id:
                    return False
                current.covers = sorted({*(current.covers or ()), *covers})
                current.updated = now
                transaction.put(current)
                return True
            standing = RunRecord(
                id=run_id,
                **{field.name: getattr(description, field.name) for field in dataclasses.fields(description)},
                attempts=[],
                status=RunStatus.RELEASED,
                attempt_id=uuid.uuid4().hex,
                attempt=0,
                lease_expires=now,
                expire_at=max(now, description.schedule_time or now) + seconds(policy.retention_seconds),
                created=now,
                updated=now,
            )
            standing.covers = sorted(set(covers))
            transaction.put(standing)
            return True

        standing, _ = transact(body, CLAIM_PATIENCE_SECONDS, self.store())
        return standing

    def settle_step(self, run_id: str, decision: StepDecision) -> RunRecord | str:
        """An operator's decision on the step a run stopped at (``NeedsReview``): the record, with the
        step marked done or to be run again, or why not (the run is not waiting on that step at the
        attempt the operator saw).  The run stays failed at that attempt: the run that follows
        reopens it there (``reopen_attempt``), so the decision and the reopen are each done once."""

        def body(transaction: Transaction) -> RunRecord | str:
            (found,) = transaction.get([ndb.Key(RunRecord, run_id)])
            now = self.clock.now()
            record = found.record if found and not found.record.is_expired(now) else None
            if record is None:
                return f"no run {run_id} (or it has expired)"
            entry = dict((record.steps or {}).get(decision.step) or {})
            if (
                entry.get("settled_by") == decision.by
                and entry.get("state") == decision.state
                and (record.attempt == decision.seen_attempt)
            ):
                return record  # this decision, landed by a try whose answer was lost
            problem = review_problem(record, decision)
            if problem:
                return problem
            entry.update(
                state=str(decision.state),
                settled_by=decision.by,
                settled=format_utc(now),
                **(done_by_hand(decision, now) if decision.state == StepState.DONE else {}),
            )
            record.steps = {**(record.steps or {}), decision.step: entry}
            record.updated = now
            transaction.put(record)
            return record

        settled, _ = transact(body, CLAIM_PATIENCE_SECONDS, self.store())
        return settled

    def skip_runs(self, claims: Sequence[ClaimRequest], patience_seconds: float = 10.0) -> list[Skipped]:
        """Record each claim's run as skipped into the run its ``covered_by`` names (a compacted
        catch-up: each claim carries its ``skip_reason``) where a claim would start it afresh, as
        ``claim_run`` decides one: COMMIT_BATCH runs a transaction, read and written together, so a
        run claimed meanwhile (a delivery that got there first) is never overwritten.  Each batch
        also reads the standing run, and writes nothing once that run has begun (``stand_for``):
        its attempt reads what it stands for, so nothing may be added after.  The skips written
        (or found written: a batch whose commit was in doubt, tried again, recognises its own)."""
        skipped: list[Skipped] = []
        for first in range(0, len(claims), COMMIT_BATCH):
            batch = list(claims[first : first + COMMIT_BATCH])
            standing_id = batch[0].covered_by
            assert standing_id is not None and all(claim.covered_by == standing_id for claim in batch)

            def body(
                transaction: Transaction, batch: list[ClaimRequest] = batch, standing_id: str = standing_id
            ) -> list[Skipped]:
                keys = [ndb.Key(RunRecord, claim.run_id) for claim in batch]
                *found, standing = transaction.get([*keys, ndb.Key(RunRecord, standing_id)])
                now, written = self.clock.now(), []
                for claim, entity in zip(batch, found, strict=True):
                    current = entity.record if entity else None
                    if current is not None and current.compacted_into == claim.covered_by:
                        written.append(Skipped(current))  # this skip, landed before
                        continue
                    if standing is None or standing.record.status != RunStatus.RELEASED:
                        continue  # the standing run has begun (or is gone): cover nothing more
                    decided = claim.decide(current, now)
                    if isinstance(decided, Skipped):
                        transaction.put(decided.record)
                        written.append(decided)
                return written

            done, _ = transact(body, patience_seconds, self.store())
            skipped += done
        return skipped

    def _claim_by_version(self, claim: ClaimRequest, store: Store) -> ClaimOutcome | Skipped:
        """The lookup and the insert of a fresh claim travel together; a record that is there but
        claimable (released, expired, a lost lease, reopened) is replaced by an update fenced on
        the version just read.  Anything those writes cannot settle goes to the transaction."""
        now = self.clock.now()
        decided = claim.decide(None, now)
        assert isinstance(decided, Claimed | Skipped)  # nothing refuses a claim of no record
        entity = encode(decided.record)
        found, written = store.lookup_and_insert(decided.record, entity)
        if isinstance(written, Exists) and found is not None:
            self.finished.remember(found.record)  # completed records only
            decided = claim.decide(found.record, now)
            if not isinstance(decided, Claimed | Skipped):
                return decided  # a refusal: nothing written
            if not store.fenced:  # a stale version might be applied: the transaction reads and decides
                return self._claim_in_transaction(claim, store=store)
            entity = encode(decided.record)
            written = store.update(entity, found.version)
        match written:
            case Applied(version):
                if isinstance(decided, Skipped):
                    return decided
                fence = VersionFence(decided.record, version)
                claimed = dataclasses.replace(decided, attempt=dataclasses.replace(decided.attempt, fence=fence))
                _log_takeover(claimed)
                return claimed
            case Doubt(error) | Refused(error):
                # Its attempt id tells the transaction whether it landed.
                log.info(
                    "run %s: claim not applied or in doubt (%s); settling it in a transaction", claim.run_id, error
                )
                return self._claim_in_transaction(claim, may_have_landed=True, store=store)
            case Exists() | StaleVersion() | Aborted():
                return self._claim_in_transaction(claim, store=store)  # written by another since it was read
            case _:
                assert_never(written)

    def _claim_in_transaction(
        self, claim: ClaimRequest, may_have_landed: bool = False, store: Store | None = None
    ) -> ClaimOutcome | Skipped:
        """``may_have_landed``: this claim's own write (an insert in doubt) may already be stored."""
        record_key = ndb.Key(RunRecord, claim.run_id)
        lock_key = ndb.Key(JobLock, claim.job_lock) if claim.job_lock else None
        wrote = may_have_landed

        def body(transaction: Transaction) -> ClaimOutcome | Skipped:
            found = transaction.get([record_key] + ([lock_key] if lock_key else []))
            current = found[0].record if found[0] else None
            lock = found[1].record if lock_key and found[1] else None
            own = claim.own(current)
            if own is not None:
                return own
            decided = claim.decide(current, self.clock.now(), lock)
            if isinstance(decided, Claimed | Skipped):
                nonlocal wrote
                wrote = wrote or isinstance(decided, Claimed)
                transaction.put(decided.record)
            if isinstance(decided, Claimed) and lock_key is not None:  # the run and the job's lock, in one commit
                record = decided.record
                transaction.put(
                    JobLock(
                        key=lock_key,
                        run_id=claim.run_id,
                        attempt_id=claim.attempt_id,
                        lease_expires=record.lease_expires,
                    )
                )
            return decided

        try:
            outcome, transaction = transact(body, CLAIM_PATIENCE_SECONDS, store or self.store())
        except TRIED_AGAIN as exc:
            if wrote:  # a commit of this claim may have landed: never leave a lease nobody holds
                self._withdraw(claim, exc)
            if not is_contention(exc):
                raise
            log.warning("run %s: claim lost to contention (%s); answering 409", claim.run_id, exc)
            return Contended(claim.run_id)
        if outcome.record is not None and not isinstance(outcome, Claimed | Skipped):
            self.finished.remember(outcome.record)  # a refusal read it: completed records only
        if isinstance(outcome, Claimed):
            version = transaction.versions.get(record_key)
            lock_version = transaction.versions.get(lock_key) if lock_key is not None else None
            if version is not None and (lock_key is None or lock_version is not None):
                fence = VersionFence(outcome.record, version, lock_version)
                outcome = dataclasses.replace(outcome, attempt=dataclasses.replace(outcome.attempt, fence=fence))
            _log_takeover(outcome)  # once, after the commit (the body may have run more than once)
        return outcome

    def _withdraw(self, claim: ClaimRequest, error: Exception) -> None:
        """Release this claim if it landed although its transaction could not be confirmed, so
        the next delivery claims at once instead of waiting out a lease nobody holds.  It changes
        only a record (and a lock) still carrying this claim's attempt id."""
        record_key = ndb.Key(RunRecord, claim.run_id)
        lock_key = ndb.Key(JobLock, claim.job_lock) if claim.job_lock else None

        def body(transaction: Transaction) -> bool:
            found = transaction.get([record_key] + ([lock_key] if lock_key else []))
            current = found[0].record if found[0] else None
            if current is None or current.attempt_id != claim.attempt_id or current.status != RunStatus.IN_PROGRESS:
                return False
            now = self.clock.now()
            reason = {"type": "ClaimUnconfirmed", "message": f"the claim could not be confirmed ({error}); released"}
            record_end(current, RunStatus.RELEASED, reason, now)
            current.lease_expires = now
            transaction.put(current)
            lock = found[1].record if lock_key and found[1] else None
            if lock is not None and lock.attempt_id == claim.attempt_id:
                transaction.delete(lock.key)
            return True

        try:
            released, _ = transact(body, WITHDRAW_PATIENCE_SECONDS, self.store())
        except TRIED_AGAIN as exc:
            log.error("run %s: a claim that may have landed could not be released (%s)", claim.run_id, exc)
            return
        if released:
            log.warning("run %s: a claim that landed unconfirmed was released (%s)", claim.run_id, error)

    # -- an attempt's writes (each fenced) -------------------------------------

    def renew_lease(
        self, attempt: Attempt, lease_seconds: float, patience_seconds: float | None = None
    ) -> Renewed | Stale:
        """Extend the lease of a running attempt, if it still owns the run.

        ``patience_seconds`` bounds the retries (the heartbeat gives a third of the
        lease: a renewal that cannot land in time is no use).
        """

        def renew(record: RunRecord, now: datetime.datetime) -> Renewed:
            record.lease_expires = now + seconds(lease_seconds)
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

    def record_step(self, attempt: Attempt, name: str, entry: dict[str, Any]) -> Renewed | Stale:
        """Record one step of the run (dedup.steps), fenced: never by an attempt that lost the run.
        Setting the same entry again changes nothing, so a write in doubt is simply made again."""

        def record(record: RunRecord, now: datetime.datetime) -> Renewed:
            record.steps = {**(record.steps or {}), name: entry}
            record.updated = now
            return Renewed(record)

        return self._fenced(attempt, record, keeps_running=True)

    def complete_run(self, attempt: Attempt, result: object, policy: RunPolicy) -> Finished | Stale:
        """Record success; the retention window restarts from the finish."""
        return self._finish(attempt, RunStatus.COMPLETED, result, policy)

    def fail_run(self, attempt: Attempt, error: dict[str, Any], policy: RunPolicy) -> Finished | Stale:
        """Record a permanent failure, replayed to every later delivery."""
        return self._finish(attempt, RunStatus.FAILED, error, policy)

    def release_run(self, attempt: Attempt, error: dict[str, Any]) -> Released | Stale:
        """Give the run up after a retryable failure: the record stays, ``released``.

        It counts as absent for the next claim, so the retry runs at once; the attempt number,
        the history and what the attempt started downstream (for the retry to adopt) carry over.
        """

        def release(record: RunRecord, now: datetime.datetime) -> Released:
            record_end(record, RunStatus.RELEASED, error, now)
            record.lease_expires = now  # nobody holds it
            return Released(attempt.run_id, attempt.number, error, record)

        def landed(record: RunRecord | None) -> Released | None:
            if record is not None and record.attempt_id == attempt.attempt_id and record.status == RunStatus.RELEASED:
                return Released(attempt.run_id, attempt.number, error, record)
            return None

        return self._fenced(attempt, release, landed=landed)

    def delete_expired(
        self, batch_size: int = queries.CLEANUP_BATCH, cursor: str | None = None
    ) -> tuple[int, str | None]:
        """Delete one batch of expired records (dedup/queries.py: the fallback where no TTL policy is set)."""
        return queries.delete_expired(self.clock.now(), self.clock.now, batch_size, cursor)

    def clean_up(self, budget_seconds: float) -> queries.Cleanup:
        """Delete expired records in concurrent batches until none is left or the budget is spent."""
        return queries.clean_up(self.clock.now, budget_seconds)

    def _finish(self, attempt: Attempt, status: RunStatus, document: object, policy: RunPolicy) -> Finished | Stale:
        """Record the outcome (a result, or an error) of the attempt that owns the run."""

        def finish(record: RunRecord, now: datetime.datetime) -> Finished:
            record_end(record, status, document, now)
            if policy.finished_retention_seconds is None:
                record.expire_at = max(record.expire_at, now + seconds(policy.retention_seconds))
            else:
                record.expire_at = min(record.expire_at, now + seconds(policy.finished_retention_seconds))
            return Finished(record)

        outcome = self._fenced(attempt, finish, landed=finish_landed(attempt, status))
        if isinstance(outcome, Finished):
            self.finished.remember(outcome.record)  # after the commit: the next duplicate costs nothing
        return outcome

    def _fenced[T](
        self,
        attempt: Attempt,
        change: Callable[[RunRecord, datetime.datetime], T],
        patience_seconds: float | None = None,
        landed: Callable[[RunRecord | None], T | None] | None = None,
        keeps_running: bool = False,
    ) -> T | Stale:
        """Apply ``change`` only while ``attempt`` owns the run: what it returns, or Stale.

        ``change`` edits the record and never writes it: an update fenced on the version of
        this attempt's last write does (``attempt.fence``), else a transaction that reads
        first.  Only the owner writes a run, but every duplicate's claim reads it and can
        abort the owner's commit; giving up would leave a performed job unrecorded (and run
        again after the lease), so the owner persists.
        """
        patience = FINISH_PATIENCE_SECONDS if patience_seconds is None else patience_seconds
        outcome = fenced_write(self.clock, attempt, change, patience, landed, keeps_running, self.store())
        if isinstance(outcome, Stale):
            current = outcome.current
            count_stale(current)
            log.warning(
                "run %s: attempt %d is stale (record now %s); nothing changed",
                attempt.run_id,
                attempt.number,
                f"attempt {current.attempt} {current.status}" if current else "absent",
            )
        return outcome


def _log_takeover(claimed: Claimed) -> None:
    history = claimed.record.attempts or []
    if len(history) > 1 and history[-2].get("outcome") == "lease_expired":
        count_takeover(claimed.record)
        log.warning(
            "run %s: lease of attempt %d expired; attempt %d takes over",
            claimed.run_id,
            history[-2]["attempt"],
            claimed.attempt.number,
            extra={"run_id": claimed.run_id, "attempt": claimed.attempt.number, "outcome": "takeover"},
        )
