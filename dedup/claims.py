"""The protocol's decisions, apart from how they are written: pure functions of a stored record.

What a claim does to what is stored (refuse, skip, claim afresh, take over, reopen), what a
new attempt's record holds, and how an attempt's end is written.  ``dedup.ledger`` applies
them in one of two ways (an insert or an update fenced on a version, or a transaction that
reads first); both ask these functions, so the two cannot disagree.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

from dedup.job_lock import JobLock
from dedup.keys import format_utc
from dedup.outcomes import (
    Attempt,
    Claimed,
    ClaimOutcome,
    Conflict,
    Finished,
    InProgress,
    JobMismatch,
    Overlap,
    Replayed,
    Skipped,
)
from dedup.run_record import RunRecord, RunStatus

# A finished record's preview of its result or error, in characters.
PREVIEW_CHARS = 200
# Attempt history kept on each record, and who this process is in it: App Engine's name for this
# instance (its runtime identity, like the host name and process id elsewhere: no setting, so read
# here and not by settings.py; tests/test_settings.py's scan lists it as read on purpose).
MAX_ATTEMPT_HISTORY = 10
INSTANCE = os.environ.get("GAE_INSTANCE") or f"{socket.gethostname()}:{os.getpid()}"
REOPENED = frozenset({RunStatus.FAILED, RunStatus.SKIPPED})  # what an operator's run replaces


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
    # overlap: forbid: one execution of the job at a time, under the job's lock (dedup.job_lock).
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


@dataclasses.dataclass(frozen=True)
class ClaimRequest:
    """One claim's inputs, as one value: the run, the attempt id it writes (chosen once, so a
    claim whose answer was lost is recognised as this one's), its description and policy, the
    attempt an operator reopens and the reason a late delivery is skipped."""

    run_id: str
    description: RunDescription
    policy: RunPolicy
    reopen_attempt: int | None = None
    skip_reason: str | None = None
    attempt_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    # With skip_reason: the run that stands for this one (a compacted catch-up), named in its record.
    covered_by: str | None = None

    @property
    def job_lock(self) -> str | None:
        return self.description.job_id if self.policy.exclusive else None

    def own(self, current: RunRecord | None) -> Claimed | None:
        """This claim, found already written (its commit landed, its answer was lost)."""
        if current is None or current.attempt_id != self.attempt_id:
            return None
        attempt = Attempt(
            self.run_id,
            self.attempt_id,
            current.attempt,
            downstream=current.downstream,
            job_lock=self.job_lock,
            covers=tuple(current.covers) if current.covers else None,
            step_records=current.steps or None,
        )
        return Claimed(current, attempt)

    def decide(
        self, current: RunRecord | None, now: datetime.datetime, lock: JobLock | None = None
    ) -> ClaimOutcome | Skipped:
        """What this claim does to the stored ``current`` (and the job's ``lock``): a refusal, which
        writes nothing, or the record to write (``Claimed``, ``Skipped``)."""
        live = current if current is not None and not current.is_expired(now) else None  # expired: absent
        refused = refusal(live, self.description, now, self.reopen_attempt)
        if refused is not None:
            return refused
        # A run that started something downstream or recorded a step is never skipped over: its
        # retry adopts or resumes it.
        if self.skip_reason is not None and (
            live is None or (live.status != RunStatus.IN_PROGRESS and not live.downstream and not live.steps)
        ):
            return Skipped(_skipped_record(self, live, current, now))
        if lock is not None and lock.run_id != self.run_id and lock.is_held(now):
            return Overlap.until(self.run_id, lock.run_id, lock.lease_expires, now)
        # Absent, released, or an in-progress record whose lease ran out (a takeover).  The
        # attempt number rises with every claim of the run, so it is a usable fencing token.
        # What an earlier attempt started or recorded belongs to the same request only: a client token
        # reused over a released run with other parameters is another request, which starts afresh.
        same = live if live is not None and live.fingerprint == self.description.fingerprint else None
        attempt = Attempt(
            self.run_id,
            self.attempt_id,
            (current.attempt if current else 0) + 1,
            downstream=same.downstream if same else None,
            job_lock=self.job_lock,
        )
        record = _claimed_record(attempt, self.description, self.policy, live, now, carried=same)
        if record.covers:  # a compacted run: its attempt resolves what it stands for (service.runs)
            attempt = dataclasses.replace(attempt, covers=tuple(record.covers))
        if record.steps:  # what earlier attempts recorded of their steps (dedup.steps)
            attempt = dataclasses.replace(attempt, step_records=record.steps)
        return Claimed(record, attempt)


def refusal(
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
    if current.compacted_into:
        return Replayed(current)  # a compacted run stands for it: final, never reopened or covered again
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
    carried: RunRecord | None = None,
) -> RunRecord:
    """The record of a new attempt: the description as given, the attempt's fence and lease, the
    history; the steps of ``carried`` (the same request's earlier attempts)."""
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
    fields = {field.name: getattr(description, field.name) for field in dataclasses.fields(description)}
    if current is not None and current.covers:
        # The slot times a compacted run was set to stand for (Ledger.stand_for): every attempt's.
        fields["covers"] = current.covers
    if carried is not None and carried.steps:
        fields["steps"] = carried.steps  # the steps earlier attempts recorded: this one resumes after them
    return RunRecord(
        id=attempt.run_id,
        # RunDescription's fields are the record's (copied as they are: asdict would deep-copy).
        **fields,
        downstream=attempt.downstream,
        attempts=history[-MAX_ATTEMPT_HISTORY:],
        status=RunStatus.IN_PROGRESS,
        attempt_id=attempt.attempt_id,
        attempt=attempt.number,
        lease_expires=now + seconds(policy.lease_seconds),
        # Never expire (count as absent) while a lease is live, and a slot's run never before
        # its schedule time plus the retention (schedules.slots: what the ledger can still know).
        expire_at=max(
            max(created, description.schedule_time or created) + seconds(policy.retention_seconds),
            now + seconds(policy.lease_seconds),
        ),
        created=created,
        updated=now,
        started=now,
    )


def _skipped_record(
    claim: ClaimRequest, live: RunRecord | None, current: RunRecord | None, now: datetime.datetime
) -> RunRecord:
    """A late slot, recorded as skipped: no attempt ran (its attempt id is one nothing holds).  One
    a compacted run stands for names it (``covered_by``)."""
    assert claim.skip_reason is not None
    kind = "Compacted" if claim.covered_by else "LateDelivery"
    error = {
        "type": kind,
        "message": claim.skip_reason,
        **({"compacted_into": claim.covered_by} if claim.covered_by else {}),
    }
    description = claim.description
    return RunRecord(
        id=claim.run_id,
        **{field.name: getattr(description, field.name) for field in dataclasses.fields(description)},
        attempts=list(live.attempts or []) if live else [],
        status=RunStatus.SKIPPED,
        attempt_id=uuid.uuid4().hex,
        attempt=current.attempt if current else 0,  # attempt numbers never go back
        lease_expires=now,
        expire_at=now + seconds(claim.policy.retention_seconds),
        created=live.created if live else now,
        updated=now,
        finished=now,
        error=error,
        preview=json_preview(error),
        compacted_into=claim.covered_by,
    )


def json_preview(value: Any, chars: int = PREVIEW_CHARS) -> str:
    """The first ``chars`` characters of ``value`` as compact JSON, "…" marking a cut."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= chars else text[: chars - 1] + "…"


def record_end(record: RunRecord, status: RunStatus, document: object, now: datetime.datetime) -> None:
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


def finish_landed(attempt: Attempt, status: RunStatus) -> Callable[[RunRecord | None], Finished | None]:
    """This attempt's own finish, found already recorded."""

    def landed(record: RunRecord | None) -> Finished | None:
        if record is not None and record.attempt_id == attempt.attempt_id and record.status == status:
            return Finished(record)
        return None

    return landed


def seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)
