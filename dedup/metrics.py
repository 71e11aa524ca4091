"""The protocol's counters: takeovers, stale attempts refused, and the claim's Datastore round trips.

Made with the OpenTelemetry API alone, as the spans are (dedup/runner.py): which provider
records and exports them is the host app's choice (handlers/metrics.py here); without one they
cost nothing.  Their labels are bounded: the job, the Scheduler job ("" for a run of none) and
the run's source, never a run id.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics

from dedup.run_record import RunRecord
from dedup.store import Store, Transaction, Versioned, Write

meter = metrics.get_meter("dedup")
TAKEOVERS_NAME = "dedup.run.takeovers"
STALE_NAME = "dedup.run.stale_attempts"
ROUND_TRIPS_NAME = "dedup.claim.round_trips"
# The requests answered 409 (dedup.answers' rows for a run in progress, contended, overlapping or
# stale): counted by the host app, which knows what it answered (handlers/metrics.py here).
CONFLICTS_NAME = "dedup.answers.conflicts"
TAKEOVERS = meter.create_counter(
    TAKEOVERS_NAME, unit="{attempt}", description="attempts that took a run over from one whose lease ran out"
)
STALE = meter.create_counter(
    STALE_NAME,
    unit="{attempt}",
    description="attempts whose write was refused: another attempt had taken the run over",
)
ROUND_TRIPS = meter.create_counter(
    ROUND_TRIPS_NAME, unit="{call}", description="Datastore calls the claims made (0 for a remembered run)"
)


def labels(job_id: str, scheduler_job: str | None, source: str | None) -> dict[str, str]:
    """The labels every dedup metric of a run carries: bounded by the declared jobs, never a run id."""
    return {"job": job_id, "scheduler_job": scheduler_job or "", "source": str(source or "")}


def of_record(record: RunRecord) -> dict[str, str]:
    return labels(record.job_id, record.scheduler_job_name, record.source)


def count_takeover(record: RunRecord) -> None:
    TAKEOVERS.add(1, of_record(record))


def count_stale(record: RunRecord | None) -> None:
    """A stale attempt's refused write, labelled by the record as the attempt found it (None: gone)."""
    STALE.add(1, of_record(record) if record is not None else labels("", None, None))


class CountedStore:
    """A store that counts the Datastore calls made through it: one claim's round trips.

    Counted: each lookup, write, and a transaction's reads and commit (a read that begins a
    transaction is one call with it; a BeginTransaction of its own, where a database needs one,
    and a rollback, sent without waiting for its answer, are not counted)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)  # fence, fenced, database: no call

    def _count[T](self, result: T) -> T:
        self.calls += 1
        return result

    def lookup(self, run_id: str) -> Versioned | None:
        return self._count(self.store.lookup(run_id))

    def lookup_many(self, keys: list[Any]) -> list[Versioned | None]:
        return self._count(self.store.lookup_many(keys))

    def lookup_and_insert(self, record: RunRecord, entity: Any = None) -> tuple[Versioned | None, Write]:
        return self._count(self.store.lookup_and_insert(record, entity))

    def insert(self, record: Any) -> Write:
        return self._count(self.store.insert(record))

    def update(self, record: Any, base_version: int, delete: tuple[Any, int] | None = None) -> Write:
        return self._count(self.store.update(record, base_version, delete))

    def delete_if(self, key: Any, version: int | None) -> Write:
        return self._count(self.store.delete_if(key, version))

    def delete_unchanged(self, doomed: list[Versioned]) -> int:
        return self._count(self.store.delete_unchanged(doomed))

    def transaction(self, previous: bytes | None = None, begin_in_read: bool | None = None) -> Transaction:
        return _CountedTransaction(self, self.store.transaction(previous, begin_in_read))


class _CountedTransaction:
    def __init__(self, counter: CountedStore, transaction: Transaction) -> None:
        self.counter = counter
        self.transaction = transaction

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transaction, name)  # began, versions, put, delete, rollback: no call waited on

    def get(self, keys: list[Any]) -> list[Versioned | None]:
        self.counter.calls += 1
        return self.transaction.get(keys)

    def commit(self) -> None:
        self.counter.calls += 1
        self.transaction.commit()


def count_round_trips(job_id: str, scheduler_job: str | None, source: str, calls: int) -> None:
    if calls:
        ROUND_TRIPS.add(calls, labels(job_id, scheduler_job, source))
