"""The read side the dashboard and the run API use, and the cleanup of expired records.

Apart from the fenced protocol (dedup/ledger.py): nothing here claims or
finishes a run, and every read leaves out records past ``expire_at``, as the
protocol's own reads do.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable

from google.cloud import ndb

from dedup.transactions import run_transaction
from models import RunRecord

# The longest string a filter may compare (Datastore's limit for indexed strings).
MAX_FILTER_BYTES = 1500
# How many batches one page of find_runs may read to skip expired records.
FIND_BATCHES = 5
# A cleanup batch, deleted once its records are known to be expired: patience as a finish's.
DELETE_PATIENCE_SECONDS = 30.0


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


def find_runs(
    run_filter: RunFilter, page_size: int, now: datetime.datetime, cursor: str | None = None
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
    visible: list[RunRecord] = []
    # Expired records (not yet deleted) are skipped; fetch on until the page is full.
    for _ in range(FIND_BATCHES):
        records, start, more = query.fetch_page(page_size - len(visible), start_cursor=start)
        visible += [record for record in records if not record.is_expired(now)]
        more = more and start is not None and bool(records)
        if len(visible) >= page_size or not more:
            break
    return visible, (start.urlsafe().decode("ascii") if more and start is not None else None)


def delete_expired(
    now: datetime.datetime, clock_now: Callable[[], datetime.datetime], batch_size: int = 100, cursor: str | None = None
) -> tuple[int, str | None]:
    """Delete one batch of records past ``expire_at``; return (deleted, cursor of the next batch).

    The fallback where no TTL policy is set.  A keys-only query finds
    candidates; one transaction re-reads them (at ``clock_now()``) and deletes
    only those still expired and not under a live lease, so two cleanups at
    once, or a claim racing one, never lose a live record.  The cursor moves
    past records that had to be kept, so they never stall the batches behind them.
    """
    start = ndb.Cursor(urlsafe=cursor) if cursor else None
    keys, next_cursor, more = RunRecord.query(RunRecord.expire_at <= now).fetch_page(
        batch_size,
        keys_only=True,
        start_cursor=start,
    )
    if not keys:
        return 0, None

    def delete_batch() -> int:
        current = clock_now()
        doomed = [
            record.key
            for record in ndb.get_multi(keys)
            if record is not None and record.is_expired(current) and not record.lease_is_live(current)
        ]
        ndb.delete_multi(doomed)
        return len(doomed)

    deleted = run_transaction(delete_batch, DELETE_PATIENCE_SECONDS)
    more = more and next_cursor is not None and len(keys) == batch_size
    return deleted, (next_cursor.urlsafe().decode("ascii") if more else None)
