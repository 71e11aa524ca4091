"""The run ledger: claim, renew, complete, fail, release and replay runs.

Every write is one NDB transaction that reads the record first and checks
the attempt fence, so a stale attempt (one whose lease ran out and was taken
over) can never change a record it no longer owns.  Only the replay of a
finished run skips the transaction: one strongly consistent lookup.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import random
import socket
import time
import uuid
from typing import Any, Callable

from google.api_core import exceptions as api_exceptions
from google.cloud import ndb

from dedup.clock import Clock
from dedup.keys import format_utc
from dedup.outcomes import (
    Attempt,
    Claimed,
    ClaimOutcome,
    Contended,
    Finished,
    InProgress,
    Mismatch,
    OtherJob,
    Released,
    Renewed,
    Replayed,
    Stale,
)
from models import RunRecord, RunStatus

log = logging.getLogger(__name__)

# Transactions on one hot record abort under contention.  They are retried
# here with short jittered sleeps (NDB's own backoff starts at a second and
# doubles).  A claimer that still loses after CLAIM_PATIENCE_SECONDS is told
# to come back (409), never given a 500; the owner finishing a run it has
# already performed keeps trying for FINISH_PATIENCE_SECONDS.
CLAIM_PATIENCE_SECONDS = 3.0
FINISH_PATIENCE_SECONDS = 30.0
# The longest string a filter may compare (Datastore's limit for indexed strings).
MAX_FILTER_BYTES = 1500
# How many batches one page of find_runs may read to skip expired records.
FIND_BATCHES = 5
# A finished record's preview of its result or error, in characters.
PREVIEW_CHARS = 200
# Attempt history kept on each record, and who this process is in it.
MAX_ATTEMPT_HISTORY = 10
INSTANCE = os.environ.get("GAE_INSTANCE") or f"{socket.gethostname()}:{os.getpid()}"
# A commit that failed with one of these may still have been applied (only
# Aborted says for sure it was not): every write below recognises its own
# landed commit when it tries again, so trying again is always safe.
_RETRYABLE_ERRORS = (
    api_exceptions.Aborted,
    api_exceptions.ServiceUnavailable,
    api_exceptions.InternalServerError,
    api_exceptions.Unknown,
    api_exceptions.DeadlineExceeded,
    api_exceptions.ResourceExhausted,
    api_exceptions.RetryError,
)


def _is_contention(exc: Exception) -> bool:
    """Aborted transactions, also when NDB gave up retrying them (RetryError wraps the cause).

    Datastore being unavailable is not contention: that stays an error (500).
    """
    if isinstance(exc, api_exceptions.RetryError):
        return isinstance(exc.cause, api_exceptions.Aborted)
    return isinstance(exc, api_exceptions.Aborted)


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


@dataclasses.dataclass(frozen=True)
class RunDescription:
    """What a new record says about its run; never changes after the first claim."""

    source: str
    job_id: str
    scheduler_job_name: str | None = None
    schedule_time: datetime.datetime | None = None
    project: str | None = None
    location: str | None = None
    idempotency_key: str | None = None
    scope: str | None = None
    parameters: dict | None = None
    fingerprint: str | None = None


@dataclasses.dataclass(frozen=True)
class RunFilter:
    """What the run API and the dashboard ask for; every field optional."""

    job_id: str | None = None
    status: str | None = None
    source: str | None = None
    since: datetime.datetime | None = None  # created at or after
    until: datetime.datetime | None = None  # created before

    def __post_init__(self) -> None:
        # Datastore refuses to compare an indexed string longer than this.
        for name in ("job_id", "status", "source"):
            value = getattr(self, name)
            if value is not None and len(value.encode("utf-8")) > MAX_FILTER_BYTES:
                raise ValueError(f"{name} filter is longer than {MAX_FILTER_BYTES} bytes")


class Ledger:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    # -- reads ---------------------------------------------------------------

    def lookup(self, run_id: str) -> RunRecord | None:
        """One strongly consistent lookup; an expired record counts as absent."""
        record = RunRecord.get_by_id(run_id)
        if record is None or record.is_expired(self.clock.now()):
            return None
        return record

    def replay(
        self, run_id: str, fingerprint: str | None = None, job_id: str | None = None
    ) -> Replayed | Mismatch | OtherJob | None:
        """The fast path: a finished run answered without a transaction.

        ``job_id`` (when given) is the job the caller asked for: a record of
        another job is never replayed to it.
        """
        record = self.lookup(run_id)
        if record is None:
            return None
        if job_id is not None and record.job_id != job_id:
            return OtherJob(record, job_id)
        if record.fingerprint != fingerprint:
            return Mismatch(record)
        if record.status != RunStatus.IN_PROGRESS:
            return Replayed(record)
        return None

    def find_runs(
        self, run_filter: RunFilter, page_size: int, cursor: str | None = None
    ) -> tuple[list[RunRecord], str | None]:
        """Runs newest first, one page at a time (an NDB query cursor, URL-safe).

        Expired records are left out, as every read leaves them out.  The
        composite indexes these queries use are in index.yaml.
        """
        query = RunRecord.query()
        if run_filter.job_id:
            query = query.filter(RunRecord.job_id == run_filter.job_id)
        if run_filter.status:
            query = query.filter(RunRecord.status == run_filter.status)
        if run_filter.source:
            query = query.filter(RunRecord.source == run_filter.source)
        if run_filter.since:
            query = query.filter(RunRecord.created >= run_filter.since)
        if run_filter.until:
            query = query.filter(RunRecord.created < run_filter.until)
        query = query.order(-RunRecord.created)
        start = ndb.Cursor(urlsafe=cursor) if cursor else None
        now = self.clock.now()
        visible: list[RunRecord] = []
        # Expired records (not yet deleted) are skipped; fetch on until the page is full.
        for _ in range(FIND_BATCHES):
            records, start, more = query.fetch_page(page_size - len(visible), start_cursor=start)
            visible += [record for record in records if not record.is_expired(now)]
            more = more and start is not None and bool(records)
            if len(visible) >= page_size or not more:
                break
        return visible, (start.urlsafe().decode("ascii") if more else None)

    # -- writes (each one transaction) -----------------------------------------

    def claim_run(self, run_id: str, description: RunDescription, policy: RunPolicy) -> ClaimOutcome:
        """Take the run for a new attempt, or say why not."""
        # Chosen once, outside the transaction: if a commit lands but its answer
        # is lost, the retry finds this id in the record and knows the claim is its own.
        attempt_id = uuid.uuid4().hex

        def claim() -> ClaimOutcome:
            now = self.clock.now()
            current = RunRecord.get_by_id(run_id)
            if current is not None and current.attempt_id == attempt_id:
                return Claimed(current, Attempt(run_id, attempt_id, current.attempt, downstream=current.downstream))
            live = current is not None and not current.is_expired(now)
            if live and current.job_id != description.job_id:
                return OtherJob(current, description.job_id)
            if live and current.fingerprint != description.fingerprint:
                return Mismatch(current)
            if live and current.status != RunStatus.IN_PROGRESS:
                return Replayed(current)
            if live and current.lease_is_live(now):
                return InProgress.until(current, now)
            # Absent, expired, or an in-progress record whose lease ran out
            # (takeover).  The attempt number rises with every takeover, so it
            # is a usable fencing token (a release deletes the record: the
            # next claim is attempt 1 again).
            attempt = Attempt(
                run_id,
                attempt_id,
                (current.attempt if current else 0) + 1,
                downstream=current.downstream if live else None,
            )
            history = list(current.attempts or []) if live else []
            if history and history[-1].get("outcome") is None:
                history[-1] = {**history[-1], "outcome": "lease_expired"}  # taken over
            created = current.created if live else now
            record = RunRecord(
                id=run_id,
                source=description.source,
                job_id=description.job_id,
                scheduler_job_name=description.scheduler_job_name,
                schedule_time=description.schedule_time,
                project=description.project,
                location=description.location,
                idempotency_key=description.idempotency_key,
                scope=description.scope,
                parameters=description.parameters,
                fingerprint=description.fingerprint,
                downstream=attempt.downstream,
                attempts=(
                    history
                    + [
                        {
                            "attempt": attempt.attempt,
                            "attempt_id": attempt.attempt_id,
                            "started": format_utc(now),
                            "finished": None,
                            "outcome": None,
                            "instance": INSTANCE,
                        }
                    ]
                )[-MAX_ATTEMPT_HISTORY:],
                status=RunStatus.IN_PROGRESS.value,
                attempt_id=attempt.attempt_id,
                attempt=attempt.attempt,
                lease_expires=now + _seconds(policy.lease_seconds),
                # Never expire (count as absent) while a lease is live.
                expire_at=max(created + _seconds(policy.retention_seconds), now + _seconds(policy.lease_seconds)),
                created=created,
                updated=now,
                started=now,
            )
            record.put()
            return Claimed(record, attempt)

        try:
            outcome = _transaction(claim, CLAIM_PATIENCE_SECONDS)
        except _RETRYABLE_ERRORS as exc:
            if not _is_contention(exc):
                raise
            log.warning("run %s: claim lost to contention (%s); answering 409", run_id, exc)
            return Contended(run_id)
        history = outcome.record.attempts or [] if isinstance(outcome, Claimed) else []
        if len(history) > 1 and history[-2].get("outcome") == "lease_expired":
            # Logged once, after the commit (the callback may have run more than once).
            log.warning(
                "run %s: lease of attempt %d expired; attempt %d takes over",
                run_id,
                history[-2]["attempt"],
                outcome.attempt.attempt,
                extra={"run_id": run_id, "attempt": outcome.attempt.attempt, "outcome": "takeover"},
            )
        return outcome

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
            record.put()
            return Renewed(record)

        return self._fenced(attempt, renew, patience_seconds)

    def record_downstream(self, attempt: Attempt, resource_name: str) -> Renewed | Stale:
        """Note what this attempt started downstream, so a takeover can adopt it."""

        def record(record: RunRecord, now: datetime.datetime) -> Renewed:
            record.downstream = resource_name
            record.updated = now
            record.put()
            return Renewed(record)

        return self._fenced(attempt, record)

    def complete_run(self, attempt: Attempt, result: object, policy: RunPolicy) -> Finished | Stale:
        """Record success; the retention window restarts from the finish."""

        def complete(record: RunRecord, now: datetime.datetime) -> Finished:
            record.status = RunStatus.COMPLETED.value
            record.result = result
            record.preview = json_preview(result)
            return self._finish(record, now, policy)

        return self._fenced(attempt, complete, landed=_finish_landed(attempt, RunStatus.COMPLETED))

    def fail_run(self, attempt: Attempt, error: dict, policy: RunPolicy) -> Finished | Stale:
        """Record a permanent failure, replayed to every later delivery."""

        def fail(record: RunRecord, now: datetime.datetime) -> Finished:
            record.status = RunStatus.FAILED.value
            record.error = error
            record.preview = json_preview(error)
            return self._finish(record, now, policy)

        return self._fenced(attempt, fail, landed=_finish_landed(attempt, RunStatus.FAILED))

    def release_run(self, attempt: Attempt, error: dict) -> Released | Stale:
        """Give the run up after a retryable failure: delete the record."""

        def release(record: RunRecord, now: datetime.datetime) -> Released:
            record.key.delete()
            return Released(attempt.run_id, attempt.attempt, error)

        def landed(record: RunRecord | None) -> Released | None:
            return Released(attempt.run_id, attempt.attempt, error) if record is None else None

        return self._fenced(attempt, release, landed=landed)

    def delete_expired(self, batch_size: int = 100, cursor: str | None = None) -> tuple[int, str | None]:
        """Delete one batch of records past ``expire_at``; return (deleted, cursor of the next batch).

        The fallback where no TTL policy is set.  A keys-only query finds
        candidates; one transaction re-reads them and deletes only those still
        expired and not under a live lease, so two cleanups at once, or a claim
        racing one, never lose a live record.  The cursor moves past records
        that had to be kept, so they never stall the batches behind them.
        """
        now = self.clock.now()
        start = ndb.Cursor(urlsafe=cursor) if cursor else None
        keys, next_cursor, more = RunRecord.query(RunRecord.expire_at <= now).fetch_page(
            batch_size,
            keys_only=True,
            start_cursor=start,
        )
        if not keys:
            return 0, None

        def delete_batch() -> int:
            current = self.clock.now()
            doomed = [
                record.key
                for record in ndb.get_multi(keys)
                if record is not None and record.is_expired(current) and not record.lease_is_live(current)
            ]
            ndb.delete_multi(doomed)
            return len(doomed)

        deleted = _transaction(delete_batch, FINISH_PATIENCE_SECONDS)
        more = more and next_cursor is not None and len(keys) == batch_size
        return deleted, (next_cursor.urlsafe().decode("ascii") if more else None)

    # -- internals -----------------------------------------------------------

    @staticmethod
    def _finish(record: RunRecord, now: datetime.datetime, policy: RunPolicy) -> Finished:
        record.finished = now
        record.updated = now
        record.attempts = [
            {**entry, "finished": format_utc(now), "outcome": record.status}
            if entry.get("attempt_id") == record.attempt_id
            else entry
            for entry in record.attempts or []
        ]
        if policy.finished_retention_seconds is None:
            record.expire_at = max(record.expire_at, now + _seconds(policy.retention_seconds))
        else:
            record.expire_at = min(record.expire_at, now + _seconds(policy.finished_retention_seconds))
        record.put()
        return Finished(record)

    def _fenced(
        self,
        attempt: Attempt,
        change: Callable[[RunRecord, datetime.datetime], object],
        patience_seconds: float | None = None,
        landed: Callable[[RunRecord | None], object | None] | None = None,
    ):
        """Apply ``change`` in a transaction only while ``attempt`` owns the run.

        ``landed`` recognises, when the transaction is tried again, that an
        earlier try's commit was applied although it reported an error.
        """
        changed_before = False  # an earlier try got as far as writing

        def fenced():
            nonlocal changed_before
            now = self.clock.now()
            record = RunRecord.get_by_id(attempt.run_id)
            if changed_before and landed is not None:
                outcome = landed(record)
                if outcome is not None:
                    return outcome
            if record is None or record.attempt_id != attempt.attempt_id or record.status != RunStatus.IN_PROGRESS:
                return Stale(attempt.run_id, attempt.attempt, record)
            changed_before = True
            return change(record, now)

        # Only the owner writes a run, but every duplicate's claim reads it and
        # can abort the owner's commit; giving up would leave a performed job
        # unrecorded (and run again after the lease), so the owner persists.
        outcome = _transaction(fenced, FINISH_PATIENCE_SECONDS if patience_seconds is None else patience_seconds)
        if isinstance(outcome, Stale):
            current = outcome.current
            log.warning(
                "run %s: attempt %d is stale (record now %s); nothing changed",
                attempt.run_id,
                attempt.attempt,
                f"attempt {current.attempt} {current.status}" if current else "absent",
            )
        return outcome


def json_preview(value: Any, chars: int = PREVIEW_CHARS) -> str:
    """The first ``chars`` characters of ``value`` as compact JSON, "…" marking a cut."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _finish_landed(attempt: Attempt, status: RunStatus) -> Callable[[RunRecord | None], Finished | None]:
    """This attempt's own finish, found already recorded."""

    def landed(record: RunRecord | None) -> Finished | None:
        if record is not None and record.attempt_id == attempt.attempt_id and record.status == status:
            return Finished(record)
        return None

    return landed


def _transaction(callback: Callable[[], Any], patience_seconds: float) -> Any:
    """One NDB transaction, tried again on contention and transient errors until patience runs out."""
    deadline = time.monotonic() + patience_seconds
    delay = 0.02
    while True:
        try:
            try:
                return ndb.transaction(callback, retries=0)
            except api_exceptions.GoogleAPICallError as exc:
                # NDB rolls back after a failed commit.  When the commit was in
                # fact applied, the rollback fails too ("transaction has expired
                # or is invalid") and its error hides the commit's: the commit's
                # error is the one that says what happened.
                if not isinstance(exc, _RETRYABLE_ERRORS) and isinstance(exc.__context__, _RETRYABLE_ERRORS):
                    commit_error, exc.__context__ = exc.__context__, None  # no cycle in the chain
                    raise commit_error from exc
                raise
        except _RETRYABLE_ERRORS as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.info("transaction failed (%s); trying again", type(exc).__name__)
            time.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, 1.0)


def _seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)
