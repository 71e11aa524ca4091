"""What the protocol can answer.  Handlers map each outcome to one status code.

The protocol never raises for an expected case; it returns one of these.
Only infrastructure errors (Datastore unreachable) propagate as exceptions.
Every outcome has a ``run_id`` and a ``record`` (the record it is about, as
read or written; None where there is none to show).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Protocol

from models import RunRecord


class HeldRun(Protocol):
    """What a running attempt may ask of the run it holds; the runner is its one owner
    (dedup.runner.RunningAttempt), and job kinds reach it through their RunContext."""

    def lost(self) -> bool:
        """True once a renewal found the run taken over, or the lease last secured ran out."""

    def record_downstream(self, resource_name: str) -> bool:
        """Record (fenced) what this attempt started downstream; False when it lost the run."""


@dataclasses.dataclass(frozen=True)
class Attempt:
    """The attempt that holds the claim: what the job needs to know about it."""

    run_id: str
    attempt_id: str
    attempt: int
    # What an earlier attempt started downstream, when it recorded it.
    downstream: str | None = None
    # The job lock this attempt holds (a job with overlap: forbid), else None.
    job_lock: str | None = None
    # The run while this attempt runs it; bound by the runner, None before.
    held: HeldRun | None = dataclasses.field(default=None, compare=False, repr=False)

    def lease_lost(self) -> bool:
        return self.held.lost() if self.held else False

    def record_downstream(self, resource_name: str) -> bool:
        return self.held.record_downstream(resource_name) if self.held else True


@dataclasses.dataclass(frozen=True)
class Claimed:
    """This attempt owns the run: run the job, then finish with the ledger."""

    record: RunRecord
    attempt: Attempt
    # A transaction begun beside the claim for the finish to use (dedup.transactions.EarlyTransaction).
    finish_transaction: object | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def run_id(self) -> str:
        return self.record.run_id


@dataclasses.dataclass(frozen=True)
class Replayed:
    """The run finished earlier (completed or failed): answer from the record."""

    record: RunRecord

    @property
    def run_id(self) -> str:
        return self.record.run_id


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """The key is already used for a run with other parameters: nothing runs."""

    record: RunRecord

    @property
    def run_id(self) -> str:
        return self.record.run_id


@dataclasses.dataclass(frozen=True)
class OtherJob:
    """The key names a run of another job (two jobs' deliveries share a key): nothing runs.

    Never replayed or taken over: answering one job with another's result,
    or running it under another's record, would hide a configuration error.
    """

    record: RunRecord
    job_id: str  # the job this request asked for

    @property
    def run_id(self) -> str:
        return self.record.run_id


@dataclasses.dataclass(frozen=True)
class InProgress:
    """Another attempt holds a live lease."""

    record: RunRecord
    retry_after_seconds: int

    @staticmethod
    def until(record: RunRecord, now) -> InProgress:
        seconds = (record.lease_expires - now).total_seconds()
        return InProgress(record, max(1, math.ceil(seconds)))

    @property
    def run_id(self) -> str:
        return self.record.run_id


@dataclasses.dataclass(frozen=True)
class Contended:
    """Transactions kept colliding with other claimers; the caller should retry soon."""

    run_id: str
    retry_after_seconds: int = 1

    @property
    def record(self) -> None:
        return None  # nothing was read, or the record is gone


@dataclasses.dataclass(frozen=True)
class Finished:
    """This attempt recorded its outcome: the record is completed or failed."""

    record: RunRecord

    @property
    def run_id(self) -> str:
        return self.record.run_id


@dataclasses.dataclass(frozen=True)
class Released:
    """A retryable failure: the record says ``released``, so the next delivery claims and runs again."""

    run_id: str
    attempt: int
    error: dict  # for guarded endpoints: the response that was not kept
    record: RunRecord | None = None  # the released record (None from code that read none)


@dataclasses.dataclass(frozen=True)
class Renewed:
    record: RunRecord

    @property
    def run_id(self) -> str:
        return self.record.run_id


@dataclasses.dataclass(frozen=True)
class Stale:
    """The attempt lost its lease and another attempt took over: nothing was changed."""

    run_id: str
    attempt: int
    current: RunRecord | None

    @property
    def record(self) -> RunRecord | None:
        """The record as the stale attempt found it (another attempt's), or None if gone."""
        return self.current


FinishOutcome = Finished | Released | Stale


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A delivery too late for its job's max_delay_seconds: recorded as skipped, the job not run."""

    record: RunRecord

    @property
    def run_id(self) -> str:
        return self.record.run_id


@dataclasses.dataclass(frozen=True)
class Overlap:
    """Another execution of a job that forbids overlap holds the job's lock with a live lease."""

    run_id: str
    holder_run_id: str
    retry_after_seconds: int

    @staticmethod
    def until(run_id: str, holder_run_id: str, lease_expires: datetime.datetime, now) -> Overlap:
        return Overlap(run_id, holder_run_id, max(1, math.ceil((lease_expires - now).total_seconds())))

    @property
    def record(self) -> None:
        return None  # nothing of this run was read or written


RunOutcome = Overlap | Replayed | Mismatch | OtherJob | InProgress | Contended | Finished | Released | Stale | Skipped
ClaimOutcome = Claimed | Replayed | Mismatch | OtherJob | InProgress | Contended | Overlap
