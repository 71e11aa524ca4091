"""What the protocol can answer.  Handlers map each outcome to one status code.

The protocol never raises for an expected case; it returns one of these.
Only infrastructure errors (Datastore unreachable) propagate as exceptions.
Every outcome is an ``Outcome``: it has a ``run_id`` and a ``record`` (the
record it is about, as read or written; None where there is none to show).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from dedup.record_store import VersionFence
from dedup.run_record import RunRecord

if TYPE_CHECKING:
    from dedup.steps import Steps


class Outcome:
    """What every outcome carries: the ``run_id`` it is about and its ``record`` (None where there is none).

    Declared for the type checker only: each outcome holds them as its own dataclass fields or
    properties, and a property here would become the default of a subclass's field of that name.
    """

    if TYPE_CHECKING:

        @property
        def run_id(self) -> str: ...

        @property
        def record(self) -> RunRecord | None: ...


@dataclasses.dataclass(frozen=True)
class OfRecord(Outcome):
    """An outcome about a record that was read or written: its run id is the record's."""

    record: RunRecord

    @property
    def run_id(self) -> str:
        return self.record.run_id


class HeldRun(Protocol):
    """What a running attempt may ask of the run it holds; the runner is its one owner
    (dedup.runner.RunningAttempt), and job kinds reach it through their RunContext."""

    def lost(self) -> bool:
        """True once a renewal found the run taken over, or the lease last secured ran out."""

    def record_downstream(self, resource_name: str) -> bool:
        """Record (fenced) what this attempt started downstream; False when it lost the run."""

    def record_step(self, name: str, entry: dict[str, Any]) -> bool:
        """Record (fenced) one of the run's steps (dedup.steps); False when it lost the run."""

    @property
    def steps(self) -> Steps:
        """The run's steps as this attempt runs them."""


@dataclasses.dataclass(frozen=True)
class Attempt:
    """The attempt that holds the claim: what the job needs to know about it."""

    run_id: str
    attempt_id: str
    number: int  # 1 for the first attempt at the run
    # What an earlier attempt started downstream, when it recorded it.
    downstream: str | None = None
    # The job lock this attempt holds (a job with overlap: forbid), else None.
    job_lock: str | None = None
    # A compacted run's (its record's ``covers``): the slot times it was set to stand for.
    covers: tuple[str, ...] | None = None
    # The step records earlier attempts left (the record's ``steps``, dedup.steps), as claimed.
    step_records: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)
    # The run while this attempt runs it; bound by the runner, None before.
    held: HeldRun | None = dataclasses.field(default=None, compare=False, repr=False)
    # What its last write left and that write's version, for its next write to be fenced on
    # (dedup.record_store); None where a transaction wrote it last.
    fence: VersionFence | None = dataclasses.field(default=None, compare=False, repr=False)

    def lease_lost(self) -> bool:
        return self.held.lost() if self.held else False

    def record_downstream(self, resource_name: str) -> bool:
        return self.held.record_downstream(resource_name) if self.held else True


@dataclasses.dataclass(frozen=True)
class Claimed(OfRecord):
    """This attempt owns the run: run the job, then finish with the ledger."""

    attempt: Attempt


@dataclasses.dataclass(frozen=True)
class Replayed(OfRecord):
    """The run finished earlier (completed or failed): answer from the record."""


@dataclasses.dataclass(frozen=True)
class Conflict(OfRecord):
    """The key is already used for a run with other parameters: nothing runs."""


@dataclasses.dataclass(frozen=True)
class JobMismatch(OfRecord):
    """The key names a run of another job (two jobs' deliveries share a key): nothing runs.

    Never replayed or taken over: answering one job with another's result,
    or running it under another's record, would hide a configuration error.
    """

    job_id: str  # the job this request asked for


@dataclasses.dataclass(frozen=True)
class InProgress(OfRecord):
    """Another attempt holds a live lease."""

    retry_after_seconds: int

    @staticmethod
    def until(record: RunRecord, now: datetime.datetime) -> InProgress:
        seconds = (record.lease_expires - now).total_seconds()
        return InProgress(record, max(1, math.ceil(seconds)))


@dataclasses.dataclass(frozen=True)
class Contended(Outcome):
    """Transactions kept colliding with other claimers; the caller should retry soon."""

    run_id: str
    retry_after_seconds: int = 1

    @property
    def record(self) -> None:
        return None  # nothing was read, or the record is gone


@dataclasses.dataclass(frozen=True)
class Finished(OfRecord):
    """This attempt recorded its outcome: the record is completed or failed."""


@dataclasses.dataclass(frozen=True)
class Released(Outcome):
    """A retryable failure: the record says ``released``, so the next delivery claims and runs again."""

    run_id: str
    attempt: int
    error: dict[str, Any]  # for guarded endpoints: the response that was not kept
    record: RunRecord | None = None  # the released record (None from code that read none)


@dataclasses.dataclass(frozen=True)
class Renewed(OfRecord):
    """The attempt still owns the run: its lease was extended, or what it started downstream noted."""


@dataclasses.dataclass(frozen=True)
class Stale(Outcome):
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
class Skipped(OfRecord):
    """A delivery too late for its job's max_delay_seconds: recorded as skipped, the job not run."""


@dataclasses.dataclass(frozen=True)
class Overlap(Outcome):
    """Another execution of a job that forbids overlap holds the job's lock with a live lease."""

    run_id: str
    holder_run_id: str
    retry_after_seconds: int

    @staticmethod
    def until(run_id: str, holder_run_id: str, lease_expires: datetime.datetime, now: datetime.datetime) -> Overlap:
        return Overlap(run_id, holder_run_id, max(1, math.ceil((lease_expires - now).total_seconds())))

    @property
    def record(self) -> None:
        return None  # nothing of this run was read or written


RunOutcome = (
    Overlap | Replayed | Conflict | JobMismatch | InProgress | Contended | Finished | Released | Stale | Skipped
)
ClaimOutcome = Claimed | Replayed | Conflict | JobMismatch | InProgress | Contended | Overlap
